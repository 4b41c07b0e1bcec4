"""One attention head's query/key weights and the module whose input is that head's input, for encoders and decoders.

* encoders (CRATE, ViT-like, BERT-like): through :func:`hf_tdiag.probes.architecture.describe`;
* GPT-2 (``model_type`` ``gpt2``): the fused ``attn.c_attn`` (a ``Conv1D``, ``y = x W + b`` with
  ``W (d, 3d)``: query columns ``h·p:(h+1)·p``, key columns ``d + h·p:…``), causal, learned absolute positions;
* Llama-style decoders (``self_attn.q_proj/k_proj``, ``num_key_value_heads``, rotary position embedding):
  causal; key/value heads shared by ``H / H_kv`` query heads; the logit of key ``t`` for query ``q`` is
  ``x_tᵀ W_Kᵀ R_{q−t} W_Q x_q /√p`` with a rotation ``R`` that depends on the offset, so ``W_Kᵀ W_Q/√p`` is
  its form at offset 0 (``rotary=True`` says so).

This module only locates modules and slices weights; it does no math.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
from torch import nn

from .._validation import integer
from .architecture import describe

__all__ = ["HeadWeights", "head_weights", "decoder_kind"]


@dataclass
class HeadWeights:
    """``q = W_Q x + b_Q``, ``k = W_K x + b_K`` (``(p, d)`` weights) of one head, its scale and where its input is."""

    W_Q: torch.Tensor
    b_Q: torch.Tensor | None
    W_K: torch.Tensor
    b_K: torch.Tensor | None
    head_dim: int
    scale: float  # logits = scale · qᵀk
    family: str  # "crate" | "vit" | "bert" | "gpt2" | "llama"
    causal: bool
    rotary: bool
    input_module: nn.Module  # a forward pre-hook on it sees the head's input tokens (batch, N, d)
    rotary_emb: nn.Module | None = None  # the model's rotary embedding (rotary heads): (x, position_ids) -> (cos, sin)
    apply_rotary: object = None  # the modeling file's apply_rotary_pos_emb(q, k, cos, sin)


def _blocks(model: nn.Module, attr_path: tuple[str, ...]) -> nn.ModuleList | None:
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) and _has_path(module[0], attr_path):
            return module
    return None


def _has_path(module: nn.Module, path: tuple[str, ...]) -> bool:
    for part in path:
        module = getattr(module, part, None)
        if module is None:
            return False
    return True


def decoder_kind(model: nn.Module) -> str | None:
    """``"gpt2"`` or ``"llama"`` for the supported causal decoders, None otherwise (an encoder)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    if _blocks(model, ("attn", "c_attn")) is not None and getattr(config, "model_type", "") == "gpt2":
        return "gpt2"
    if _blocks(model, ("self_attn", "q_proj")) is not None and getattr(config, "num_key_value_heads", None) is not None:
        if any(hasattr(m, "rotary_emb") for m in model.modules()):
            return "llama"
    return None


def _gpt2_head(model: nn.Module, layer: int, head: int) -> HeadWeights:
    config = model.config
    blocks = _blocks(model, ("attn", "c_attn"))
    integer(layer, "layer", low=0, high=len(blocks))
    H = config.n_head
    integer(head, "head", low=0, high=H)
    d = config.n_embd
    p = d // H
    c_attn = blocks[layer].attn.c_attn
    W, b = c_attn.weight.detach(), c_attn.bias.detach()  # Conv1D: (d, 3d), y = x W + b
    q_cols, k_cols = slice(head * p, (head + 1) * p), slice(d + head * p, d + (head + 1) * p)
    scale = (p**-0.5 if getattr(config, "scale_attn_weights", True) else 1.0)
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        scale /= float(layer + 1)
    return HeadWeights(W_Q=W[:, q_cols].T, b_Q=b[q_cols], W_K=W[:, k_cols].T, b_K=b[k_cols], head_dim=p, scale=scale,
                       family="gpt2", causal=True, rotary=False, input_module=c_attn)


def _llama_head(model: nn.Module, layer: int, head: int) -> HeadWeights:
    config = model.config
    blocks = _blocks(model, ("self_attn", "q_proj"))
    integer(layer, "layer", low=0, high=len(blocks))
    H, H_kv = config.num_attention_heads, config.num_key_value_heads
    integer(head, "head", low=0, high=H)
    attn = blocks[layer].self_attn
    p = getattr(config, "head_dim", None) or config.hidden_size // H
    kv = head // (H // H_kv)
    q, k = attn.q_proj, attn.k_proj
    rotary = next(m.rotary_emb for m in model.modules() if hasattr(m, "rotary_emb"))
    apply = getattr(importlib.import_module(type(attn).__module__), "apply_rotary_pos_emb", None)
    if apply is None:
        raise ValueError(f"model: {type(attn).__module__} has no apply_rotary_pos_emb; expected a Llama-style decoder")
    rows_q, rows_k = slice(head * p, (head + 1) * p), slice(kv * p, (kv + 1) * p)
    return HeadWeights(
        W_Q=q.weight[rows_q].detach(), b_Q=q.bias[rows_q].detach() if q.bias is not None else None,
        W_K=k.weight[rows_k].detach(), b_K=k.bias[rows_k].detach() if k.bias is not None else None,
        head_dim=p, scale=float(getattr(attn, "scaling", p**-0.5)), family="llama", causal=True, rotary=True,
        input_module=q, rotary_emb=rotary, apply_rotary=apply,
    )


def head_weights(model: nn.Module, layer: int, head: int) -> HeadWeights:
    """The query/key weights of head ``head`` in block ``layer`` (0-based) and the module to hook for its input."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a Transformers model (torch.nn.Module), got {type(model).__name__}")
    kind = decoder_kind(model)
    if kind == "gpt2":
        return _gpt2_head(model, layer, head)
    if kind == "llama":
        return _llama_head(model, layer, head)
    arch = describe(model)
    integer(layer, "layer", low=0, high=arch.num_layers)
    handles = arch.layers[layer]
    integer(head, "head", low=0, high=handles.num_heads)
    p = handles.head_dim
    rows = slice(head * p, (head + 1) * p)
    q, k = handles.query, handles.key
    return HeadWeights(
        W_Q=q.weight[rows].detach(), b_Q=q.bias[rows].detach() if q.bias is not None else None,
        W_K=k.weight[rows].detach(), b_K=k.bias[rows].detach() if k.bias is not None else None,
        head_dim=p, scale=p**-0.5, family=arch.family, causal=False, rotary=False, input_module=q,
    )
