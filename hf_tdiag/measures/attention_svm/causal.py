"""Sequence-to-sequence and causal Att-SVM (Tarzanagh et al. 2023, §7): one constraint set per query position.

For inputs ``X_i ∈ R^{T×d}``, queries ``z_{ik}`` (``k = 0…K−1``) and selections ``α_{ik}``:

    min ‖W‖   s.t.   (x_{iα_{ik}} − x_{it})ᵀ W z_{ik} ≥ 1   for all t ∈ V_{ik}, t ≠ α_{ik},

where ``V_{ik}`` is the set of tokens query ``k`` can see: every real token (sequence-to-sequence), or,
with a causal mask, the prefix ``t ≤ k`` (the query at position ``k`` attends to the first ``k+1``
tokens). A general attention mask is the same with ``V_{ik}`` its support. This module builds the
per-query visibility and the flat list of queries; the solve itself is the ordinary Att-SVM.
"""

from __future__ import annotations

import numpy as np
import torch

from .inputs import valid_mask

__all__ = ["prefix_visibility", "query_layout"]


def prefix_visibility(positions: torch.Tensor, T: int) -> torch.Tensor:
    """``V[k, t] = t ≤ positions[k]``: the causal visibility ``(len(positions), T)`` of queries at ``positions``."""
    return torch.arange(T, device=positions.device)[None, :] <= positions[:, None]


def _check_selected(selected, B: int, K: int, T: int, device) -> torch.Tensor:
    """``selected`` as a tensor of indices ``(B, K)`` or boolean sets ``(B, K, T)``."""
    if isinstance(selected, np.ndarray):
        selected = torch.from_numpy(selected)
    if not isinstance(selected, torch.Tensor):
        raise TypeError(
            f"selected: expected a tensor ({B}, {K}) of indices or ({B}, {K}, {T}) mask, got {type(selected).__name__}"
        )
    selected = selected.to(device)
    if selected.dtype == torch.bool:
        if tuple(selected.shape) != (B, K, T):
            raise ValueError(f"selected: a boolean mask must have shape {(B, K, T)}, got {tuple(selected.shape)}")
    elif tuple(selected.shape) != (B, K):
        raise ValueError(f"selected: expected token indices of shape {(B, K)}, got {tuple(selected.shape)}")
    return selected


def query_layout(X: torch.Tensor, Q: torch.Tensor, selected, *, query_mask=None, token_mask=None, causal: bool = False):
    """Flatten queries ``Q (B, K, d_z)`` over token sets ``X (B, T, d)`` into one list of constraint sets.

    Returns ``(qidx (n, 2), z (n, d_z), selected_per_query, visible (n, T))``: query ``(b, k)``, its
    vector, its selection and the tokens it may be compared with (real tokens; with ``causal`` only
    ``t ≤ k``). Without an explicit ``query_mask`` a causal query that sees a single token (position 0)
    is left out: it has nothing to separate.
    """
    B, T, _ = X.shape
    if Q.ndim != 3 or Q.shape[0] != B:
        raise ValueError(f"queries: expected shape ({B}, K, d_z), got {tuple(Q.shape)}")
    K = Q.shape[1]
    if causal and K > T:
        raise ValueError(f"causal: query k sees tokens 0..k, so at most T={T} query positions are allowed, got K={K}")
    valid = valid_mask(token_mask, (B, T), X.device)
    default = valid[:, :K].clone() if K <= T else torch.ones(B, K, dtype=torch.bool, device=X.device)
    if causal and query_mask is None:
        default[:, 0] = False
    qmask = default if query_mask is None else valid_mask(query_mask, (B, K), X.device, "query_mask") & default
    qidx = torch.nonzero(qmask)
    if qidx.shape[0] == 0:
        raise ValueError("query_mask: no query tokens selected")
    sel = _check_selected(selected, B, K, T, X.device)
    visible = valid[qidx[:, 0]]
    if causal:
        visible = visible & prefix_visibility(qidx[:, 1], T)
    return qidx, Q[qidx[:, 0], qidx[:, 1]], sel[qidx[:, 0], qidx[:, 1]], visible
