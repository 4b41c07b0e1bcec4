"""Small helpers shared by the paper experiments: batched correlations, numerical rank, JSON-friendly numbers."""

from __future__ import annotations

import math

import torch

__all__ = ["batched_correlation", "numerical_rank", "mean_std", "finite_or_none"]


def batched_correlation(W: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``⟨W, ref⟩ / (‖W‖_F ‖ref‖_F)`` over the last two dimensions (0 where ``W`` is zero)."""
    num = (W * ref).sum((-2, -1))
    den = torch.linalg.norm(W, dim=(-2, -1)) * torch.linalg.norm(ref, dim=(-2, -1))
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(den))


def numerical_rank(W: torch.Tensor, rel_tol: float = 1e-3) -> int:
    """Number of singular values above ``rel_tol`` times the largest (0 for a zero matrix)."""
    s = torch.linalg.svdvals(W)
    return int((s > rel_tol * s[0]).sum()) if float(s[0]) > 0 else 0


def mean_std(values) -> tuple[float | None, float | None]:
    """Mean and standard deviation of a list (None for an empty one)."""
    t = torch.as_tensor(list(values), dtype=torch.float64)
    if t.numel() == 0:
        return None, None
    return float(t.mean()), float(t.std(unbiased=False))


def finite_or_none(x) -> float | None:
    """A float for JSON, None for NaN/inf."""
    x = float(x)
    return x if math.isfinite(x) else None
