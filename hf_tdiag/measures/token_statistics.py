"""ToST's variational compression objective (Wu et al. 2025, the variational form of Rᶜ that TSSA descends).

Head projections ``W`` of shape (..., K, N, p) (``w_k(n) = U_kᵀ z_n``) and memberships ``Π`` of shape (..., K, N)
(``Π_k(n) ≥ 0``, token ``n``'s weight on head ``k``). With ``f(x) = log(1 + x)`` (the authors' code folds the
``p/ε²`` of the paper's ``f`` into ``U``), TSSA's update is ``−N ∇_W`` of this objective with ``Π`` held fixed.
"""

from __future__ import annotations

import torch

from .._validation import check_tensor

__all__ = ["variational_compression_rate"]


def variational_compression_rate(W: torch.Tensor, Pi: torch.Tensor) -> torch.Tensor:
    """``Rᶜ_var(W, Π) = ½ Σ_k (n_k/N) Σ_i log(1 + Σ_n Π_k(n) w_ki(n)² / n_k)``, ``n_k = Σ_n Π_k(n)``, per sample."""
    check_tensor(W, "W", min_ndim=3, shape="(..., K, N, p)")
    check_tensor(Pi, "Pi", min_ndim=2, shape="(..., K, N)")
    if Pi.shape != W.shape[:-1]:
        raise ValueError(
            f"Pi: expected shape {tuple(W.shape[:-1])} (W without its last dimension), got {tuple(Pi.shape)}"
        )
    if bool((Pi < 0).any()):
        raise ValueError("Pi: memberships must be non-negative")
    W64, Pi64 = W.double(), Pi.double()
    nk = Pi64.sum(-1)  # (..., K)
    second = (Pi64.unsqueeze(-1) * W64.pow(2)).sum(-2) / nk.clamp_min(torch.finfo(torch.float64).tiny).unsqueeze(-1)
    return 0.5 * ((nk / W.shape[-2]) * torch.log1p(second).sum(-1)).sum(-1)
