"""GPT-2 family adapter: blocks with one fused ``Conv1D`` ``attn.c_attn`` (``y = x W + b``, ``W (d, 3d)``: query, key
and value are its column blocks), output ``attn.c_proj``, MLP ``mlp.c_fc`` / ``mlp.c_proj`` (``Conv1D``); LayerNorm,
learned absolute positions, one K/V head per query head. GPT-2 and models that copy its layout."""

from __future__ import annotations

import torch
from torch import nn

from ..decoders import (
    DecoderLayout,
    TensorRef,
    check_width,
    config_value,
    decoder_description,
    heads_layout,
    one_block_list,
    text_config,
)
from ..describe import Adapter, BlockHandles, block_lists, register

ROLES = {
    "query": ("attn.c_attn",),
    "key": ("attn.c_attn",),
    "value": ("attn.c_attn",),
    "attn_output": ("attn.c_proj",),
    "ffn_in": ("mlp.c_fc",),
    "ffn_out": ("mlp.c_proj",),
    "attention_norm": ("ln_1",),
    "ffn_norm": ("ln_2",),
}
FINAL_NORM = ("ln_f",)  # the base model's norm after the blocks
_FUSED = ("query", "key", "value")
EXPECTED = "blocks with a fused Conv1D 'attn.c_attn', 'attn.c_proj' and 'mlp.c_fc'/'mlp.c_proj' (GPT-2 family)"


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


def _get(block: nn.Module, role: str):
    module = block
    for part in ROLES[role][0].split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def _is_block(block: nn.Module) -> bool:
    return all(_is_conv1d(_get(block, r)) for r in ("query", "ffn_in", "ffn_out"))


def _refs(prefix: str, d: int) -> dict[str, TensorRef]:
    refs = {}
    for role, (rel,) in ROLES.items():
        if role.endswith("norm"):
            continue
        rows = (_FUSED.index(role) * d, (_FUSED.index(role) + 1) * d) if role in _FUSED else None
        refs[role] = TensorRef(f"{prefix}{rel}.weight", True, rows, f"{prefix}{rel}.bias")
    return refs


def _handles(i: int, block: nn.Module, prefix: str, layout: DecoderLayout) -> BlockHandles:
    d = layout.hidden_size
    qkv = _get(block, "query")
    q, k, v = (FusedProjection(qkv, (j * d, (j + 1) * d)) for j in range(3))
    return BlockHandles(
        index=i,
        block=block,
        path=prefix[:-1],
        num_heads=layout.num_heads,
        head_dim=layout.head_dim,
        query=q,
        key=k,
        value=v,
        attn_output=_get(block, "attn_output"),
        ffn_in=_get(block, "ffn_in"),
        ffn_out=_get(block, "ffn_out"),
        attention_norm=_get(block, "attention_norm"),
        ffn_norm=_get(block, "ffn_norm"),
        num_kv_heads=layout.num_kv_heads,
        paths={role: f"{prefix}{rel}" for role, (rel,) in ROLES.items() if _get(block, role) is not None},
    )


def describe_gpt2(model: nn.Module):
    """The GPT-2 family's description of ``model``, None when it has no GPT-2 block list."""
    found = one_block_list(model, block_lists(model, _is_block))
    if found is None:
        return None
    path, blocks = found
    config = text_config(model)
    first = _get(blocks[0], "query")
    d = first.weight.shape[0]
    if first.weight.shape[1] != 3 * d:
        raise ValueError(f"model: {path}.0.attn.c_attn has {first.weight.shape[1]} outputs, expected 3 x {d}")
    H, H_kv, p = heads_layout(config, d, d, d, f"block 0 of {path}")
    check_width(config, d, path)
    prefixes = [f"{path}.{i}." if path else f"{i}." for i in range(len(blocks))]
    layout = DecoderLayout(
        family="gpt2",
        model_type=str(getattr(config, "model_type", "") or type(model).__name__),
        num_layers=len(blocks),
        hidden_size=d,
        num_heads=H,
        num_kv_heads=H_kv,
        head_dim=p,
        intermediate_size=_get(blocks[0], "ffn_in").weight.shape[1],
        gated=False,
        activation=str(config_value(config, "activation_function") or "gelu_new"),
        norm="layernorm",
        rotary=False,
        qk_norm=False,
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        layers_path=path,
        refs=[_refs(pre, d) for pre in prefixes],
    )
    handles = [_handles(i, b, pre, layout) for i, (b, pre) in enumerate(zip(blocks, prefixes))]
    return decoder_description(model, layout, handles, FINAL_NORM)


register(Adapter(name="gpt2", tables={"gpt2": ROLES}, describe=describe_gpt2, expected=EXPECTED, order=20))
