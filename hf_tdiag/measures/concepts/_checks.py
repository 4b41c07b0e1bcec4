"""Argument checks shared by the concept-fidelity measures (tensors in, clear errors out)."""

from __future__ import annotations

import numpy as np
import torch

def _check_tensor(x, name: str, ndims: tuple[int, ...]) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or numpy array, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")
    if x.ndim not in ndims:
        shapes = " or ".join({2: "(rows, d)", 3: "(images, N, d)", 1: "(n,)"}[n] for n in ndims)
        raise ValueError(f"{name}: expected shape {shapes}, got {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: contains NaN or inf values")
    return x


def _check_pair(A, A_hat) -> tuple[torch.Tensor, torch.Tensor]:
    A = _check_tensor(A, "A", (2, 3))
    A_hat = _check_tensor(A_hat, "A_hat", (2, 3))
    if A.shape != A_hat.shape:
        raise ValueError(f"A_hat: expected the shape of A {tuple(A.shape)}, got {tuple(A_hat.shape)}")
    return A, A_hat


def _as_batch(x: torch.Tensor) -> torch.Tensor:
    """``(N, d)`` -> ``(1, N, d)``; batches pass through."""
    return x.unsqueeze(0) if x.ndim == 2 else x
