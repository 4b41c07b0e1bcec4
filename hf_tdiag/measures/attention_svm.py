"""Attention as a max-margin SVM (Tarzanagh, Li, Thrampoulidis & Oymak, arXiv 2308.16898).

For inputs ``X_i ∈ R^{T×d}`` (tokens as rows), queries ``z_i ∈ R^{d_z}`` and a
selected token ``α_i`` per input, the **Att-SVM** is

    W_mm = argmin_W ‖W‖   s.t.   (x_{iα_i} − x_{it})ᵀ W z_i ≥ 1   for all t ≠ α_i,

with ``‖·‖`` the Frobenius norm (gradient descent on ``W``) or the nuclear norm
(gradient descent on ``W = K Qᵀ``). With a *set* ``O_i`` of selected tokens
(``selected`` given as a boolean mask) it is the **Gen-SVM** of the paper's
nonlinear-head section: ``(x_{it} − x_{iτ})ᵀ W z_i = 0`` for ``t, τ ∈ O_i`` and
``(x_{it} − x_{iτ})ᵀ W z_i ≥ 1`` for ``t ∈ O_i, τ ∉ O_i``.

Solvers
-------
* ``norm="fro"``: a dedicated dual solver. Each constraint is ``⟨W, a_k⟩ ≥ 1``
  with ``a_k = (x_{iα} − x_{it}) z_iᵀ``; the dual

      max_{λ ≥ 0} 1ᵀλ − ½ λᵀKλ,   K[(i,t),(j,s)] = ((x_{iα}−x_{it})ᵀ(x_{jα}−x_{js}))·(z_iᵀz_j)

  is solved by gradient projection + preconditioned conjugate gradients on the
  faces (Moré & Toraldo's GPCG), with ``Kλ`` evaluated from the factorization
  (two batched products with the token matrices; ``d×d`` features are never
  formed; ``K`` itself is formed only when it is small). Equality constraints
  (Gen-SVM) are eliminated exactly (Schur complement on their small Gram).
  The primal is ``W = Σ_k λ_k a_k``, scaled so its smallest margin is exactly
  1 (so the returned ``W`` is always feasible), and the **relative duality gap**
  ``(P − D)/P`` of the QP ``min ½‖W‖²`` is reported and used as the stopping
  rule (``P`` = ½‖W‖² of the returned W, ``D`` = best dual value along λ).
  Before solving, tokens and queries are expressed in orthonormal bases of
  their spans, which preserves every norm and is exact.
* ``norm="nuc"``: cvxpy (optional extra ``hf-tdiag[svm]``) on the same reduced
  coordinates, Clarabel (interior point) when installed, else SCS. Feasibility
  is decided first by the Frobenius solver (the constraint set is the same).
  The duality gap is computed from the constraint multipliers cvxpy returns.

``objective`` is always the norm itself, ``‖W_mm‖_F`` or ``‖W_mm‖_*`` (not
squared, not halved); the geometric margin is ``1/objective``.

Infeasible problems (a selected token equal to another token, contradictory
selections for the same query, ...) return ``feasible=False`` with the
offending inputs (the queries carrying the infeasibility certificate
``θ ≥ 0, Σθ = 1, Σ_k θ_k a_k ≈ 0``) instead of raising inside a solver.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = [
    "AttSVMResult",
    "att_svm",
    "att_svm_self",
    "gen_svm_finite_part",
    "matrix_correlation",
    "attention_probs",
]

_NORMS = ("fro", "nuc")


# ----------------------------------------------------------------------------- result


@dataclass
class AttSVMResult:
    """Solution of one Att-SVM / Gen-SVM problem.

    Arrays indexed ``(n, T)`` follow the queries and tokens of the input. For
    self-attention problems ``query_index[k] = (b, q)`` names the sequence and
    token that query ``k`` is.
    """

    W: torch.Tensor | None  # (d, d_z) float64 solution W_mm (None when infeasible)
    objective: float  # ‖W_mm‖ in `norm` (inf when infeasible)
    norm: str
    feasible: bool
    status: str  # "optimal" | "infeasible" | "max_iter" | solver status text
    margins: torch.Tensor  # (n, T): (x_ref − x_t)ᵀ W z_i; NaN where there is no constraint
    dual: torch.Tensor  # (n, T): multipliers λ (0 where no inequality constraint)
    active: torch.Tensor  # (n, T) bool: support constraints (margin within tolerance of 1)
    constraint: torch.Tensor  # (n, T) int8: 0 none, 1 inequality ≥ 1, 2 equality = 0
    selected: torch.Tensor  # (n,) reference (selected) token of each query
    duality_gap: float  # relative duality gap (P − D)/P of min ½‖W‖² (nuclear: of min ‖W‖_*)
    iterations: int
    solve_time: float  # seconds
    solver: str
    offending: torch.Tensor | None = None  # query indices responsible for infeasibility
    certificate_residual: float | None = None  # ‖Σθ_k a_k‖ / max_k ‖a_k‖ of the infeasibility certificate
    query_index: torch.Tensor | None = None  # (n, 2) (sequence, token) for self-attention problems
    message: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def margin(self) -> float:
        """Geometric margin 1/‖W_mm‖ (0 when infeasible)."""
        return 0.0 if not self.feasible or self.objective == 0 else 1.0 / self.objective

    @property
    def num_constraints(self) -> int:
        return int((self.constraint == 1).sum())

    @property
    def num_active(self) -> int:
        return int(self.active.sum())

    def query_margins(self) -> torch.Tensor:
        """Smallest inequality margin of each query (``inf`` for a query without inequality constraints)."""
        m = torch.where(self.constraint == 1, self.margins, torch.full_like(self.margins, math.inf))
        return m.min(dim=1).values

    def correlation(self, other) -> float:
        """Cosine ``⟨W_mm, other⟩ / (‖W_mm‖_F ‖other‖_F)``."""
        if self.W is None:
            raise ValueError("correlation: the problem is infeasible, there is no W_mm")
        return matrix_correlation(self.W, other)

    def summary(self) -> dict[str, Any]:
        """JSON-friendly summary (no large arrays)."""
        out = {
            "norm": self.norm,
            "feasible": self.feasible,
            "status": self.status,
            "objective": self.objective,
            "margin": self.margin,
            "duality_gap": self.duality_gap,
            "num_queries": int(self.constraint.shape[0]),
            "num_constraints": self.num_constraints,
            "num_equalities": int((self.constraint == 2).sum()),
            "num_active": self.num_active,
            "iterations": self.iterations,
            "solve_time_s": self.solve_time,
            "solver": self.solver,
        }
        if self.offending is not None:
            out["offending"] = [int(i) for i in self.offending.tolist()]
            out["certificate_residual"] = self.certificate_residual
        if self.message:
            out["message"] = self.message
        return out


# ----------------------------------------------------------------------------- small helpers


def _to_f64(value, name: str, ndim: int | None = None, device=None) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or numpy array, got {type(value).__name__}")
    if not (value.is_floating_point() or value.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"{name}: expected a floating tensor, got dtype {value.dtype}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(value.shape)}")
    value = value.detach()
    if device is not None:
        value = value.to(device)
    value = value.to(torch.float64)
    if not torch.isfinite(value).all():
        raise ValueError(f"{name}: contains NaN or inf")
    return value


def matrix_correlation(A, B) -> float:
    """Cosine ``⟨A, B⟩ / (‖A‖_F ‖B‖_F)`` of two matrices of the same shape."""
    A = _to_f64(A, "A")
    B = _to_f64(B, "B", device=A.device)
    if A.shape != B.shape:
        raise ValueError(f"matrix_correlation: shapes differ, {tuple(A.shape)} vs {tuple(B.shape)}")
    na, nb = torch.linalg.norm(A), torch.linalg.norm(B)
    if na == 0 or nb == 0:
        raise ValueError("matrix_correlation: a matrix is zero, its direction is undefined")
    return float((A * B).sum() / (na * nb))


def attention_probs(queries: torch.Tensor, keys: torch.Tensor, key_mask: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """``softmax(q kᵀ · scale)`` over keys: ``(..., N_q, p), (..., N_k, p) → (..., N_q, N_k)``; masked keys get 0."""
    if scale is None:
        scale = queries.shape[-1] ** -0.5
    logits = torch.matmul(queries.to(torch.float64), keys.to(torch.float64).transpose(-1, -2)) * scale
    if key_mask is not None:
        logits = logits.masked_fill(~key_mask.bool().unsqueeze(-2), -math.inf)
    return torch.softmax(logits, dim=-1)


def _basis(M: torch.Tensor, rel_tol: float = 1e-13) -> torch.Tensor | None:
    """Orthonormal basis ``(k, r)`` of the row span of ``M (N, k)``, or None when the span is (nearly) everything."""
    N, k = M.shape
    if N >= 0.9 * k:
        return None
    _, s, vh = torch.linalg.svd(M, full_matrices=False)
    if s.numel() == 0 or s[0] == 0:
        return None
    r = int((s > rel_tol * s[0]).sum())
    return vh[:r].T.contiguous()


# ----------------------------------------------------------------------------- problem structure


class _Problem:
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
            XtC = torch.einsum("nt,ntd->nd", c, self.X[self.set_idx]) if self.B != self.n else torch.bmm(c.unsqueeze(1), self.X).squeeze(1)
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


def _chol_apply(L: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(L Lᵀ)⁻¹ b`` for batched factors ``L (n, T, T)`` and ``b (n, T)`` (two triangular solves)."""
    y = torch.linalg.solve_triangular(L, b.unsqueeze(2), upper=False)
    return torch.linalg.solve_triangular(L.mT, y, upper=True).squeeze(2)


class _ReducedKernel:
    """``K' = K_II − K_IE K_EE⁺ K_EI`` (equalities eliminated) as a matvec on the flat inequality vector."""

    def __init__(self, prob: _Problem, dense_limit: int = 3000, dense_flops: float = 2e9):
        self.prob = prob
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

    face_flops = 2e9

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
        if self.dense:
            return self.K @ v
        c = v.new_zeros(self.prob.n * self.prob.T)
        c[self.prob.ineq_idx] = v
        out = self.prob.apply_K(c.view(self.prob.n, self.prob.T)).reshape(-1)[self.prob.ineq_idx]
        if self.L is not None:
            out = out - self.L @ (self.L.T @ v)
        return out


# ----------------------------------------------------------------------------- the QP solver


def _rel_gap(lam: torch.Tensor, Klam: torch.Tensor) -> float:
    """Relative duality gap of min ½‖W‖² for W = Σλa scaled to unit smallest margin."""
    smin = float(Klam.min())
    quad = float(lam @ Klam)
    if smin <= 0 or quad <= 0:
        return 1.0
    ratio = float(lam.sum()) * smin / quad  # sqrt(D/P)
    return max(0.0, 1.0 - ratio * ratio)


def _pcg(apply, rhs: torch.Tensor, prec: torch.Tensor, rtol: float, maxit: int) -> torch.Tensor:
    """Preconditioned CG for ``apply(x) = rhs`` (stops early on non-positive curvature)."""
    precond = prec if callable(prec) else (lambda v: v * prec)
    x = torch.zeros_like(rhs)
    r = rhs.clone()
    z = precond(r)
    p = z.clone()
    rz = float(r @ z)
    stop = rtol * float(torch.linalg.norm(rhs))
    for _ in range(maxit):
        Ap = apply(p)
        pAp = float(p @ Ap)
        if pAp <= 0:
            break
        a = rz / pAp
        x = x + a * p
        r = r - a * Ap
        if float(torch.linalg.norm(r)) <= stop:
            break
        z = precond(r)
        rz_new = float(r @ z)
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x


def _dense_face_solve(KFF: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """Solve ``(K_FF + 11ᵀ) x = rhs`` by Cholesky (tiny jitter if singular) + one refinement step."""
    M = KFF + 1.0
    scale = float(torch.diagonal(M).max())
    jitter = 1e-13 * scale
    for _ in range(8):
        Mj = M.clone()
        Mj.diagonal().add_(jitter)
        L, info = torch.linalg.cholesky_ex(Mj)
        if int(info) == 0:
            break
        jitter *= 100.0
    x = torch.cholesky_solve(rhs.unsqueeze(1), L).squeeze(1)
    res = rhs - M @ x
    return x + torch.cholesky_solve(res.unsqueeze(1), L).squeeze(1)


def _face_solve(op, idx: torch.Tensor, rhs: torch.Tensor, prec: torch.Tensor, rtol: float) -> torch.Tensor:
    """Solve ``(K + 11ᵀ)_FF x = rhs`` on the free set ``F = idx``."""
    if op.K is not None:
        return _dense_face_solve(op.K[idx.unsqueeze(1), idx], rhs)
    m = prec.numel()
    dims = op.prob.X.shape[2] + op.prob.Z.shape[1]
    if idx.numel() ** 2 * dims <= op.face_flops:  # small face: form K_FF from the factorization, solve directly
        return _dense_face_solve(op.face_kernel(idx), rhs)

    def apply(v):
        full = torch.zeros(m, dtype=v.dtype, device=v.device)
        full[idx] = v
        return op(full)[idx] + float(v.sum())

    prob = op.prob
    precond = prec[idx]
    if prob.query_blocks() is not None:
        grid_idx = prob.ineq_idx[idx]
        free = torch.zeros(prob.n * prob.T, dtype=torch.bool, device=rhs.device)
        free[grid_idx] = True
        L = prob.block_factor(free.view(prob.n, prob.T))

        def precond(v):
            grid = torch.zeros(prob.n * prob.T, dtype=v.dtype, device=v.device)
            grid[grid_idx] = v
            return _chol_apply(L, grid.view(prob.n, prob.T)).reshape(-1)[grid_idx]

    return _pcg(apply, rhs, precond, rtol=rtol, maxit=2000)


def _support_guess(prob: "_Problem", op) -> torch.Tensor:
    """Free-set guess: the supports of the per-query SVMs (the diagonal blocks of K), by batched active-set steps."""
    m = op.diag.numel()
    everything = torch.ones(m, dtype=torch.bool, device=op.diag.device)
    if m <= 1000 or prob.query_blocks() is None:
        return everything
    G = prob.query_blocks()
    mask = prob.kind == 1
    free = mask.clone()
    for _ in range(12):
        L = prob.block_factor(free)
        x = _chol_apply(L, free.to(G.dtype))
        mu = torch.bmm(G, x.unsqueeze(2)).squeeze(2) - 1.0
        new_free = (free & (x > 0)) | (mask & ~free & (mu < 0))
        if torch.equal(new_free, free):
            break
        free = new_free
    guess = free.reshape(-1)[prob.ineq_idx]
    return guess if bool(guess.any()) else everything


def _certificate_lp(prob: "_Problem") -> torch.Tensor | None:
    """Gordan certificate by linear programming: θ ≥ 0, Σθ = 1, Σ_k θ_k a_k + Σ_j β_j e_j = 0.

    Returns θ (over the inequality constraints) when it exists — the SVM is then
    infeasible — and None when the LP is infeasible (the SVM is feasible).
    """
    from scipy.optimize import linprog

    I, E = prob.ineq_idx, prob.eq_idx
    DI, ZI = prob.deltas(I)
    dx, dz = prob.X.shape[2], prob.Z.shape[1]
    AI = (DI.unsqueeze(2) * ZI.unsqueeze(1)).reshape(I.numel(), dx * dz).cpu().numpy()
    scale = np.abs(AI).max()
    cols = [AI.T / scale]
    ne = 0
    if E.numel():
        DE, ZE = prob.deltas(E)
        AE = (DE.unsqueeze(2) * ZE.unsqueeze(1)).reshape(E.numel(), dx * dz).cpu().numpy()
        cols.append(AE.T / scale)
        ne = E.numel()
    A_eq = np.hstack(cols)
    row = np.concatenate([np.ones(I.numel()), np.zeros(ne)])
    A_eq = np.vstack([A_eq, row])
    b_eq = np.zeros(A_eq.shape[0])
    b_eq[-1] = 1.0
    bounds = [(0, None)] * I.numel() + [(None, None)] * ne
    res = linprog(np.zeros(A_eq.shape[1]), A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if res.status == 0:
        return torch.as_tensor(res.x[: I.numel()], dtype=torch.float64, device=prob.X.device).clamp_min(0)
    return None


def _pdas(op, tol: float, max_iter: int, feas_tol: float, free: torch.Tensor):
    """Primal-dual active-set (semismooth Newton) iterations for ``min_{u≥0} ½uᵀ(K+11ᵀ)u − 1ᵀu``.

    Each step solves the equality-constrained problem on the free set exactly and
    moves every sign violation at once (Hintermüller, Ito & Kunisch 2003). It is
    not globally convergent for a general PSD matrix, so the best projected iterate
    is kept and the caller finishes with projected Newton when it stalls or cycles.
    """
    m = op.diag.numel()
    prec = 1.0 / (op.diag + 1.0)
    best = None
    seen = set()
    stall = 0
    amax = math.sqrt(float(op.diag.max()))
    for it in range(1, max_iter + 1):
        idx = torch.nonzero(free).squeeze(1)
        x = torch.zeros(m, dtype=op.diag.dtype, device=op.diag.device)
        if idx.numel():
            x[idx] = _face_solve(op, idx, torch.ones(idx.numel(), dtype=x.dtype, device=x.device), prec, rtol=1e-12)
        Kx = op(x)
        mu = Kx + (float(x.sum()) - 1.0)
        up = x.clamp_min(0)
        Kup = Kx if bool((x >= 0).all()) else op(up)
        su = float(up.sum())
        f = 0.5 * (float(up @ Kup) + su * su) - su
        if best is None or f < best[0] - 1e-15 * abs(best[0]):
            best, stall = (f, up, Kup), 0
        else:
            stall += 1
        if su > 0:
            if math.sqrt(max(float(up @ Kup), 0.0)) <= feas_tol * amax * su:
                return up, Kup, "infeasible", it
            if _rel_gap(up, Kup) <= tol:
                return up, Kup, "optimal", it
        new_free = (free & (x > 0)) | (~free & (mu < 0))
        key = hash(new_free.cpu().numpy().tobytes())
        if stall >= 3 or key in seen or torch.equal(new_free, free):
            break
        seen.add(key)
        free = new_free
    return best[1], best[2], "continue", it


def _projected_newton(
    op, tol: float, max_iter: int, feas_tol: float, progress: bool = False, start=None
) -> tuple[torch.Tensor, torch.Tensor, str, int, float]:
    """``min_{u ≥ 0} ½uᵀ(K + 11ᵀ)u − 1ᵀu`` by Bertsekas' projected Newton method.

    This is the least-distance-programming form of the dual (Lawson & Hanson ch. 23):
    it is bounded even when the SVM is infeasible; ``λ = u / (1 − 1ᵀu)`` solves
    ``max_{λ≥0} 1ᵀλ − ½λᵀKλ``, and ``θ = u/1ᵀu`` gives the min-norm point ``Σθ_k a_k``
    of the convex hull of the constraint features, whose norm is the margin.
    Newton systems on the free set are solved by Cholesky when ``K`` is formed,
    otherwise by Jacobi-preconditioned CG (inexact Newton).
    """
    diag = op.diag
    m = diag.numel()
    Mdiag = diag + 1.0
    prec = 1.0 / Mdiag
    amax = math.sqrt(float(diag.max()))
    if start is None:
        u = torch.zeros(m, dtype=diag.dtype, device=diag.device)
        Ku = torch.zeros_like(u)
    else:
        u, Ku = start
    su = float(u.sum())
    f = 0.5 * (float(u @ Ku) + su * su) - su
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=max_iter, desc="Att-SVM (projected Newton)", leave=False)
    status, it, gap = "max_iter", 0, 1.0
    try:
        for it in range(1, max_iter + 1):
            g = Ku + (su - 1.0)
            if su > 0:
                uKu = max(float(u @ Ku), 0.0)
                if math.sqrt(uKu) <= feas_tol * amax * su:
                    status = "infeasible"
                    break
                gap = _rel_gap(u, Ku)
                if gap <= tol:
                    status = "optimal"
                    break
            if bar is not None:
                bar.update(1)
                bar.set_postfix(gap=f"{gap:.1e}", free=int((u > 0).sum()))
            w = float((u - (u - g).clamp_min(0)).abs().max())
            if w == 0.0:
                gap = _rel_gap(u, Ku)
                status = "optimal" if gap <= max(tol, 1e-8) else "stalled"
                break
            eps = min(w, 1e-2 * max(float(u.max()), 1e-300))
            A = (u <= eps) & (g > 0)
            F = ~A
            d = torch.where(A, -g / Mdiag, torch.zeros_like(g))
            idx = torch.nonzero(F).squeeze(1)
            accepted = False
            for rtol in (min(0.1, gap**0.5) * 0.1, 1e-12):
                d = torch.where(A, -g / Mdiag, torch.zeros_like(g))
                if idx.numel():
                    rhs = -g[idx]
                    dF = _face_solve(op, idx, rhs, prec, rtol=max(rtol, 1e-12))
                    if float(rhs @ dF) <= 0:  # not a descent direction (inexact solve): scaled gradient
                        dF = rhs * prec[idx]
                    d[idx] = dF
                gFd = float(g[F] @ d[F])
                alpha = 1.0
                for _ls in range(30):
                    un = (u + alpha * d).clamp_min(0)
                    step = un - u
                    Ks = op(step)
                    ss = float(step.sum())
                    df = float(g @ step) + 0.5 * (float(step @ Ks) + ss * ss)
                    armijo = 1e-4 * (-alpha * gFd + float(g[A] @ (u[A] - un[A])))
                    if -df >= armijo and df < 0:
                        u, su, f = un, su + ss, f + df
                        Ku = Ku + Ks if it % 10 else op(u)  # refresh Ku now and then against drift
                        accepted = True
                        break
                    alpha *= 0.25
                if accepted or op.K is not None:
                    break
            if not accepted:
                gap = _rel_gap(u, Ku)
                status = "optimal" if gap <= max(tol, 1e-8) else "stalled"
                break
    finally:
        if bar is not None:
            bar.close()
    return u, Ku, status, it, gap


# ----------------------------------------------------------------------------- input handling


def _check_norm(norm: str) -> str:
    if norm not in _NORMS:
        raise ValueError(f"norm: expected one of {_NORMS}, got {norm!r}")
    return norm


def _selection(selected, n: int, T: int, valid: torch.Tensor, name: str = "selected"):
    """Return (ref (n,), kind (n, T) int8) from indices or a boolean selected-set mask."""
    device = valid.device
    if isinstance(selected, np.ndarray):
        selected = torch.from_numpy(selected)
    if not isinstance(selected, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor of token indices (n,) or a boolean mask (n, T), got {type(selected).__name__}")
    selected = selected.to(device)
    kind = torch.zeros(n, T, dtype=torch.int8, device=device)
    if selected.dtype == torch.bool:
        if tuple(selected.shape) != (n, T):
            raise ValueError(f"{name}: a boolean selected-set mask must have shape {(n, T)}, got {tuple(selected.shape)}")
        if (selected & ~valid).any():
            raise ValueError(f"{name}: selects tokens that token_mask marks as padding")
        counts = selected.sum(1)
        if (counts == 0).any():
            bad = torch.nonzero(counts == 0).squeeze(1)[:5].tolist()
            raise ValueError(f"{name}: every query needs at least one selected token; queries {bad} have none")
        ref = selected.to(torch.int8).argmax(1)
        kind[selected] = 2
        kind[valid & ~selected] = 1
        kind[torch.arange(n, device=device), ref] = 0
        return ref, kind
    if selected.is_floating_point() or selected.dtype == torch.complex64:
        raise TypeError(f"{name}: expected integer token indices or a boolean mask, got dtype {selected.dtype}")
    if tuple(selected.shape) != (n,):
        raise ValueError(f"{name}: expected token indices of shape {(n,)}, got {tuple(selected.shape)}")
    ref = selected.long()
    if (ref < 0).any() or (ref >= T).any():
        raise ValueError(f"{name}: token indices must lie in [0, {T}), got range [{int(ref.min())}, {int(ref.max())}]")
    if not valid[torch.arange(n, device=device), ref].all():
        raise ValueError(f"{name}: selects tokens that token_mask marks as padding")
    kind[valid] = 1
    kind[torch.arange(n, device=device), ref] = 0
    return ref, kind


def _valid_mask(token_mask, shape, device, name="token_mask") -> torch.Tensor:
    if token_mask is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    if isinstance(token_mask, np.ndarray):
        token_mask = torch.from_numpy(token_mask)
    if not isinstance(token_mask, torch.Tensor):
        raise TypeError(f"{name}: expected a boolean tensor of shape {tuple(shape)}, got {type(token_mask).__name__}")
    if tuple(token_mask.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(token_mask.shape)}")
    return token_mask.to(device).bool()


# ----------------------------------------------------------------------------- public solvers


def att_svm(
    X,
    z,
    selected,
    norm: str = "fro",
    *,
    token_mask=None,
    tol: float = 1e-10,
    max_iter: int = 2000,
    feas_tol: float = 1e-7,
    progress: bool = False,
) -> AttSVMResult:
    """``W_mm = argmin ‖W‖ s.t. (x_{iα_i} − x_{it})ᵀ W z_i ≥ 1 ∀ t ≠ α_i`` for ``X (n,T,d)``, ``z (n,d_z)``.

    ``selected``: token indices ``(n,)`` (Att-SVM) or a boolean selected-set mask
    ``(n, T)`` (Gen-SVM). ``token_mask (n, T)`` marks real (non-padding) tokens.
    ``tol``: relative duality gap at which the Frobenius solver stops.
    ``feas_tol``: a margin below ``feas_tol · max_k ‖a_k‖`` counts as infeasible.
    """
    X = _to_f64(X, "X", 3)
    z = _to_f64(z, "z", 2, device=X.device)
    n, T, _ = X.shape
    if z.shape[0] != n:
        raise ValueError(f"z: expected {n} queries (one per input of X), got {z.shape[0]}")
    if T < 2:
        raise ValueError(f"X: expected at least 2 tokens per input, got T={T}")
    valid = _valid_mask(token_mask, (n, T), X.device)
    ref, kind = _selection(selected, n, T, valid)
    set_idx = torch.arange(n, device=X.device)
    return _solve(X, z, set_idx, ref, kind, _check_norm(norm), tol, max_iter, feas_tol, progress)


def att_svm_self(
    X,
    selected,
    norm: str = "fro",
    *,
    query_mask=None,
    token_mask=None,
    queries=None,
    tol: float = 1e-10,
    max_iter: int = 2000,
    feas_tol: float = 1e-7,
    progress: bool = False,
) -> AttSVMResult:
    """Self-attention Att-SVM: the queries are the tokens ``x_{bq}`` of ``X (B, T, d)`` themselves.

    Query ``(b, q)`` has its own constraint set ``(x_{b α_{bq}} − x_{bt})ᵀ W x_{bq} ≥ 1``.
    ``selected``: ``(B, T)`` token index per query token, or ``(B, T, T)`` boolean sets.
    ``query_mask (B, T)``: which tokens act as queries (default: all real tokens).
    ``queries``: optional ``(B, T, d_z)`` query vectors to use instead of ``X`` (e.g. ``[x, 1]``
    to model a key bias); the constraint sets are still the tokens of ``X``.
    Result arrays are indexed by query, ``result.query_index[k] = (b, q)``.
    """
    X = _to_f64(X, "X", 3)
    B, T, _ = X.shape
    if T < 2:
        raise ValueError(f"X: expected at least 2 tokens per sequence, got T={T}")
    valid = _valid_mask(token_mask, (B, T), X.device)
    qmask = valid.clone() if query_mask is None else _valid_mask(query_mask, (B, T), X.device, "query_mask") & valid
    qidx = torch.nonzero(qmask)
    if qidx.shape[0] == 0:
        raise ValueError("query_mask: no query tokens selected")
    Q = X if queries is None else _to_f64(queries, "queries", 3, device=X.device)
    if Q.shape[:2] != X.shape[:2]:
        raise ValueError(f"queries: expected shape ({B}, {T}, d_z), got {tuple(Q.shape)}")
    if isinstance(selected, np.ndarray):
        selected = torch.from_numpy(selected)
    if not isinstance(selected, torch.Tensor):
        raise TypeError(f"selected: expected a tensor (B, T) of indices or (B, T, T) mask, got {type(selected).__name__}")
    selected = selected.to(X.device)
    if selected.dtype == torch.bool:
        if tuple(selected.shape) != (B, T, T):
            raise ValueError(f"selected: a boolean mask must have shape {(B, T, T)}, got {tuple(selected.shape)}")
    elif tuple(selected.shape) != (B, T):
        raise ValueError(f"selected: expected token indices of shape {(B, T)}, got {tuple(selected.shape)}")
    sel_q = selected[qidx[:, 0], qidx[:, 1]]
    n = qidx.shape[0]
    ref, kind = _selection(sel_q, n, T, valid[qidx[:, 0]])
    z = Q[qidx[:, 0], qidx[:, 1]]
    res = _solve(X, z, qidx[:, 0].contiguous(), ref, kind, _check_norm(norm), tol, max_iter, feas_tol, progress)
    res.query_index = qidx
    return res


def _reduce(X: torch.Tensor, Z: torch.Tensor, kind: torch.Tensor, set_idx: torch.Tensor):
    """Express tokens and queries in orthonormal bases of their spans (exact; preserves every norm)."""
    used_sets = torch.unique(set_idx)
    tokens = X[used_sets].reshape(-1, X.shape[2])
    P = _basis(tokens)
    S = _basis(Z)
    Xr = X if P is None else X @ P
    Zr = Z if S is None else Z @ S
    return Xr, Zr, P, S


def _empty_result(n, T, kind, ref, norm, device, **kw) -> AttSVMResult:
    nan = torch.full((n, T), math.nan, dtype=torch.float64, device=device)
    base = dict(
        W=None,
        objective=math.inf,
        norm=norm,
        feasible=False,
        status="infeasible",
        margins=nan,
        dual=torch.zeros(n, T, dtype=torch.float64, device=device),
        active=torch.zeros(n, T, dtype=torch.bool, device=device),
        constraint=kind,
        selected=ref,
        duality_gap=math.nan,
        iterations=0,
        solve_time=0.0,
        solver="gpcg",
    )
    base.update(kw)
    return AttSVMResult(**base)


def _solve(X, Z, set_idx, ref, kind, norm, tol, max_iter, feas_tol, progress, lp_check: bool = True) -> AttSVMResult:
    t0 = time.perf_counter()
    n, T = kind.shape
    device = X.device
    if not (kind == 1).any():
        raise ValueError("selected: there is no inequality constraint (every token of every query is selected)")
    Xr, Zr, P, S = _reduce(X, Z, kind, set_idx)
    prob = _Problem(Xr, Zr, set_idx, ref, kind)
    op = _ReducedKernel(prob)
    feat_scale = float((X * X).sum(-1).max()) * 4.0 * float((Z * Z).sum(-1).max())
    # a constraint whose feature is 0 (after eliminating equalities) can never reach margin 1
    zero = op.diag <= 1e-20 * max(feat_scale, 1e-300)
    if zero.any():
        flat = prob.ineq_idx[zero]
        offending = torch.unique(flat // T)
        return _empty_result(
            n, T, kind, ref, norm, device,
            offending=offending,
            certificate_residual=0.0,
            solve_time=time.perf_counter() - t0,
            message=(
                f"{int(zero.sum())} constraint(s) have a zero feature: the selected token equals another token "
                f"(or the query is zero / the token is tied to the selected set by equalities) in queries {offending[:10].tolist()}"
            ),
        )
    max_feat = float(op.diag.max())
    lam, Klam, status, iters = _pdas(op, tol, min(max_iter, 50), feas_tol, _support_guess(prob, op))
    dims = prob.X.shape[2] * prob.Z.shape[1]
    if status == "continue" and lp_check and op.m * dims <= 2e6:
        # PDAS did not settle (degenerate or nearly infeasible problem): decide feasibility exactly by LP
        theta = _certificate_lp(prob)
        if theta is not None:
            lam, Klam, status = theta, op(theta), "infeasible"
    if status == "continue":
        lam, Klam, status, more, _ = _projected_newton(op, tol, max_iter, feas_tol, progress, start=(lam, Klam))
        iters += more
    smin = float(Klam.min()) if lam.sum() > 0 else 0.0
    if status == "infeasible" or smin <= 0:
        su = float(lam.sum())
        theta = lam / su if su > 0 else torch.full_like(lam, 1.0 / lam.numel())
        resid = math.sqrt(max(float(theta @ op(theta)), 0.0) / max_feat)
        mass = torch.zeros(n * T, dtype=torch.float64, device=device)
        mass[prob.ineq_idx] = theta
        mass = mass.view(n, T).sum(1)
        offending = torch.nonzero(mass > 1e-6 * float(mass.max())).squeeze(1)
        if status != "infeasible":
            msg = f"the solver stopped ({status}) before finding a feasible W; feasibility is undetermined"
            offending = None
        else:
            msg = (
                f"no W reaches margin 1: the margin is below feas_tol={feas_tol:g} times the largest feature norm; "
                "θ ≥ 0, Σθ = 1 with ‖Σθ_k a_k‖ ≈ 0 is supported on the offending queries"
            )
        return _empty_result(
            n, T, kind, ref, norm, device,
            status=status,
            offending=offending,
            certificate_residual=resid,
            iterations=iters,
            solve_time=time.perf_counter() - t0,
            message=msg,
        )
    coef = op.full_coef(lam) / smin
    Wr = prob.W_reduced(coef)
    margins = prob.apply_K(coef)
    W = Wr
    if P is not None:
        W = P @ W
    if S is not None:
        W = W @ S.T
    margins = torch.where(kind == 0, torch.full_like(margins, math.nan), margins)
    dual = torch.zeros(n * T, dtype=torch.float64, device=device)
    dual[prob.ineq_idx] = lam / smin
    dual = dual.view(n, T)
    active = (kind == 1) & (margins <= 1.0 + 1e-7)  # tight constraints: the support tokens
    fro = float(torch.linalg.norm(W))
    result = AttSVMResult(
        W=W,
        objective=fro,
        norm="fro",
        feasible=True,
        status=status,
        margins=margins,
        dual=dual,
        active=active,
        constraint=kind,
        selected=ref,
        duality_gap=_rel_gap(lam, Klam),
        iterations=iters,
        solve_time=time.perf_counter() - t0,
        solver="projected-newton" + ("-dense" if op.dense else "-factored"),
    )
    if norm == "nuc":
        result = _solve_nuclear(prob, P, S, result, t0)
    return result


# ----------------------------------------------------------------------------- nuclear norm (cvxpy)


def _import_cvxpy():
    try:
        import cvxpy as cp
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "att_svm(norm='nuc') needs cvxpy: install the optional extra with `pip install hf-tdiag[svm]`"
        ) from err
    return cp


def _solve_nuclear(prob: _Problem, P, S, fro: AttSVMResult, t0: float) -> AttSVMResult:
    cp = _import_cvxpy()
    I, E = prob.ineq_idx, prob.eq_idx
    DI, ZI = prob.deltas(I)
    dx, dz = prob.X.shape[2], prob.Z.shape[1]
    # row k of A is vec_F(δ_k z_kᵀ) = kron(z_k, δ_k)
    AI = (ZI.unsqueeze(2) * DI.unsqueeze(1)).reshape(I.numel(), dx * dz).cpu().numpy()
    Wv = cp.Variable((dx, dz))
    w = cp.vec(Wv, order="F")
    cons = [AI @ w >= 1]
    AE = None
    if E.numel():
        DE, ZE = prob.deltas(E)
        AE = (ZE.unsqueeze(2) * DE.unsqueeze(1)).reshape(E.numel(), dx * dz).cpu().numpy()
        cons.append(AE @ w == 0)
    problem = cp.Problem(cp.Minimize(cp.normNuc(Wv)), cons)
    solvers = cp.installed_solvers()
    solver = "CLARABEL" if "CLARABEL" in solvers else "SCS"
    try:
        problem.solve(solver=solver)
    except cp.error.SolverError as err:
        fro.status = f"nuclear solver failed: {err}"
        fro.message = "the Frobenius solution is returned; the nuclear-norm solve failed"
        return fro
    if Wv.value is None or problem.status not in ("optimal", "optimal_inaccurate"):
        fro.status = f"nuclear solver status {problem.status}"
        fro.message = "the Frobenius solution is returned; the nuclear-norm solve did not finish"
        return fro
    Wr = torch.as_tensor(np.asarray(Wv.value), dtype=torch.float64, device=prob.X.device)
    wflat = Wr.T.reshape(-1).cpu().numpy()  # vec_F
    marg_I = AI @ wflat
    smin = float(marg_I.min())
    Wr = Wr / smin
    lam = np.maximum(np.asarray(cons[0].dual_value, dtype=np.float64).reshape(-1), 0.0)
    # dual bound: 1ᵀλ / ‖Σλ_k a_k + Σβ_j e_j‖_op for any β (try both sign conventions of the equality duals)
    G = AI.T @ lam
    candidates = [G]
    if AE is not None and cons[1].dual_value is not None:
        beta = np.asarray(cons[1].dual_value, dtype=np.float64).reshape(-1)
        candidates += [G + AE.T @ beta, G - AE.T @ beta]
    op_norm = min(np.linalg.norm(c.reshape(dz, dx).T, 2) for c in candidates)
    primal = float(torch.linalg.matrix_norm(Wr, ord="nuc"))
    dual_val = float(lam.sum()) / op_norm if op_norm > 0 else 0.0
    gap = max(0.0, (primal - dual_val) / primal) if primal > 0 else math.nan
    W = Wr
    if P is not None:
        W = P @ W
    if S is not None:
        W = W @ S.T
    coef_margins = torch.full((prob.n * prob.T,), math.nan, dtype=torch.float64, device=prob.X.device)
    coef_margins[I] = torch.as_tensor(marg_I / smin, device=prob.X.device)
    if E.numel():
        coef_margins[E] = torch.as_tensor(AE @ wflat / smin, device=prob.X.device)
    margins = coef_margins.view(prob.n, prob.T)
    dual = torch.zeros(prob.n * prob.T, dtype=torch.float64, device=prob.X.device)
    dual[I] = torch.as_tensor(lam, device=prob.X.device)
    dual = dual.view(prob.n, prob.T)
    return AttSVMResult(
        W=W,
        objective=primal,
        norm="nuc",
        feasible=True,
        status=problem.status,
        margins=margins,
        dual=dual,
        active=(prob.kind == 1) & (margins <= 1.0 + 1e-5),
        constraint=prob.kind,
        selected=prob.ref,
        duality_gap=gap,
        iterations=int(problem.solver_stats.num_iters or 0),
        solve_time=time.perf_counter() - t0,
        solver=f"cvxpy-{solver.lower()}",
        extra={"fro_objective": fro.objective},
    )


# ----------------------------------------------------------------------------- Gen-SVM finite part


def gen_svm_finite_part(X, z, selected_mask, log_probs) -> torch.Tensor:
    """``W_fin``: min-norm W in ``S_fin = span{(x_{it}−x_{iτ}) z_iᵀ : t, τ ∈ O_i}`` with
    ``(x_{iτ} − x_{it})ᵀ W z_i = log s_{iτ} − log s_{it}`` for ``t, τ ∈ O_i`` (the softmax log-ratios)."""
    X = _to_f64(X, "X", 3)
    z = _to_f64(z, "z", 2, device=X.device)
    log_probs = _to_f64(log_probs, "log_probs", 2, device=X.device)
    n, T, _ = X.shape
    if tuple(log_probs.shape) != (n, T):
        raise ValueError(f"log_probs: expected shape {(n, T)}, got {tuple(log_probs.shape)}")
    if z.shape[0] != n:
        raise ValueError(f"z: expected {n} queries, got {z.shape[0]}")
    valid = torch.ones(n, T, dtype=torch.bool, device=X.device)
    ref, kind = _selection(selected_mask, n, T, valid, "selected_mask")
    if not (kind == 2).any():
        return torch.zeros(X.shape[2], z.shape[1], dtype=torch.float64, device=X.device)
    prob = _Problem(X, z, torch.arange(n, device=X.device), ref, kind)
    E = prob.eq_idx
    i, t = E // T, E % T
    rhs = log_probs[i, ref[i]] - log_probs[i, t]
    KEE = prob.kernel_block(E, E)
    beta = torch.linalg.pinv(KEE, rtol=1e-12, hermitian=True) @ rhs
    c = torch.zeros(n * T, dtype=torch.float64, device=X.device)
    c[E] = beta
    return prob.W_reduced(c.view(n, T))
