"""Argument checks shared by the concept-fidelity measures (tensors in, clear errors out)."""

from __future__ import annotations

import torch

from ..._validation import check_tensor


def _check_pair(A, A_hat) -> tuple[torch.Tensor, torch.Tensor]:
    A = check_tensor(A, "A", ndim=(2, 3), allow_numpy=True)
    A_hat = check_tensor(A_hat, "A_hat", ndim=(2, 3), allow_numpy=True)
    if A.shape != A_hat.shape:
        raise ValueError(f"A_hat: expected the shape of A {tuple(A.shape)}, got {tuple(A_hat.shape)}")
    return A, A_hat


def _as_batch(x: torch.Tensor) -> torch.Tensor:
    """``(N, d)`` -> ``(1, N, d)``; batches pass through."""
    return x.unsqueeze(0) if x.ndim == 2 else x
