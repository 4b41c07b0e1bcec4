"""One attention head's query/key weights and the module whose input is that head's input, for encoders and decoders.

Every model is read through :func:`hf_tdiag.probes.describe.describe`:

* encoders (CRATE, CRATE-α, CRATE-MAE's encoder, ViT-like, BERT-like): bidirectional, the head's rows of the
  query / key projections (the white-box families: of the one shared projection ``U``);
* ToST is refused: its attention (TSSA) is not a softmax over query–key logits;
* GPT-2 (``model_type`` ``gpt2``): the fused ``attn.c_attn`` (a ``Conv1D``, ``y = x W + b`` with
  ``W (d, 3d)``: query columns ``h·p:(h+1)·p``, key columns ``d + h·p:…``), causal, learned absolute positions;
* Llama-style decoders (``self_attn.q_proj/k_proj``, grouped K/V heads, rotary position embedding):
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
from .decoders import model_getter
from .describe import Description, describe
from .offload import readable

__all__ = ["HeadWeights", "head_weights", "num_blocks"]


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


def _decoder_head(model: nn.Module, desc: Description, layer: int, head: int) -> HeadWeights:
    layout = desc.decoder
    get = model_getter(model)
    hw = layout.head(layer, head, get)  # checks layer and head (DecoderLayout.head / kv_head)
    p = layout.head_dim
    input_module = model.get_submodule(desc.layers[layer].paths["query"])
    if layout.family == "gpt2":
        config = model.config
        scale = p**-0.5 if getattr(config, "scale_attn_weights", True) else 1.0
        if getattr(config, "scale_attn_by_inverse_layer_idx", False):
            scale /= float(layer + 1)
        return HeadWeights(
            W_Q=hw.W_Q,
            b_Q=hw.b_Q,
            W_K=hw.W_K,
            b_K=hw.b_K,
            head_dim=p,
            scale=scale,
            family="gpt2",
            causal=True,
            rotary=False,
            input_module=input_module,
        )
    attn = _parent_module(model, desc.layers[layer].paths["query"])
    rotary = next((m for n, m in model.named_modules() if n.endswith("rotary_emb")), None)
    apply = getattr(importlib.import_module(type(attn).__module__), "apply_rotary_pos_emb", None)
    if rotary is None or apply is None:
        raise ValueError(
            f"model: {type(attn).__module__} has no rotary embedding / apply_rotary_pos_emb; expected a Llama-style decoder"
        )
    if layout.qk_norm:
        raise ValueError(
            "model: heads with q/k normalisation (q_norm/k_norm: Qwen3, Gemma3) are not supported by the "
            "Att-SVM head diagnostic (their logits are not bilinear in the head's input)"
        )
    return HeadWeights(
        W_Q=hw.W_Q,
        b_Q=hw.b_Q,
        W_K=hw.W_K,
        b_K=hw.b_K,
        head_dim=p,
        scale=float(getattr(attn, "scaling", p**-0.5)),
        family="llama",
        causal=True,
        rotary=True,
        input_module=input_module,
        rotary_emb=rotary,
        apply_rotary=apply,
    )


def _parent_module(model: nn.Module, path: str) -> nn.Module:
    return model.get_submodule(path.rsplit(".", 1)[0])


def num_blocks(model: nn.Module) -> int:
    """The number L of transformer blocks (encoder or decoder layers) of ``model``."""
    return describe(model).num_layers


def head_weights(model: nn.Module, layer: int, head: int) -> HeadWeights:
    """The query/key weights of head ``head`` in the block with 0-based index ``layer`` (block number ``layer + 1``)
    and the module to hook for its input."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a Transformers model (torch.nn.Module), got {type(model).__name__}")
    if getattr(model, "config", None) is None:
        raise TypeError(f"model: expected a Transformers model with a .config, got {type(model).__name__}")
    arch = describe(model)
    if arch.attention == "tssa":
        raise ValueError(
            "model: ToST's token-statistics self-attention (TSSA) has no softmax attention (no query–key logits, no "
            "token a query selects), so the attention-as-SVM diagnostic does not apply to it"
        )
    if arch.decoder is not None:
        return _decoder_head(model, arch, layer, head)
    integer(layer, "layer", low=0, high=arch.num_layers)
    handles = arch.layers[layer]
    integer(head, "head", low=0, high=handles.num_heads)
    p = handles.head_dim
    rows = slice(head * p, (head + 1) * p)
    q, k = handles.query, handles.key
    with readable(model, q, k):  # offloaded projections: read from the offload store
        W_Q, W_K = q.weight[rows].detach(), k.weight[rows].detach()
        b_Q = q.bias[rows].detach() if q.bias is not None else None
        b_K = k.bias[rows].detach() if k.bias is not None else None
    return HeadWeights(
        W_Q=W_Q,
        b_Q=b_Q,
        W_K=W_K,
        b_K=b_K,
        head_dim=p,
        scale=p**-0.5,
        family=arch.family,
        causal=arch.causal,  # a causal text CRATE (describe: attention="causal"); the other encoders are not
        rotary=False,
        input_module=q,
    )
