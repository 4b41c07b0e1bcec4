"""Solvers of the Frobenius Att-SVM dual in its least-distance form ``min_{u≥0} ½uᵀ(K'+11ᵀ)u − 1ᵀu``.

This form (Lawson & Hanson ch. 23) is bounded even when the SVM is infeasible; ``λ = u / (1 − 1ᵀu)``
solves ``max_{λ≥0} 1ᵀλ − ½λᵀK'λ``, and ``θ = u/1ᵀu`` gives the min-norm point ``Σθ_k a_k`` of the
convex hull of the constraint features, whose norm is the margin. Primal-dual active-set steps from a
per-query support guess (:func:`pdas`, :func:`support_guess`) usually settle it; :func:`projected_newton`
(Bertsekas) finishes otherwise. Face systems ``(K'+11ᵀ)_FF x = b`` are solved by Cholesky when small
or formed, else by block-Jacobi-preconditioned CG (:func:`face_solve`). ``rel_gap`` is the relative
duality gap ``(P − D)/P`` of ``min ½‖W‖²`` used as the stopping rule.
"""

from __future__ import annotations

import math

import torch

from .kernel import ReducedKernel
from .problem import Problem, chol_apply

__all__ = ["rel_gap", "pcg", "face_solve", "support_guess", "pdas", "projected_newton", "solver_name"]


def solver_name(op: ReducedKernel) -> str:
    """The name a result reports for the dual solve over ``op`` (active set, then projected Newton)."""
    return "projected-newton" + ("-dense" if op.dense else "-factored")


def rel_gap(lam: torch.Tensor, Klam: torch.Tensor) -> float:
    """Relative duality gap of min ½‖W‖² for W = Σλa scaled to unit smallest margin."""
    smin = float(Klam.min())
    quad = float(lam @ Klam)
    if smin <= 0 or quad <= 0:
        return 1.0
    ratio = float(lam.sum()) * smin / quad  # sqrt(D/P)
    return max(0.0, 1.0 - ratio * ratio)


def pcg(apply, rhs: torch.Tensor, prec: torch.Tensor, rtol: float, maxit: int) -> torch.Tensor:
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


def face_solve(
    op: ReducedKernel, idx: torch.Tensor, rhs: torch.Tensor, prec: torch.Tensor, rtol: float
) -> torch.Tensor:
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
            return chol_apply(L, grid.view(prob.n, prob.T)).reshape(-1)[grid_idx]

    return pcg(apply, rhs, precond, rtol=rtol, maxit=2000)


def support_guess(prob: Problem, op: ReducedKernel) -> torch.Tensor:
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
        x = chol_apply(L, free.to(G.dtype))
        mu = torch.bmm(G, x.unsqueeze(2)).squeeze(2) - 1.0
        new_free = (free & (x > 0)) | (mask & ~free & (mu < 0))
        if torch.equal(new_free, free):
            break
        free = new_free
    guess = free.reshape(-1)[prob.ineq_idx]
    return guess if bool(guess.any()) else everything


def pdas(op: ReducedKernel, tol: float, max_iter: int, feas_tol: float, free: torch.Tensor):
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
            x[idx] = face_solve(op, idx, torch.ones(idx.numel(), dtype=x.dtype, device=x.device), prec, rtol=1e-12)
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
            if rel_gap(up, Kup) <= tol:
                return up, Kup, "optimal", it
        new_free = (free & (x > 0)) | (~free & (mu < 0))
        key = hash(new_free.cpu().numpy().tobytes())
        if stall >= 3 or key in seen or torch.equal(new_free, free):
            break
        seen.add(key)
        free = new_free
    return best[1], best[2], "continue", it


def _stop_status(u: torch.Tensor, Ku: torch.Tensor, su: float, tol: float, feas_tol: float, amax: float):
    """``("infeasible" | "optimal" | None, gap)``: the stopping tests of the least-distance iterate ``u``."""
    if su <= 0:
        return None, 1.0
    if math.sqrt(max(float(u @ Ku), 0.0)) <= feas_tol * amax * su:
        return "infeasible", 1.0
    gap = rel_gap(u, Ku)
    return ("optimal" if gap <= tol else None), gap


def _newton_direction(op, g, A, idx, prec, Mdiag, rtol: float) -> torch.Tensor:
    """Projected-Newton direction: scaled gradient on the active set ``A``, Newton step on the free set ``idx``."""
    d = torch.where(A, -g / Mdiag, torch.zeros_like(g))
    if idx.numel():
        rhs = -g[idx]
        dF = face_solve(op, idx, rhs, prec, rtol=max(rtol, 1e-12))
        if float(rhs @ dF) <= 0:  # not a descent direction (inexact solve): scaled gradient
            dF = rhs * prec[idx]
        d[idx] = dF
    return d


def _armijo_step(op, u, g, d, A, F):
    """Projected Armijo search along ``d``: ``(u_new, K·step, 1ᵀstep)`` of the accepted step, or None."""
    gFd = float(g[F] @ d[F])
    alpha = 1.0
    for _ in range(30):
        un = (u + alpha * d).clamp_min(0)
        step = un - u
        Ks = op(step)
        ss = float(step.sum())
        df = float(g @ step) + 0.5 * (float(step @ Ks) + ss * ss)
        armijo = 1e-4 * (-alpha * gFd + float(g[A] @ (u[A] - un[A])))
        if -df >= armijo and df < 0:
            return un, Ks, ss
        alpha *= 0.25
    return None


def projected_newton(
    op: ReducedKernel, tol: float, max_iter: int, feas_tol: float, progress: bool = False, start=None
) -> tuple[torch.Tensor, torch.Tensor, str, int, float]:
    """``min_{u ≥ 0} ½uᵀ(K + 11ᵀ)u − 1ᵀu`` by Bertsekas' projected Newton method; ``(u, Ku, status, iterations, gap)``.

    Newton systems on the free set are solved by Cholesky when ``K`` is formed,
    otherwise by preconditioned CG (inexact Newton: a loose solve first, a tight one if it fails).
    """
    diag = op.diag
    Mdiag = diag + 1.0
    prec = 1.0 / Mdiag
    amax = math.sqrt(float(diag.max()))
    u, Ku = (torch.zeros_like(diag), torch.zeros_like(diag)) if start is None else start
    su = float(u.sum())
    bar = None
    if progress:
        from ..._progress import tqdm

        bar = tqdm(total=max_iter, desc="Att-SVM (projected Newton)", leave=False)
    status, it, gap = "max_iter", 0, 1.0
    try:
        for it in range(1, max_iter + 1):
            g = Ku + (su - 1.0)
            stop, gap_now = _stop_status(u, Ku, su, tol, feas_tol, amax)
            gap = gap_now if su > 0 and stop != "infeasible" else gap
            if stop is not None:
                status = stop
                break
            if bar is not None:
                bar.update(1)
                bar.set_postfix(gap=f"{gap:.1e}", free=int((u > 0).sum()))
            w = float((u - (u - g).clamp_min(0)).abs().max())
            if w == 0.0:
                gap = rel_gap(u, Ku)
                status = "optimal" if gap <= max(tol, 1e-8) else "stalled"
                break
            eps = min(w, 1e-2 * max(float(u.max()), 1e-300))
            A = (u <= eps) & (g > 0)
            F = ~A
            idx = torch.nonzero(F).squeeze(1)
            found = None
            for rtol in (min(0.1, gap**0.5) * 0.1, 1e-12):
                found = _armijo_step(op, u, g, _newton_direction(op, g, A, idx, prec, Mdiag, rtol), A, F)
                if found is not None or op.K is not None:
                    break
            if found is None:
                gap = rel_gap(u, Ku)
                status = "optimal" if gap <= max(tol, 1e-8) else "stalled"
                break
            u, Ks, ss = found
            su = su + ss
            Ku = Ku + Ks if it % 10 else op(u)  # refresh Ku now and then against drift
    finally:
        if bar is not None:
            bar.close()
    return u, Ku, status, it, gap
