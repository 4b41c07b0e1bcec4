"""The dual kernel with equalities eliminated, ``K' = K_II − K_IE K_EE⁺ K_EI``, as a matvec on the inequalities.

``K`` is formed explicitly only when it is small (``DENSE_LIMIT`` constraints and ``DENSE_FLOPS`` work);
otherwise ``K'v`` goes through the factorized products of :class:`~.problem.Problem`.
"""

from __future__ import annotations

import torch

from .problem import Problem

__all__ = ["ReducedKernel", "DENSE_LIMIT", "DENSE_FLOPS", "FACE_FLOPS"]

DENSE_LIMIT = 3000  # form K when it has at most this many rows ...
DENSE_FLOPS = 5e7  # ... and forming it costs at most this many multiply-adds (the factored matvec wins beyond)
FACE_FLOPS = 2e9  # form a face block K_FF directly when it costs at most this many multiply-adds


class ReducedKernel:
    """``K' = K_II − K_IE K_EE⁺ K_EI`` (equalities eliminated) as a matvec on the flat inequality vector."""

    def __init__(self, prob: Problem, dense_limit: int | None = None, dense_flops: float | None = None):
        dense_limit = DENSE_LIMIT if dense_limit is None else dense_limit
        dense_flops = DENSE_FLOPS if dense_flops is None else dense_flops
        self.prob = prob
        self.face_flops = FACE_FLOPS
        I, E = prob.ineq_idx, prob.eq_idx
        self.m = I.numel()
        dims = prob.X.shape[2] + prob.Z.shape[1]
        self.dense = self.m <= dense_limit and self.m * self.m * dims <= dense_flops
        self.K = prob.kernel_block(I, I) if self.dense else None
        diag = torch.diagonal(self.K).clone() if self.dense else prob.diag(I)
        self.L = None
        self.Einfo = None
        if E.numel():
            KEE = prob.kernel_block(E, E)
            evals, evecs = torch.linalg.eigh(KEE)
            keep = evals > 1e-12 * max(float(evals.max()), 1e-300)
            V = evecs[:, keep] / evals[keep].sqrt()
            KIE = prob.kernel_block(I, E)
            self.L = KIE @ V  # K_IE K_EE^{+1/2}
            self.Einfo = (V, KIE)
            diag = diag - (self.L * self.L).sum(1)
            if self.dense:
                self.K = self.K - self.L @ self.L.T
        self.diag = diag.clamp_min(0)

    def face_kernel(self, idx: torch.Tensor) -> torch.Tensor:
        """``K'_FF`` for the free inequality constraints ``idx`` (formed from the factorization)."""
        flat = self.prob.ineq_idx[idx]
        KFF = self.prob.kernel_block(flat, flat)
        if self.L is not None:
            KFF = KFF - self.L[idx] @ self.L[idx].T
        return KFF

    def full_coef(self, lam: torch.Tensor) -> torch.Tensor:
        """Coefficients on the (n, T) grid: λ on inequalities, β = −K_EE⁺K_EIλ on equalities."""
        c = lam.new_zeros(self.prob.n * self.prob.T)
        c[self.prob.ineq_idx] = lam
        if self.Einfo is not None:
            V, KIE = self.Einfo
            c[self.prob.eq_idx] = -(V @ (V.T @ (KIE.T @ lam)))
        return c.view(self.prob.n, self.prob.T)

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        """``K'v`` for a flat inequality vector ``v``."""
        if self.dense:
            return self.K @ v
        c = v.new_zeros(self.prob.n * self.prob.T)
        c[self.prob.ineq_idx] = v
        out = self.prob.apply_K(c.view(self.prob.n, self.prob.T)).reshape(-1)[self.prob.ineq_idx]
        if self.L is not None:
            out = out - self.L @ (self.L.T @ v)
        return out
