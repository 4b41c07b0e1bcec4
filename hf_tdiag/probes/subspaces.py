"""Per-layer subspaces ``U = (U_1, …, U_K)`` of a transformer, as ``(K, d, p)`` tensors.

CRATE: ``U_k`` is block ℓ's shared projection, ``U_k = qkv.weight[k·p:(k+1)·p]ᵀ``.
Other encoders (ViT, DeiT, BERT, RoBERTa, … any model whose blocks expose
query/key/value linears, found by :func:`hf_tdiag.probes.describe.describe`):
``U_k`` is head k's slice of the ``query``, ``key`` or ``value`` projection
(Hu, Zou & Xu 2024). Biases are not part of ``U``.

Decoders (:mod:`hf_tdiag.probes.families`; GPT-2, Llama, Mistral, Qwen2, …) with ``H`` query heads and
``H_kv`` key/value heads (grouped-query attention, ``H_kv`` divides ``H``; GPT-2 and multi-head models have
``H_kv = H``):

* ``source="query"``: ``K = H``, ``U_h = W_Q,hᵀ`` — query head h's rows of ``q_proj`` (GPT-2: the first
  ``d`` columns of the fused ``c_attn``), one subspace per query head;
* ``source="key"`` / ``"value"``: ``K = H_kv``, ``U_g = W_K,gᵀ`` / ``W_V,gᵀ`` — each K/V head ``g`` once,
  the subspace that query heads ``g·H/H_kv … (g+1)·H/H_kv − 1`` all read (``repeat_kv``).
  Counting a shared head once per query head that reads it would only repeat terms:
  ``Rᶜ`` with the per-query-head list ``(U_{g(0)}, …, U_{g(H−1)})`` is exactly ``(H/H_kv)·Rᶜ`` with the
  ``H_kv`` distinct subspaces, so nothing is lost, and ``Rᶜ`` sums over the subspaces the model has.
  Compare ``Rᶜ`` across sources of a GQA model per subspace (``Rᶜ / K``), not in total.

``U`` is taken before rotary position embeddings: RoPE rotates ``q`` and ``k`` after the projection, by an
angle that depends on the position, so it is not part of a fixed subspace (it keeps each head's ``‖Uᵀz‖`` but
not the Gram of the rotated tokens). Likewise a per-head q/k RMSNorm (Qwen3, Gemma3) acts after ``Uᵀz``.
"""

from __future__ import annotations

import torch
from torch import nn

from .describe import Description, describe
from .offload import offload_index, readable

SOURCES = ("query", "key", "value")


def check_source(source: str) -> str:
    """Validate ``source`` ∈ {query, key, value}."""
    if source not in SOURCES:
        raise ValueError(f"source: expected one of {SOURCES}, got {source!r}")
    return source


def weight_to_subspaces(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Linear weight ``(K·p, d)`` (rows k·p:(k+1)·p are ``U_kᵀ``) → ``U`` of shape ``(K, d, p)``."""
    if weight.ndim != 2 or weight.shape[0] % head_dim != 0:
        raise ValueError(f"weight: expected shape (K*{head_dim}, d), got {tuple(weight.shape)}")
    out_features, d = weight.shape
    return weight.reshape(out_features // head_dim, head_dim, d).transpose(1, 2)


def subspace_heads(arch: Description, source: str = "query") -> dict:
    """What ``U`` is for ``source``: ``num_subspaces`` K, ``head_dim`` p and, per subspace k, the query heads that read
    it (``[[k]]`` without grouped-query attention; a GQA K/V head lists every query head sharing it)."""
    check_source(source)
    H = arch.num_heads
    if arch.family == "crate" or source == "query" or not arch.num_kv_heads or arch.num_kv_heads == H:
        return {"num_subspaces": H, "head_dim": arch.head_dim, "query_heads": [[h] for h in range(H)]}
    group = H // arch.num_kv_heads
    return {
        "num_subspaces": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "query_heads": [list(range(g * group, (g + 1) * group)) for g in range(arch.num_kv_heads)],
    }


def layer_projection(arch: Description, index: int, source: str = "query") -> nn.Linear:
    """The ``nn.Linear`` whose rows are block ``index``'s ``U_kᵀ`` (CRATE: the shared ``qkv``)."""
    check_source(source)
    return getattr(arch.layers[index], source)


def subspaces(model: nn.Module, source: str = "query", detach: bool = False) -> list[torch.Tensor]:
    """One ``U`` of shape ``(K, d, p)`` per layer (views of the weights: differentiable unless ``detach``).

    For CRATE all three sources are the same shared projection. Decoders with grouped-query attention: K = H for
    ``query``, K = H_kv (each shared K/V head once) for ``key``/``value`` (module docstring, :func:`subspace_heads`).
    An Accelerate-offloaded model's projections are read one layer at a time from the offload store
    (:mod:`hf_tdiag.probes.offload`).
    """
    check_source(source)
    arch = describe(model)
    offloaded = bool(offload_index(model))
    out = []
    for i, handles in enumerate(arch.layers):
        projection = layer_projection(arch, i, source)
        if not offloaded:
            U = weight_to_subspaces(projection.weight, handles.head_dim)
        else:  # a copy of U alone: a view would keep the whole weight it slices (GPT-2: all of c_attn) alive
            with readable(model, projection):
                U = weight_to_subspaces(projection.weight, handles.head_dim).clone()
        out.append(U.detach() if detach else U)
    return out
