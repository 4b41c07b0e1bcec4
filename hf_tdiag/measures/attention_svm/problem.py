"""Problem reduction: the constraint structure of an Att-SVM and its dual kernel as batched products.

Constraint ``k = (i, t)`` is ``⟨W, a_k⟩ ≥ 1`` (or ``= 0``) with ``a_k = (x_{iα_i} − x_{it}) z_iᵀ``. The dual
kernel factorizes, ``K[(i,t),(j,s)] = ((x_{iα}−x_{it})ᵀ(x_{jα}−x_{js}))·(z_iᵀz_j)``, so ``Kc`` is computed
as ``W = Σ_k c_k a_k = Gᵀ Z`` followed by the margins ``(x_{iα} − x_{it})ᵀ W z_i`` without forming ``d×d``
features. Before solving, tokens and queries are expressed in orthonormal bases of their spans
(:func:`reduce`), which is exact and preserves every norm.
"""

from __future__ import annotations

import torch

__all__ = ["Problem", "basis", "reduce", "chol_apply"]


def basis(M: torch.Tensor, rel_tol: float = 1e-13) -> torch.Tensor | None:
    """Orthonormal basis ``(k, r)`` of the row span of ``M (N, k)``, or None when the span is (nearly) everything."""
    N, k = M.shape
    if N >= 0.9 * k:
        return None
    _, s, vh = torch.linalg.svd(M, full_matrices=False)
    if s.numel() == 0 or s[0] == 0:
        return None
    r = int((s > rel_tol * s[0]).sum())
    return vh[:r].T.contiguous()


def reduce(X: torch.Tensor, Z: torch.Tensor, set_idx: torch.Tensor):
    """``(X P, Z S, P, S)``: tokens and queries in orthonormal bases of their spans (None = kept as is)."""
    used_sets = torch.unique(set_idx)
    tokens = X[used_sets].reshape(-1, X.shape[2])
    P = basis(tokens)
    S = basis(Z)
    Xr = X if P is None else X @ P
    Zr = Z if S is None else Z @ S
    return Xr, Zr, P, S


class Problem:
    """Constraint structure: token sets ``X (B, T, dx)``, queries ``Z (n, dz)`` belonging to set ``set_idx``."""

    def __init__(self, X, Z, set_idx, ref, kind):
        self.X, self.Z, self.set_idx, self.ref, self.kind = X, Z, set_idx, ref, kind
        B, T, _ = X.shape
        n = Z.shape[0]
        self.n, self.T, self.B = n, T, B
        device = X.device
        counts = torch.bincount(set_idx, minlength=B)
        self.qmax = int(counts.max())
        order = torch.argsort(set_idx, stable=True)
        offsets = torch.cumsum(counts, 0) - counts
        pos = torch.empty(n, dtype=torch.long, device=device)
        pos[order] = torch.arange(n, device=device) - offsets[set_idx[order]]
        self.pos = pos
        self.x_ref = X[set_idx, ref]  # (n, dx)
        self.use_gram = n <= Z.shape[1]
        self.C = Z @ Z.T if self.use_gram else None
        self.ineq_idx = torch.nonzero((kind == 1).reshape(-1)).squeeze(1)
        self.eq_idx = torch.nonzero((kind == 2).reshape(-1)).squeeze(1)

    # coefficient c (n, T) -> g_i = Σ_t c_it (x_ref_i − x_it)
    def to_G(self, c: torch.Tensor) -> torch.Tensor:
        if self.qmax == 1:
            XtC = (
                torch.einsum("nt,ntd->nd", c, self.X[self.set_idx])
                if self.B != self.n
                else torch.bmm(c.unsqueeze(1), self.X).squeeze(1)
            )
        else:
            Cb = c.new_zeros(self.B, self.qmax, self.T)
            Cb[self.set_idx, self.pos] = c
            XtC = torch.bmm(Cb, self.X)[self.set_idx, self.pos]
        return c.sum(1, keepdim=True) * self.x_ref - XtC

    # W = Σ_i g_i z_iᵀ = Gᵀ Z ; u_i = W z_i
    def to_U(self, G: torch.Tensor) -> torch.Tensor:
        if self.use_gram:
            return self.C @ G
        return self.Z @ (G.T @ self.Z).T

    # margins s_it = (x_ref − x_it)ᵀ u_i
    def margins_of_U(self, U: torch.Tensor) -> torch.Tensor:
        if self.qmax == 1 and self.B == self.n:
            XU = torch.bmm(self.X, U.unsqueeze(2)).squeeze(2)
        else:
            Ub = U.new_zeros(self.B, self.qmax, U.shape[1])
            Ub[self.set_idx, self.pos] = U
            XU = torch.bmm(self.X, Ub.transpose(1, 2))  # (B, T, qmax)
            XU = XU[self.set_idx, :, self.pos]  # (n, T)
        return (self.x_ref * U).sum(1, keepdim=True) - XU

    def apply_K(self, c: torch.Tensor) -> torch.Tensor:
        return self.margins_of_U(self.to_U(self.to_G(c)))

    def W_reduced(self, c: torch.Tensor) -> torch.Tensor:
        return self.to_G(c).T @ self.Z

    # explicit features for a list of flat constraint indices
    def deltas(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        i, t = flat // self.T, flat % self.T
        D = self.x_ref[i] - self.X[self.set_idx[i], t]
        return D, self.Z[i]

    def features(self, flat: torch.Tensor) -> torch.Tensor:
        """Rows ``vec_F(a_k) = kron(z_i, δ_k)`` of the constraint features, ``(len(flat), dx·dz)`` (``d×d`` sized)."""
        D, Zr = self.deltas(flat)
        return (Zr.unsqueeze(2) * D.unsqueeze(1)).reshape(flat.numel(), -1)

    def kernel_block(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        Dr, Zr = self.deltas(rows)
        Dc, Zc = self.deltas(cols)
        return (Dr @ Dc.T) * (Zr @ Zc.T)

    def diag(self, flat: torch.Tensor) -> torch.Tensor:
        D, Zr = self.deltas(flat)
        return (D * D).sum(1) * (Zr * Zr).sum(1)

    def query_blocks(self) -> torch.Tensor | None:
        """Diagonal blocks ``K_ii = (Δ_i Δ_iᵀ)‖z_i‖²`` of the kernel, ``(n, T, T)``, when affordable."""
        if not hasattr(self, "_blocks"):
            n, T, dx = self.n, self.T, self.X.shape[2]
            if n == 1 or n * T * T * dx > 5e9 or n * T * max(T, dx) > 5e7:
                self._blocks = None
            else:
                D = self.x_ref.unsqueeze(1) - self.X[self.set_idx]  # (n, T, dx)
                self._blocks = torch.bmm(D, D.transpose(1, 2)) * (self.Z * self.Z).sum(1)[:, None, None]
        return self._blocks

    def block_factor(self, free: torch.Tensor) -> torch.Tensor:
        """Cholesky factors of the diagonal blocks restricted to ``free (n, T)`` (identity elsewhere)."""
        G = self.query_blocks()
        f = free.to(G.dtype)
        Gm = G * (f.unsqueeze(2) * f.unsqueeze(1))
        jitter = 1e-10 * float(torch.diagonal(G, dim1=1, dim2=2).max())
        Gm.diagonal(dim1=1, dim2=2).add_(jitter + (1.0 - f))
        L, _ = torch.linalg.cholesky_ex(Gm)
        return L


def chol_apply(L: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(L Lᵀ)⁻¹ b`` for batched factors ``L (n, T, T)`` and ``b (n, T)`` (two triangular solves)."""
    y = torch.linalg.solve_triangular(L, b.unsqueeze(2), upper=False)
    return torch.linalg.solve_triangular(L.mT, y, upper=True).squeeze(2)
