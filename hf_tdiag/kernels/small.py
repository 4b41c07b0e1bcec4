"""Batched factorizations of small matrices at one torch and BLAS thread (:func:`hf_tdiag._threads.measure_threads`
``("small")``), the caller's counts restored afterwards: the same torch.linalg call, the same numbers.

A batch of 64×64 Cholesky factorizations at two threads with one core kept busy ran over ten times slower than at
one; nothing in such a step is large enough for threads to pay.
"""

from __future__ import annotations

import torch

from .._threads import measure_threads

__all__ = ["cholesky_ex", "eigvalsh", "qr_r", "solve_lower", "svdvals"]


def cholesky_ex(mat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.cholesky_ex(mat)``: ``(L, info)``."""
    with measure_threads("small"):
        return torch.linalg.cholesky_ex(mat)


def eigvalsh(mat: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.eigvalsh(mat)``: eigenvalues of symmetric matrices, ascending."""
    with measure_threads("small"):
        return torch.linalg.eigvalsh(mat)


def solve_lower(L: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``L⁻¹B`` for lower-triangular ``L``."""
    with measure_threads("small"):
        return torch.linalg.solve_triangular(L, B, upper=False)


def qr_r(A: torch.Tensor) -> torch.Tensor:
    """``R`` of the reduced QR factorization ``A = QR``."""
    with measure_threads("small"):
        return torch.linalg.qr(A, mode="r")[1]


def svdvals(A: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.svdvals(A)``: singular values, descending."""
    with measure_threads("small"):
        return torch.linalg.svdvals(A)
