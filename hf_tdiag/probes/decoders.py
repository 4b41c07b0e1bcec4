"""Decoder LLMs: where each block's attention and MLP weights are, found from the module tree.

One adapter per family, chosen from the modules (not from a list of model names):

* ``gpt2`` — blocks whose attention is one fused ``Conv1D`` ``attn.c_attn`` (``y = x W + b`` with
  ``W (d, 3d)``: the query, key and value are its column blocks), output ``attn.c_proj``, MLP
  ``mlp.c_fc`` / ``mlp.c_proj`` (``Conv1D``); LayerNorm, learned absolute positions, one K/V head per
  query head. GPT-2 and models that copy its layout.
* ``llama`` — blocks with separate ``self_attn.q_proj / k_proj / v_proj / o_proj`` ``nn.Linear``
  projections and an MLP of ``gate_proj / up_proj / down_proj`` (gated:
  ``down(act(gate x) ⊙ up x)``) or ``up_proj / down_proj`` (plain); RMSNorm, rotary position
  embedding (a parameter-free rotation of q and k, not a weight), grouped-query attention with
  ``H_kv ≤ H`` K/V heads. Llama, Mistral, Qwen2/Qwen3, Gemma/Gemma2/Gemma3 (text) and models that copy
  the layout.

**Grouped-query attention.** Query head ``h`` reads K/V head ``g(h) = h // (H / H_kv)`` — what
Transformers' ``repeat_kv`` does: K/V head ``g`` serves query heads ``g·H/H_kv … (g+1)·H/H_kv − 1``.
:meth:`DecoderLayout.kv_head` and :meth:`DecoderLayout.query_heads` make this explicit, and
:meth:`DecoderLayout.head` returns one query head's ``W_Q``, the shared ``W_K`` / ``W_V`` rows and its
columns of ``W_O``.

A layout names tensors, it does not hold them: every accessor takes ``get(name) -> tensor`` (the model's
parameters, or one safetensors shard's tensors when streaming a checkpoint), so the same adapter serves
an instantiated model and a checkpoint read layer by layer. Weights come back in PyTorch ``(out, in)``
layout as views (a Conv1D's ``(in, out)`` weight transposed, a fused block sliced); no dtype or device
change. This module does no math.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from .._validation import integer

__all__ = [
    "TensorRef",
    "DecoderLayout",
    "DecoderHead",
    "decoder_layout",
    "find_decoder",
    "model_getter",
    "DECODER_EXPECTED",
]

DECODER_EXPECTED = (
    "a decoder whose blocks have either a fused Conv1D 'attn.c_attn' with 'mlp.c_fc'/'mlp.c_proj' (GPT-2 family) or "
    "nn.Linear 'self_attn.q_proj/k_proj/v_proj/o_proj' with 'mlp.gate_proj/up_proj/down_proj' or "
    "'mlp.up_proj/down_proj' (Llama, Mistral, Qwen, Gemma family)"
)

ATTENTION_ROLES = ("query", "key", "value", "attn_output")
GATED_ROLES = ("ffn_gate", "ffn_up", "ffn_down")
PLAIN_ROLES = ("ffn_in", "ffn_out")


@dataclass(frozen=True)
class TensorRef:
    """Where one role's weight is: parameter ``name``; Conv1D-style ``(in, out)`` storage when ``transpose``;
    ``rows`` = the slice of the ``(out, in)`` rows that belong to this role (fused projections)."""

    name: str
    transpose: bool = False
    rows: tuple[int, int] | None = None
    bias: str | None = None

    def read(self, get: Callable[[str], torch.Tensor]) -> torch.Tensor:
        """The ``(out, in)`` weight (a view) from ``get``."""
        w = get(self.name)
        w = w.mT if self.transpose else w
        return w[self.rows[0] : self.rows[1]] if self.rows else w

    def read_bias(self, get: Callable[[str], torch.Tensor]) -> torch.Tensor | None:
        if self.bias is None:
            return None
        b = get(self.bias)
        return b[self.rows[0] : self.rows[1]] if self.rows else b


@dataclass
class DecoderHead:
    """One query head ``h`` of one block: ``W_Q (p, d)``, its shared K/V head ``kv_head`` (``W_K, W_V (p, d)``)
    and its columns of the output projection ``W_O (d, p)`` (``attn_output = Σ_h W_O,h · head_h``)."""

    layer: int
    head: int
    kv_head: int
    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor
    b_Q: torch.Tensor | None = None
    b_K: torch.Tensor | None = None
    b_V: torch.Tensor | None = None


@dataclass
class DecoderLayout:
    """What the diagnostics need to know about a decoder, with tensor names relative to the model it was read from."""

    family: str  # "gpt2" | "llama"
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    gated: bool
    activation: str
    norm: str  # "layernorm" | "rmsnorm"
    rotary: bool
    qk_norm: bool  # per-head RMSNorm on q and k (Qwen3, Gemma3)
    tied_embeddings: bool
    layers_path: str  # e.g. "model.layers" or "transformer.h"
    refs: list[dict[str, TensorRef]] = field(default_factory=list)
    modules: list[dict[str, str]] = field(default_factory=list)  # role -> module path (the module that computes it)

    @property
    def causal(self) -> bool:
        return True

    @property
    def ffn_roles(self) -> tuple[str, ...]:
        return GATED_ROLES if self.gated else PLAIN_ROLES

    @property
    def group_size(self) -> int:
        """Query heads per K/V head, ``H / H_kv``."""
        return self.num_heads // self.num_kv_heads

    def kv_head(self, head: int) -> int:
        """The K/V head query head ``head`` reads: ``head // (H / H_kv)``."""
        integer(head, "head", low=0, high=self.num_heads)
        return head // self.group_size

    def query_heads(self, kv_head: int) -> list[int]:
        """The query heads that share K/V head ``kv_head``."""
        integer(kv_head, "kv_head", low=0, high=self.num_kv_heads)
        return list(range(kv_head * self.group_size, (kv_head + 1) * self.group_size))

    def tensor_names(self, layer: int) -> list[str]:
        """Every tensor block ``layer``'s weights are read from (each once)."""
        integer(layer, "layer", low=0, high=self.num_layers)
        names = []
        for ref in self.refs[layer].values():
            for n in (ref.name, ref.bias):
                if n is not None and n not in names:
                    names.append(n)
        return names

    def weight(self, layer: int, role: str, get: Callable[[str], torch.Tensor]) -> torch.Tensor:
        """Block ``layer``'s ``(out, in)`` weight of ``role`` (query ``(H·p, d)``, key/value ``(H_kv·p, d)``,
        attn_output ``(d, H·p)``, ffn_gate/ffn_up/ffn_in ``(I, d)``, ffn_down/ffn_out ``(d, I)``)."""
        integer(layer, "layer", low=0, high=self.num_layers)
        if role not in self.refs[layer]:
            raise ValueError(f"role: expected one of {sorted(self.refs[layer])}, got {role!r}")
        return self.refs[layer][role].read(get)

    def bias(self, layer: int, role: str, get: Callable[[str], torch.Tensor]) -> torch.Tensor | None:
        """The bias of ``role`` in block ``layer`` (None when it has none)."""
        integer(layer, "layer", low=0, high=self.num_layers)
        return self.refs[layer][role].read_bias(get)

    def heads(
        self, layer: int, role: str, get: Callable[[str], torch.Tensor], *, by_query_head: bool = False
    ) -> torch.Tensor:
        """Per-head rows ``(K, p, d)``: W_Q,h (K = H), W_K,g / W_V,g (K = H_kv, or H with ``by_query_head``: row h is
        query head h's shared K/V head g(h)) or the rows of ``(W_O)ᵀ`` that belong to query head h (role attn_output)."""
        w = self.weight(layer, role, get)
        p, d = self.head_dim, self.hidden_size
        if role == "attn_output":
            return w.mT.reshape(self.num_heads, p, d)
        if role not in ("query", "key", "value"):
            raise ValueError(f"role: expected 'query', 'key', 'value' or 'attn_output', got {role!r}")
        per = w.reshape(-1, p, d)
        if by_query_head and role != "query":
            index = torch.tensor([self.kv_head(h) for h in range(self.num_heads)], device=per.device)
            per = per.index_select(0, index)
        return per

    def head(self, layer: int, head: int, get: Callable[[str], torch.Tensor]) -> DecoderHead:
        """Query head ``head`` of block ``layer`` with its shared K/V head (see :class:`DecoderHead`)."""
        integer(layer, "layer", low=0, high=self.num_layers)
        g = self.kv_head(head)
        p = self.head_dim
        q_rows, kv_rows = slice(head * p, (head + 1) * p), slice(g * p, (g + 1) * p)

        def bias(role, rows):
            b = self.bias(layer, role, get)
            return None if b is None else b[rows]

        return DecoderHead(
            layer=layer,
            head=head,
            kv_head=g,
            W_Q=self.weight(layer, "query", get)[q_rows],
            W_K=self.weight(layer, "key", get)[kv_rows],
            W_V=self.weight(layer, "value", get)[kv_rows],
            W_O=self.weight(layer, "attn_output", get)[:, q_rows],
            b_Q=bias("query", q_rows),
            b_K=bias("key", kv_rows),
            b_V=bias("value", kv_rows),
        )

    def layer_bytes(self, layer: int, get_nbytes: Callable[[str], int]) -> int:
        """Bytes of block ``layer``'s weight tensors as stored (``get_nbytes(name)`` per tensor)."""
        return sum(get_nbytes(n) for n in self.tensor_names(layer))

    def describe(self) -> dict:
        """The layout as a JSON-ready dict (no tensors)."""
        return {
            "family": self.family,
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "gated": self.gated,
            "activation": self.activation,
            "norm": self.norm,
            "rotary": self.rotary,
            "qk_norm": self.qk_norm,
            "tied_embeddings": self.tied_embeddings,
            "layers_path": self.layers_path,
            "kv_head_of_query_head": [self.kv_head(h) for h in range(self.num_heads)],
        }


def _is_conv1d(module) -> bool:
    """Transformers' ``Conv1D`` (a linear layer storing ``W (in, out)``), recognised by its attributes."""
    w = getattr(module, "weight", None)
    return (
        isinstance(module, nn.Module)
        and not isinstance(module, nn.Linear)
        and isinstance(w, torch.Tensor)
        and w.ndim == 2
        and getattr(module, "nf", None) == w.shape[1]
    )


def _sub(module: nn.Module, path: str):
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def _block_kind(block: nn.Module) -> str | None:
    if (
        _is_conv1d(_sub(block, "attn.c_attn"))
        and _is_conv1d(_sub(block, "mlp.c_fc"))
        and _is_conv1d(_sub(block, "mlp.c_proj"))
    ):
        return "gpt2"
    attn = getattr(block, "self_attn", None)
    if attn is not None and all(
        isinstance(getattr(attn, n, None), nn.Linear) for n in ("q_proj", "k_proj", "v_proj", "o_proj")
    ):
        mlp = getattr(block, "mlp", None)
        if mlp is not None and all(isinstance(getattr(mlp, n, None), nn.Linear) for n in ("up_proj", "down_proj")):
            return "llama"
    return None


def find_decoder(model: nn.Module) -> tuple[str, str, nn.ModuleList] | None:
    """``(family, path, blocks)`` of the decoder block list of ``model``, or None when it has no such list."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module):
            kinds = {_block_kind(b) for b in module}
            if len(kinds) == 1 and None not in kinds:
                found.append((kinds.pop(), name, module))
    if len(found) > 1:
        raise ValueError(
            f"model: found several decoder block lists {[f[1] for f in found]} in {type(model).__name__}; "
            "pass the decoder sub-model itself"
        )
    return found[0] if found else None


def _config_value(config, *names):
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return None


def _text_config(model: nn.Module):
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"model: expected a Transformers model with a .config, got {type(model).__name__}")
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _heads_layout(config, q_out: int, k_out: int, hidden: int, where: str) -> tuple[int, int, int]:
    H = _config_value(config, "num_attention_heads", "n_head")
    if not isinstance(H, int) or H < 1:
        raise ValueError(f"model: config has no number of attention heads (num_attention_heads / n_head); {where}")
    p = _config_value(config, "head_dim")
    p = p if isinstance(p, int) and p > 0 else hidden // H
    if q_out != H * p:
        raise ValueError(f"model: {where} query projection has {q_out} outputs, expected {H} heads x {p} = {H * p}")
    if k_out % p:
        raise ValueError(f"model: {where} key projection has {k_out} outputs, not a multiple of head_dim {p}")
    H_kv = k_out // p
    cfg_kv = _config_value(config, "num_key_value_heads")
    if (isinstance(cfg_kv, int) and cfg_kv != H_kv) or H % H_kv:
        raise ValueError(
            f"model: {where} has {H_kv} key/value heads (config.num_key_value_heads = {cfg_kv}) for {H} query heads; "
            "expected a divisor of the number of query heads"
        )
    return H, H_kv, p


def _gpt2_refs(path: str, i: int, d: int) -> tuple[dict[str, TensorRef], dict[str, str]]:
    b = f"{path}.{i}" if path else str(i)
    qkv = f"{b}.attn.c_attn"
    refs = {
        role: TensorRef(f"{qkv}.weight", True, (k * d, (k + 1) * d), f"{qkv}.bias")
        for k, role in enumerate(("query", "key", "value"))
    }
    refs["attn_output"] = TensorRef(f"{b}.attn.c_proj.weight", True, None, f"{b}.attn.c_proj.bias")
    refs["ffn_in"] = TensorRef(f"{b}.mlp.c_fc.weight", True, None, f"{b}.mlp.c_fc.bias")
    refs["ffn_out"] = TensorRef(f"{b}.mlp.c_proj.weight", True, None, f"{b}.mlp.c_proj.bias")
    modules = {
        "query": qkv,
        "key": qkv,
        "value": qkv,
        "attn_output": f"{b}.attn.c_proj",
        "ffn_in": f"{b}.mlp.c_fc",
        "ffn_out": f"{b}.mlp.c_proj",
        "attention_norm": f"{b}.ln_1",
    }
    return refs, modules


def _linear_ref(block: nn.Module, b: str, rel: str) -> TensorRef:
    lin = _sub(block, rel)
    return TensorRef(f"{b}.{rel}.weight", False, None, f"{b}.{rel}.bias" if lin.bias is not None else None)


def _llama_refs(block: nn.Module, path: str, i: int, gated: bool) -> tuple[dict[str, TensorRef], dict[str, str]]:
    b = f"{path}.{i}" if path else str(i)
    rel = {
        "query": "self_attn.q_proj",
        "key": "self_attn.k_proj",
        "value": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
    }
    rel.update(
        {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
        if gated
        else {"ffn_in": "mlp.up_proj", "ffn_out": "mlp.down_proj"}
    )
    refs = {role: _linear_ref(block, b, r) for role, r in rel.items()}
    modules = {role: f"{b}.{r}" for role, r in rel.items()}
    if getattr(block, "input_layernorm", None) is not None:
        modules["attention_norm"] = f"{b}.input_layernorm"
    return refs, modules


def decoder_layout(model: nn.Module) -> DecoderLayout:
    """The :class:`DecoderLayout` of a GPT-2- or Llama-family decoder; ValueError naming what was found otherwise."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module (a Transformers model), got {type(model).__name__}")
    config = _text_config(model)
    found = find_decoder(model)
    if found is None:
        raise ValueError(
            f"model: {type(model).__name__} (model_type {getattr(config, 'model_type', None)!r}) is not a supported "
            f"decoder; expected {DECODER_EXPECTED}. Fused q/k/v ('qkv_proj', 'query_key_value'), mixture-of-experts "
            "MLPs and cross-attention decoders are not supported"
        )
    family, path, blocks = found
    first = blocks[0]
    hidden = _config_value(config, "hidden_size", "n_embd")
    if family == "gpt2":
        d = first.attn.c_attn.weight.shape[0]
        if first.attn.c_attn.weight.shape[1] != 3 * d:
            raise ValueError(
                f"model: {path}.0.attn.c_attn has {first.attn.c_attn.weight.shape[1]} outputs, expected 3 x {d}"
            )
        H, H_kv, p = _heads_layout(config, d, d, d, f"block 0 of {path}")
        per = [_gpt2_refs(path, i, d) for i in range(len(blocks))]
        inter = first.mlp.c_fc.weight.shape[1]
        gated, act, norm, rotary = (
            False,
            str(_config_value(config, "activation_function") or "gelu_new"),
            "layernorm",
            False,
        )
    else:
        q, k = first.self_attn.q_proj, first.self_attn.k_proj
        d = q.in_features
        H, H_kv, p = _heads_layout(config, q.out_features, k.out_features, d, f"block 0 of {path}")
        gated = isinstance(getattr(first.mlp, "gate_proj", None), nn.Linear)
        per = [_llama_refs(b, path, i, gated) for i, b in enumerate(blocks)]
        inter = first.mlp.up_proj.out_features
        act = str(_config_value(config, "hidden_activation", "hidden_act") or "silu")
        norm_mod = getattr(first, "input_layernorm", None)
        norm = "layernorm" if isinstance(norm_mod, nn.LayerNorm) else "rmsnorm"
        rotary = any(n.endswith("rotary_emb") for n, _ in model.named_modules())
    if isinstance(hidden, int) and hidden != d:
        raise ValueError(f"model: config hidden size {hidden} differs from the block width {d} read from {path}.0")
    qk_norm = family == "llama" and any(getattr(first.self_attn, n, None) is not None for n in ("q_norm", "k_norm"))
    return DecoderLayout(
        family=family,
        model_type=str(getattr(config, "model_type", "") or type(model).__name__),
        num_layers=len(blocks),
        hidden_size=d,
        num_heads=H,
        num_kv_heads=H_kv,
        head_dim=p,
        intermediate_size=inter,
        gated=gated,
        activation=act,
        norm=norm,
        rotary=rotary,
        qk_norm=qk_norm,
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        layers_path=path,
        refs=[r for r, _ in per],
        modules=[m for _, m in per],
    )


def not_a_decoder(model: nn.Module, model_type) -> ValueError:
    """The error for a causal model no decoder adapter reads (or a model that is not a decoder at all)."""
    return ValueError(
        f"model: {type(model).__name__} (model_type {model_type!r}) is not a supported decoder; expected "
        f"{DECODER_EXPECTED}. Fused q/k/v ('qkv_proj', 'query_key_value'), mixture-of-experts MLPs and "
        "cross-attention decoders are not supported"
    )


def config_value(config, *names):
    """The first of ``config``'s attributes ``names`` that is set (None when none is)."""
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return None


def text_config(model: nn.Module):
    """The language model's config: ``config.get_text_config()`` (a multimodal model's text part) or ``config``."""
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"model: expected a Transformers model with a .config, got {type(model).__name__}")
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def heads_layout(config, q_out: int, k_out: int, hidden: int, where: str) -> tuple[int, int, int]:
    """``(H, H_kv, p)`` from the config's head count and the query / key projection widths, checked."""
    H = config_value(config, "num_attention_heads", "n_head")
    if not isinstance(H, int) or H < 1:
        raise ValueError(f"model: config has no number of attention heads (num_attention_heads / n_head); {where}")
    p = config_value(config, "head_dim")
    p = p if isinstance(p, int) and p > 0 else hidden // H
    if q_out != H * p:
        raise ValueError(f"model: {where} query projection has {q_out} outputs, expected {H} heads x {p} = {H * p}")
    if k_out % p:
        raise ValueError(f"model: {where} key projection has {k_out} outputs, not a multiple of head_dim {p}")
    H_kv = k_out // p
    cfg_kv = config_value(config, "num_key_value_heads")
    if (isinstance(cfg_kv, int) and cfg_kv != H_kv) or H % H_kv:
        raise ValueError(
            f"model: {where} has {H_kv} key/value heads (config.num_key_value_heads = {cfg_kv}) for {H} query heads; "
            "expected a divisor of the number of query heads"
        )
    return H, H_kv, p


def one_block_list(model: nn.Module, lists: list) -> tuple[str, nn.ModuleList] | None:
    """The one decoder block list among ``lists`` (None when empty; a ValueError when there are several)."""
    if len(lists) > 1:
        raise ValueError(
            f"model: found several decoder block lists {[name for name, _ in lists]} in {type(model).__name__}; "
            "pass the decoder sub-model itself"
        )
    return lists[0] if lists else None


def check_width(config, d: int, path: str) -> None:
    """The config's hidden size, when it has one, is the block width ``d`` read from the weights."""
    hidden = config_value(config, "hidden_size", "n_embd")
    if isinstance(hidden, int) and hidden != d:
        raise ValueError(f"model: config hidden size {hidden} differs from the block width {d} read from {path}.0")


def decoder_description(model: nn.Module, layout: DecoderLayout, handles: list):
    """The :class:`~hf_tdiag.probes.describe.Description` of a decoder from its layout and block handles."""
    from .describe import Description

    return Description(
        family=layout.family,
        model_type=layout.model_type,
        hidden_size=layout.hidden_size,
        num_layers=layout.num_layers,
        num_heads=layout.num_heads,
        head_dim=layout.head_dim,
        pre_norm=True,
        layers=handles,
        encoder_layers=model.get_submodule(layout.layers_path),
        base_model=getattr(model, "base_model", model),
        layers_path=layout.layers_path,
        projection_layout="fused" if layout.family == "gpt2" else "separate",
        attention="causal",
        rotary=layout.rotary,
        num_kv_heads=layout.num_kv_heads,
        decoder=layout,
    )


def model_getter(model: nn.Module) -> Callable[[str], torch.Tensor]:
    """``get(name)`` over ``model``'s parameters, detached (what a :class:`DecoderLayout` reads from)."""
    params: Mapping[str, torch.Tensor] = dict(model.named_parameters())

    def get(name: str) -> torch.Tensor:
        try:
            return params[name].detach()
        except KeyError:
            raise ValueError(f"model: {type(model).__name__} has no parameter {name!r}") from None

    return get
