"""Ding–Li–Jordan Semi-NMF steps (TPAMI 2010): the objective, the exact dictionary step, the multiplicative code step.

With ``A ≈ U Wᵀ`` (rows × d), codes ``U ≥ 0`` (rows × k), dictionary ``W`` (d × k):

* objective ``‖A − U Wᵀ‖²_F``;
* dictionary ``W = Aᵀ U (UᵀU)⁻¹`` (eq. 9);
* codes ``U ← U ∘ √(([AW]⁺ + U[WᵀW]⁻) / ([AW]⁻ + U[WᵀW]⁺))`` (eq. 10), which never increases the objective.
"""

from __future__ import annotations

import torch


def semi_nmf_objective(A: torch.Tensor, U: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Semi-NMF objective ``‖A − U Wᵀ‖²_F`` (float64 scalar; A is (rows, d), U (rows, k), W (d, k))."""
    return (A.double() - U.double() @ W.double().T).square().sum()


def solve_dictionary(UtA: torch.Tensor, UtU: torch.Tensor, dtype: torch.dtype, ridge: float = 0.0) -> torch.Tensor:
    """``W = (UᵀU)⁻¹ UᵀA`` transposed to (d, k): the k×k system in float64 (Cholesky, jitter, pinv fallback)."""
    UtU = UtU.double()
    UtA = UtA.double()
    k = UtU.shape[0]
    scale = float(UtU.diagonal().mean()) or 1.0
    eye = torch.eye(k, dtype=torch.float64, device=UtU.device)
    jitter = ridge
    for _ in range(6):
        L, info = torch.linalg.cholesky_ex(UtU + (jitter * scale) * eye)
        if int(info) == 0:
            return torch.cholesky_solve(UtA, L).T.to(dtype)
        jitter = max(jitter * 100.0, 1e-12)
    return (torch.linalg.pinv(UtU) @ UtA).T.to(dtype)


def lstsq_dictionary(A: torch.Tensor, U: torch.Tensor, ridge: float = 0.0) -> torch.Tensor:
    """Exact dictionary step ``W = Aᵀ U (UᵀU)⁻¹`` (Ding et al. eq. 9), k×k solve in float64."""
    return solve_dictionary(U.T @ A, U.T @ U, A.dtype, ridge)


def _mu_ratio(U: torch.Tensor, AW: torch.Tensor, Pp: torch.Tensor, Pn: torch.Tensor, eps: float) -> torch.Tensor:
    """``√(([AW]⁺ + U[WᵀW]⁻) / ([AW]⁻ + U[WᵀW]⁺))`` given ``Pp = [WᵀW]⁺``, ``Pn = [WᵀW]⁻``."""
    pos = AW.clamp(min=0)
    denom = (pos - AW).add_(U @ Pp).add_(eps)  # [AW]⁻ = [AW]⁺ − AW exactly
    return pos.add_(U @ Pn).div_(denom).sqrt_()


def _split_gram(WtW: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return WtW.clamp(min=0), (-WtW).clamp(min=0)


def mu_update_codes(
    A: torch.Tensor, U: torch.Tensor, W: torch.Tensor, AW: torch.Tensor | None = None, eps: float = 1e-12
) -> torch.Tensor:
    """Ding–Li–Jordan code step ``U ← U ∘ √(([AW]⁺ + U[WᵀW]⁻) / ([AW]⁻ + U[WᵀW]⁺))`` (never increases the objective)."""
    if AW is None:
        AW = A @ W
    return U * _mu_ratio(U, AW, *_split_gram(W.T @ W), eps)


def mu_pass(X: torch.Tensor, U: torch.Tensor, W: torch.Tensor, chunk: int, eps: float = 1e-12):
    """One MU code step on all rows, in place, streamed over row chunks so that each chunk of ``A`` is read once.

    Returns ``(UᵀA, UᵀU, ⟨AW, U⟩)`` of the updated codes: the next dictionary step and the objective need
    nothing else.
    """
    k, d = U.shape[1], X.shape[1]
    Pp, Pn = _split_gram(W.T @ W)
    UtA = torch.zeros(k, d, dtype=X.dtype, device=X.device)
    UtU = torch.zeros(k, k, dtype=X.dtype, device=X.device)
    for start in range(0, X.shape[0], chunk):
        Xc = X[start : start + chunk]
        Uc = U[start : start + chunk]
        Uc.mul_(_mu_ratio(Uc, Xc @ W, Pp, Pn, eps))
        UtA.addmm_(Uc.T, Xc)
        UtU.addmm_(Uc.T, Uc)
    # ⟨AW, U⟩ = ⟨UᵀA, Wᵀ⟩ (float64): k×d instead of rows×k work
    return UtA, UtU, float((UtA.double() * W.T.double()).sum())
