"""Find the per-layer attention and feed-forward pieces of a Transformers model.

One adapter per architecture family, chosen from the config and the module
tree: ``crate`` (hf-tdiag's CRATE), ``vit`` (pre-norm encoders: ViT, DeiT, …),
``bert`` (post-norm encoders: BERT, RoBERTa, ELECTRA, DistilBERT, …) and the
causal decoders of :mod:`hf_tdiag.probes.decoders`: ``gpt2`` (fused Conv1D
``c_attn``) and ``llama`` (Llama, Mistral, Qwen, Gemma: separate q/k/v/o
projections, grouped-query attention, gated MLP, RMSNorm, rotary positions).
Projections are found by their role in each block (the names Transformers uses
for query/key/value/output/feed-forward linears), not from a list of model
classes, so any encoder that follows those conventions is supported.

This module only locates modules and returns their weights; it does no math.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import nn

# role -> regexes matched against a Linear's qualified name *inside one block*
_ROLE_PATTERNS: dict[str, tuple[str, ...]] = {
    "query": (r"(^|\.)query$", r"(^|\.)q_lin$", r"(^|\.)q_proj$", r"(^|\.)q$"),
    "key": (r"(^|\.)key$", r"(^|\.)k_lin$", r"(^|\.)k_proj$", r"(^|\.)k$"),
    "value": (r"(^|\.)value$", r"(^|\.)v_lin$", r"(^|\.)v_proj$", r"(^|\.)v$"),
    "attention_output": (r"attention\.output\.dense$", r"(^|\.)out_lin$", r"(^|\.)out_proj$", r"(^|\.)o_proj$"),
    "intermediate": (r"(^|\.)intermediate\.dense$", r"(^|\.)lin1$", r"(^|\.)fc1$", r"(^|\.)mlp\.fc1$"),
    "ffn_output": (r"^output\.dense$", r"(^|\.)lin2$", r"(^|\.)fc2$", r"(^|\.)mlp\.fc2$"),
}
# pre-attention LayerNorm names of pre-norm blocks
_PRE_NORM_NAMES = ("layernorm_before", "layer_norm1", "ln_1", "norm1", "attention_norm")

_EXPECTED = (
    "expected an encoder whose blocks expose query/key/value nn.Linear projections "
    "(BERT/RoBERTa/ELECTRA/ViT/DeiT style 'attention.self.query|key|value' or "
    "'attention.attention.query|key|value', DistilBERT style 'attention.q_lin|k_lin|v_lin') "
    "or a CRATE model (model_type 'crate'), or a GPT-2 / Llama-family decoder (see hf_tdiag.probes.decoders)"
)


@dataclass
class LayerHandles:
    """The modules of one transformer block that diagnostics read.

    Weights are in PyTorch ``(out_features, in_features)`` layout. For CRATE the
    query, key and value are the same shared projection ``U``.
    """

    index: int
    block: nn.Module
    num_heads: int
    head_dim: int
    query: nn.Linear
    key: nn.Linear
    value: nn.Linear
    attention_output: nn.Module | None = None
    intermediate: nn.Linear | None = None
    ffn_output: nn.Linear | None = None
    attention_norm: nn.Module | None = None  # pre-attention LayerNorm (pre-norm blocks only)
    attention_module: nn.Module | None = None  # the module whose input is the attention input
    extra: dict = field(default_factory=dict)
    num_kv_heads: int | None = None  # K/V heads (grouped-query attention: fewer than num_heads); None = num_heads

    def projection_weight(self, source: str) -> torch.Tensor:
        """Weight ``(H*dh, d)`` of the ``query``, ``key`` or ``value`` projection."""
        if source not in ("query", "key", "value"):
            raise ValueError(f"source: expected 'query', 'key' or 'value', got {source!r}")
        return getattr(self, source).weight

    def output_weight(self) -> torch.Tensor | None:
        """Attention output matrix ``(d, H*dh)`` (CRATE: the variant's effective output matrix)."""
        if self.attention_output is None:
            return None
        if hasattr(self.attention_output, "output_matrix"):
            return self.attention_output.output_matrix()
        return self.attention_output.weight


@dataclass
class Architecture:
    """What a diagnostic needs to know about a model's encoder."""

    family: str  # "crate" | "vit" | "bert" | "gpt2" | "llama"
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    pre_norm: bool
    layers: list[LayerHandles]
    encoder_layers: nn.ModuleList
    base_model: nn.Module
    causal: bool = False  # decoders: token t attends to tokens <= t only
    num_kv_heads: int | None = None  # decoders with grouped-query attention: K/V heads (None = num_heads)
    decoder: object = None  # the decoders' :class:`hf_tdiag.probes.decoders.DecoderLayout`, None for encoders


def _config_int(config, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def _find_layer_list(model: nn.Module, num_layers: int | None) -> tuple[str, nn.ModuleList]:
    candidates = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        if num_layers is not None and len(module) != num_layers:
            continue
        if any(
            isinstance(m, nn.Linear) and re.search(r"(query|q_lin|q_proj|qkv)$", n)
            for n, m in module[0].named_modules()
        ):
            candidates.append((name, module))
    if not candidates:
        raise ValueError(f"model: could not find the encoder blocks of {type(model).__name__}; {_EXPECTED}")
    # the first list in module order is the encoder (decoders/cross-encoders are not supported)
    return candidates[0]


def _match_role(block: nn.Module, role: str) -> tuple[str, nn.Linear] | None:
    for pattern in _ROLE_PATTERNS[role]:
        for name, module in block.named_modules():
            if isinstance(module, nn.Linear) and re.search(pattern, name):
                return name, module
    return None


def _parent(block: nn.Module, qualified: str) -> nn.Module:
    parent_name = qualified.rsplit(".", 1)[0] if "." in qualified else ""
    return block.get_submodule(parent_name) if parent_name else block


def _crate_layers(model: nn.Module, config) -> tuple[list[LayerHandles], nn.ModuleList, nn.Module]:
    base = getattr(model, "crate", model)
    if not hasattr(base, "encoder"):
        raise ValueError(
            f"model: a CRATE model must have a 'crate' base model with an 'encoder'; got {type(model).__name__}"
        )
    blocks = base.encoder.layer
    handles = []
    for i, block in enumerate(blocks):
        mssa = block.attention
        handles.append(
            LayerHandles(
                index=i,
                block=block,
                num_heads=mssa.num_heads,
                head_dim=mssa.head_dim,
                query=mssa.qkv,
                key=mssa.qkv,
                value=mssa.qkv,
                attention_output=mssa,
                attention_norm=block.layernorm_before,
                attention_module=mssa,
                extra={"ista": block.ista, "ista_norm": block.layernorm_after},
            )
        )
    return handles, blocks, base


class FusedProjection(nn.Module):
    """One role's slice of a fused ``Conv1D`` (GPT-2's ``c_attn``) seen as an ``nn.Linear``: ``weight (out, in)`` and
    ``bias`` are views of the fused parameters; calling it computes ``x Wᵀ + b`` (the model itself never calls it,
    so hooks on it do not fire)."""

    def __init__(self, conv: nn.Module, rows: tuple[int, int]):
        super().__init__()
        object.__setattr__(self, "conv", conv)  # not a submodule: the view owns no parameters
        self.rows = rows

    @property
    def weight(self) -> torch.Tensor:
        return self.conv.weight.mT[self.rows[0] : self.rows[1]]

    @property
    def bias(self) -> torch.Tensor | None:
        b = self.conv.bias
        return None if b is None else b[self.rows[0] : self.rows[1]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight, self.bias)


def _decoder_architecture(model: nn.Module) -> Architecture:
    from .decoders import decoder_layout

    layout = decoder_layout(model)
    handles = []
    for i, mods in enumerate(layout.modules):
        get = model.get_submodule
        if layout.family == "gpt2":
            qkv = get(mods["query"])
            d = layout.hidden_size
            q, k, v = (FusedProjection(qkv, (j * d, (j + 1) * d)) for j in range(3))
            extra = {}
        else:
            q, k, v = get(mods["query"]), get(mods["key"]), get(mods["value"])
            qkv = q
            extra = {"gate": get(mods["ffn_gate"])} if layout.gated else {}
        up, down = ("ffn_up", "ffn_down") if layout.gated else ("ffn_in", "ffn_out")
        block_path = mods["attn_output"].rsplit(".", 2)[0]
        handles.append(
            LayerHandles(
                index=i,
                block=get(block_path),
                num_heads=layout.num_heads,
                head_dim=layout.head_dim,
                query=q,
                key=k,
                value=v,
                attention_output=get(mods["attn_output"]),
                intermediate=get(mods[up]),
                ffn_output=get(mods[down]),
                attention_norm=get(mods["attention_norm"]) if "attention_norm" in mods else None,
                attention_module=_parent(model, mods["query"]) if layout.family == "llama" else qkv,
                extra=extra,
                num_kv_heads=layout.num_kv_heads,
            )
        )
    blocks = model.get_submodule(layout.layers_path)
    return Architecture(
        family=layout.family,
        model_type=layout.model_type,
        hidden_size=layout.hidden_size,
        num_layers=layout.num_layers,
        num_heads=layout.num_heads,
        head_dim=layout.head_dim,
        pre_norm=True,
        layers=handles,
        encoder_layers=blocks,
        base_model=getattr(model, "base_model", model),
        causal=True,
        num_kv_heads=layout.num_kv_heads,
        decoder=layout,
    )


def _crate_architecture(model: nn.Module, config) -> Architecture:
    layers, blocks, base = _crate_layers(model, config)
    return Architecture(
        family="crate",
        model_type="crate",
        hidden_size=config.hidden_size,
        num_layers=len(blocks),
        num_heads=layers[0].num_heads,
        head_dim=layers[0].head_dim,
        pre_norm=True,
        layers=layers,
        encoder_layers=blocks,
        base_model=base,
    )


def _encoder_handles(model: nn.Module, blocks, num_heads: int) -> tuple[list[LayerHandles], bool]:
    """Each encoder block's handles (query/key/value, attention output, FFN, pre-attention norm), and whether the
    blocks are pre-norm (ViT-like) rather than post-norm (BERT-like)."""
    handles = []
    pre_norm = None
    for i, block in enumerate(blocks):
        found = {role: _match_role(block, role) for role in _ROLE_PATTERNS}
        missing = [r for r in ("query", "key", "value") if found[r] is None]
        if missing:
            raise ValueError(
                f"model: block {i + 1} of {type(model).__name__} has no {'/'.join(missing)} projection; {_EXPECTED}"
            )
        q_weight = found["query"][1].weight
        if q_weight.shape[0] % num_heads != 0:
            raise ValueError(
                f"model: query projection of block {i + 1} has {q_weight.shape[0]} outputs, not divisible by "
                f"{num_heads} heads"
            )
        norm = next(
            (getattr(block, n) for n in _PRE_NORM_NAMES if isinstance(getattr(block, n, None), nn.LayerNorm)), None
        )
        pre_norm = norm is not None if pre_norm is None else pre_norm
        handles.append(
            LayerHandles(
                index=i,
                block=block,
                num_heads=num_heads,
                head_dim=q_weight.shape[0] // num_heads,
                query=found["query"][1],
                key=found["key"][1],
                value=found["value"][1],
                attention_output=found["attention_output"][1] if found["attention_output"] else None,
                intermediate=found["intermediate"][1] if found["intermediate"] else None,
                ffn_output=found["ffn_output"][1] if found["ffn_output"] else None,
                attention_norm=norm,
                attention_module=_parent(block, found["query"][0]),
            )
        )
    return handles, bool(pre_norm)


def describe(model: nn.Module) -> Architecture:
    """Locate every block's attention/feed-forward modules; raise a clear error for unsupported models."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module (a Transformers model), got {type(model).__name__}")
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"model: expected a Transformers model with a .config, got {type(model).__name__}")
    model_type = getattr(config, "model_type", "") or ""
    if model_type == "crate":
        return _crate_architecture(model, config)

    from .decoders import find_decoder

    if find_decoder(model) is not None:
        return _decoder_architecture(model)
    if any(getattr(m, "is_causal", False) is True for m in model.modules()):
        from .decoders import decoder_layout

        decoder_layout(model)  # raises the decoder error: a causal model of an unsupported layout
    hidden = _config_int(config, "hidden_size", "dim", "d_model")
    num_heads = _config_int(config, "num_attention_heads", "n_heads", "num_heads")
    if hidden is None or num_heads is None:
        raise ValueError(f"model: config of type {model_type!r} has no hidden size / number of heads; {_EXPECTED}")
    num_layers = _config_int(config, "num_hidden_layers", "n_layers", "num_layers")
    list_name, blocks = _find_layer_list(model, num_layers)
    handles, pre_norm = _encoder_handles(model, blocks, num_heads)
    return Architecture(
        family="vit" if pre_norm else "bert",
        model_type=model_type,
        hidden_size=hidden,
        num_layers=len(blocks),
        num_heads=num_heads,
        head_dim=handles[0].head_dim,
        pre_norm=pre_norm,
        layers=handles,
        encoder_layers=blocks,
        base_model=getattr(model, "base_model", model),
    )
