"""Non-negative least squares for the codes of a fixed dictionary (exact coordinate descent)."""

from __future__ import annotations

import torch


def nnls_codes(
    A: torch.Tensor, W: torch.Tensor, U0: torch.Tensor | None = None, max_iter: int = 500, tol: float = 1e-3
) -> torch.Tensor:
    """Codes for a fixed dictionary: ``argmin_{U≥0} ‖A − U Wᵀ‖²_F`` by exact coordinate descent (HALS sweeps).

    Each sweep minimizes exactly over one concept's column at a time (in the working dtype; WᵀW, AW and
    the residual check in float64). Stops when the KKT
    residual (projected gradient) satisfies ``‖P(U WᵀW − A W)‖_F ≤ tol·‖A W‖_F`` — independent of the
    start, so a warm start ``U0`` and the cold start ``max(0, A W (WᵀW)⁻¹)`` reach the unique minimizer
    (WᵀW ≻ 0) to that tolerance.
    """
    WtW64 = (W.T @ W).double()
    AW = A @ W
    AWt64 = AW.double().T.contiguous()
    diag = WtW64.diagonal()
    if float(diag.min()) <= 0:
        raise ValueError("W: a concept vector is all zeros; codes are undefined")
    if U0 is None:
        Ut = torch.linalg.lstsq(WtW64, AWt64).solution.clamp(min=0)
    else:
        Ut = U0.double().T.clamp(min=0)
    target = tol * max(float(AWt64.norm()), 1e-300)

    def kkt(Xt):
        G = WtW64 @ Xt.double() - AWt64
        return float(torch.where(Xt > 0, G, G.clamp(max=0)).norm())

    # sweeps in the working dtype on (k, rows) layout: each concept's codes are one contiguous row
    Ut = Ut.to(A.dtype).contiguous()
    WtW = WtW64.to(A.dtype)
    AWt = AWt64.to(A.dtype)
    inv = (1.0 / diag).tolist()
    k = WtW.shape[0]
    for sweep in range(max_iter):
        if sweep % 5 == 0 and kkt(Ut) <= target:
            break
        for j in range(k):
            step = (AWt[j] - WtW[j] @ Ut).mul_(inv[j])
            Ut[j].add_(step).clamp_(min=0)
    return Ut.T.contiguous()
