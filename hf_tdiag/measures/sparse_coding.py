"""The LASSO objective that CRATE's and CRATE-α's ISTA steps are derived to decrease (Yu et al. 2023, eq. 17).

Tokens are rows: ``x`` of shape (..., N, d), codes ``a`` of shape (..., N, m), a dictionary ``D`` of shape (d, m)
(column ``j`` is atom ``j``; CRATE's square dictionary is its ``ista.weight``, CRATE-α's its ``D``).
"""

from __future__ import annotations

import torch

from .._validation import check_tensor, non_negative_float

__all__ = ["lasso_objective"]


def lasso_objective(x: torch.Tensor, D: torch.Tensor, a: torch.Tensor, lam: float) -> torch.Tensor:
    """``(1/N) Σ_n ½‖x_n − D a_n‖² + λ‖a_n‖₁`` per sample (shape ``x.shape[:-2]``), float64."""
    check_tensor(x, "x", min_ndim=2, shape="(..., N, d)")
    check_tensor(a, "a", min_ndim=2, shape="(..., N, m)")
    check_tensor(D, "D", ndim=2, shape="(d, m)")
    lam = non_negative_float(lam, "lam")
    if D.shape[0] != x.shape[-1] or D.shape[1] != a.shape[-1] or a.shape[:-1] != x.shape[:-1]:
        raise ValueError(
            f"x, D, a: expected shapes (..., N, d), (d, m), (..., N, m); got {tuple(x.shape)}, {tuple(D.shape)}, "
            f"{tuple(a.shape)}"
        )
    x64, a64 = x.double(), a.double()
    residual = x64 - a64 @ D.double().T
    per_token = 0.5 * residual.pow(2).sum(-1) + lam * a64.abs().sum(-1)
    return per_token.mean(-1)
