"""Per-layer subspaces ``U = (U_1, …, U_K)`` of a transformer, as ``(K, d, p)`` tensors.

CRATE: ``U_k`` is block ℓ's shared projection, ``U_k = qkv.weight[k·p:(k+1)·p]ᵀ``.
Other encoders (ViT, DeiT, BERT, RoBERTa, … any model whose blocks expose
query/key/value linears, found by :mod:`hf_tdiag.probes.architecture`):
``U_k`` is head k's slice of the ``query``, ``key`` or ``value`` projection
(Hu, Zou & Xu 2024). Biases are not part of ``U``.
"""

from __future__ import annotations

from typing import List

import torch
from torch import nn

from .architecture import Architecture, describe

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


def layer_projection(arch: Architecture, index: int, source: str = "query") -> nn.Linear:
    """The ``nn.Linear`` whose rows are block ``index``'s ``U_kᵀ`` (CRATE: the shared ``qkv``)."""
    check_source(source)
    return getattr(arch.layers[index], source)


def subspaces(model: nn.Module, source: str = "query", detach: bool = False) -> List[torch.Tensor]:
    """One ``U`` of shape ``(K, d, p)`` per layer (views of the weights: differentiable unless ``detach``).

    For CRATE all three sources are the same shared projection.
    """
    check_source(source)
    arch = describe(model)
    out = []
    for i, handles in enumerate(arch.layers):
        U = weight_to_subspaces(layer_projection(arch, i, source).weight, handles.head_dim)
        out.append(U.detach() if detach else U)
    return out
