"""The finite part of the Gen-SVM equivalence for nonlinear heads: ``W_fin`` from the softmax log-ratios."""

from __future__ import annotations

import torch

from .inputs import selection, to_f64
from .problem import Problem

__all__ = ["gen_svm_finite_part"]


def gen_svm_finite_part(X, z, selected_mask, log_probs) -> torch.Tensor:
    """``W_fin``: min-norm W in ``S_fin = span{(x_{it}−x_{iτ}) z_iᵀ : t, τ ∈ O_i}`` with
    ``(x_{iτ} − x_{it})ᵀ W z_i = log s_{iτ} − log s_{it}`` for ``t, τ ∈ O_i`` (the softmax log-ratios)."""
    X = to_f64(X, "X", 3)
    z = to_f64(z, "z", 2, device=X.device)
    log_probs = to_f64(log_probs, "log_probs", 2, device=X.device)
    n, T, _ = X.shape
    if tuple(log_probs.shape) != (n, T):
        raise ValueError(f"log_probs: expected shape {(n, T)}, got {tuple(log_probs.shape)}")
    if z.shape[0] != n:
        raise ValueError(f"z: expected {n} queries, got {z.shape[0]}")
    valid = torch.ones(n, T, dtype=torch.bool, device=X.device)
    ref, kind = selection(selected_mask, n, T, valid, "selected_mask")
    if not (kind == 2).any():
        return torch.zeros(X.shape[2], z.shape[1], dtype=torch.float64, device=X.device)
    prob = Problem(X, z, torch.arange(n, device=X.device), ref, kind)
    E = prob.eq_idx
    i, t = E // T, E % T
    rhs = log_probs[i, ref[i]] - log_probs[i, t]
    KEE = prob.kernel_block(E, E)
    beta = torch.linalg.pinv(KEE, rtol=1e-12, hermitian=True) @ rhs
    c = torch.zeros(n * T, dtype=torch.float64, device=X.device)
    c[E] = beta
    return prob.W_reduced(c.view(n, T))
