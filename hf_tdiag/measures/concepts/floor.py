"""The reconstruction floor of any rank-k factorization (Eckart–Young)."""

from __future__ import annotations

import torch

from ..._validation import check_tensor


def truncated_svd_error(A: torch.Tensor, k: int) -> float:
    """Eckart–Young floor ``min_{rank ≤ k} ‖A − B‖_F = √(Σ_{i>k} σ_i²)`` (float64; A is (rows, d) or (images, N, d))."""
    A = check_tensor(A, "A", ndim=(2, 3), allow_numpy=True)
    X = A.reshape(-1, A.shape[-1]).double()
    s = torch.linalg.svdvals(X.T @ X if X.shape[0] > X.shape[1] else X @ X.T).clamp(min=0)
    tail = s.sort(descending=True).values[k:].sum()
    return float(tail.clamp(min=0).sqrt())
