"""Two CPU kernels torch lacks, for the coding rates: a one-triangle Gram matrix and a fast non-zero count.

* :func:`lower_gram` — ``AᵀA`` or ``AAᵀ`` (the smaller side) through BLAS ``?syrk``, which computes one
  triangle of a symmetric product: half the multiply-adds of torch's ``A @ A.mT``. The token-side Gram matrix
  of ``R(Z)`` (197×197 from 768 features per sample at ViT-B/16 width) is the largest cost of the SRR after the
  head projections, and ``syrk`` nearly halves it.
* :func:`count_nonzero` — NumPy's SIMD ``count_nonzero`` per sample, about 2.6× faster than
  ``torch.count_nonzero`` on (16, 197, 768) float32.

Both return ``None`` where they do not apply (not a CPU float32/float64 tensor, a tensor that needs a gradient,
or matrices too small for the per-matrix call to pay), and the caller uses torch. ``syrk`` is SciPy's
(``scipy.linalg.blas``) and runs at one thread: it is used only where torch itself runs at one thread (a busy
machine, or a caller's count of 1); with more threads free, torch's parallel matmul is faster (at 2 threads,
SciPy's OpenBLAS threads beside torch's still-spinning OpenMP workers ran the SRR at half speed).
"""

from __future__ import annotations

import numpy as np
import torch

from .._threads import measure_threads

# a per-matrix BLAS call costs ~10-20 µs of Python and dispatch: worth it from a few million multiply-adds on
# (a ViT-B token Gram, ~30 M multiply-adds, gains; a 64×64 head Gram, ~1 M, loses)
_MIN_SYRK_WORK = 1 << 22
_MIN_COUNT_ELEMENTS = 1 << 12  # a NumPy call per sample pays from a few thousand elements on
_DTYPES = (torch.float32, torch.float64)


def _applies(A: torch.Tensor) -> bool:
    return A.device.type == "cpu" and A.dtype in _DTYPES and not (A.requires_grad and torch.is_grad_enabled())


def lower_gram(A: torch.Tensor) -> torch.Tensor | None:
    """The lower triangle of each smaller-side Gram matrix ``G = AᵀA`` (``m ≤ n``) or ``AAᵀ`` of ``A`` (..., n, m),
    upper triangle zero, by ``?syrk``; ``None`` where it does not apply (use ``A.mT @ A``/``A @ A.mT``), torch
    running at more than one thread included."""
    if not _applies(A) or A.ndim < 2 or A.numel() == 0 or torch.get_num_threads() > 1:
        return None
    n, m = A.shape[-2], A.shape[-1]
    k, inner = min(n, m), max(n, m)
    if k * k * inner < _MIN_SYRK_WORK:
        return None
    from scipy.linalg import blas

    syrk = blas.ssyrk if A.dtype == torch.float32 else blas.dsyrk
    mats = A.detach().contiguous().reshape(-1, n, m).numpy()
    out = np.zeros((mats.shape[0], k, k), dtype=mats.dtype)
    # each C-order n×m matrix X is the Fortran-order m×n matrix Xᵀ (no copy): trans=0 gives Xᵀ·X (m×m),
    # trans=1 gives X·Xᵀ (n×n); the result is written into out[i].T (Fortran order), whose upper triangle
    # (lower=0) is out[i]'s lower triangle
    trans = 0 if n >= m else 1
    with measure_threads("small"):  # SciPy's BLAS at one thread, like torch here
        for i in range(mats.shape[0]):
            syrk(1.0, mats[i].T, c=out[i].T, trans=trans, lower=0, overwrite_c=1)
    return torch.from_numpy(out).reshape(*A.shape[:-2], k, k)


def count_nonzero(Z: torch.Tensor) -> torch.Tensor | None:
    """``‖Z‖₀`` of each matrix of ``Z`` (..., N, d) as float64, shape ``Z.shape[:-2]``; ``None`` where it does not
    apply (use ``torch.count_nonzero``)."""
    if not (Z.device.type == "cpu" and Z.dtype in _DTYPES) or Z.ndim < 2:
        return None
    per_sample = Z.shape[-2] * Z.shape[-1]
    if per_sample < _MIN_COUNT_ELEMENTS:
        return None
    flat = Z.detach().contiguous().reshape(-1, per_sample).numpy()
    counts = np.fromiter((np.count_nonzero(row) for row in flat), dtype=np.float64, count=flat.shape[0])
    return torch.from_numpy(counts).reshape(Z.shape[:-2])
