"""The public Att-SVM / Gen-SVM entry points: :func:`att_svm` (one query per input, or ``K`` per input in the
sequence-to-sequence form) and :func:`att_svm_self` (self-attention: every token of a sequence is a query with
its own constraint set); ``causal=True`` restricts each query position to its prefix. All go through :func:`solve`.

``solve`` reduces the problem (orthonormal bases of the spans), rejects zero features, runs the dual
active-set / projected-Newton solvers (an LP decides feasibility when the active-set steps do not
settle), and turns the dual solution into ``W = Σλ_k a_k`` scaled to smallest margin exactly 1;
``norm="nuc"`` then hands the same reduced problem to cvxpy.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from .causal import query_layout
from .certificate import certificate_lp, infeasible_result, zero_feature_result
from .inputs import check_norm, selection, to_f64, valid_mask
from .kernel import ReducedKernel
from .nuclear import solve_nuclear
from .problem import Problem, reduce
from .result import AttSVMResult
from .solvers import pdas, projected_newton, rel_gap, solver_name, support_guess

__all__ = ["att_svm", "att_svm_self", "solve"]


def att_svm(
    X,
    z,
    selected,
    norm: str = "fro",
    *,
    token_mask=None,
    causal: bool = False,
    query_mask=None,
    tol: float = 1e-10,
    max_iter: int = 2000,
    feas_tol: float = 1e-7,
    progress: bool = False,
) -> AttSVMResult:
    """``W_mm = argmin ‖W‖ s.t. (x_{iα_i} − x_{it})ᵀ W z_i ≥ 1 ∀ t ≠ α_i`` for ``X (n,T,d)``, ``z (n,d_z)``.

    ``selected``: token indices ``(n,)`` (Att-SVM) or a boolean selected-set mask
    ``(n, T)`` (Gen-SVM). ``token_mask (n, T)`` marks real (non-padding) tokens.
    Sequence-to-sequence form: ``z (n, K, d_z)`` gives ``K`` queries per input, ``selected``
    ``(n, K)`` (or ``(n, K, T)`` sets), each query its own constraint set; ``causal=True``
    restricts query ``k`` to the tokens ``t ≤ k`` (``query_mask (n, K)`` picks queries).
    Result arrays are then indexed by query, ``result.query_index[j] = (i, k)``.
    ``tol``: relative duality gap at which the Frobenius solver stops.
    ``feas_tol``: a margin below ``feas_tol · max_k ‖a_k‖`` counts as infeasible.
    """
    X = to_f64(X, "X", 3)
    if isinstance(z, (torch.Tensor, np.ndarray)) and z.ndim == 3:
        return _att_svm_queries(
            X,
            to_f64(z, "z", 3, device=X.device),
            selected,
            norm,
            token_mask,
            query_mask,
            causal,
            tol,
            max_iter,
            feas_tol,
            progress,
        )
    if causal:
        raise ValueError(
            "causal: one query per input has no position; pass z of shape (n, K, d_z) (one query per position)"
        )
    if query_mask is not None:
        raise ValueError("query_mask: only used with several queries per input (z of shape (n, K, d_z))")
    z = to_f64(z, "z", 2, device=X.device)
    n, T, _ = X.shape
    if z.shape[0] != n:
        raise ValueError(f"z: expected {n} queries (one per input of X), got {z.shape[0]}")
    if T < 2:
        raise ValueError(f"X: expected at least 2 tokens per input, got T={T}")
    valid = valid_mask(token_mask, (n, T), X.device)
    ref, kind = selection(selected, n, T, valid)
    set_idx = torch.arange(n, device=X.device)
    return solve(X, z, set_idx, ref, kind, check_norm(norm), tol, max_iter, feas_tol, progress)


def att_svm_self(
    X,
    selected,
    norm: str = "fro",
    *,
    query_mask=None,
    token_mask=None,
    queries=None,
    causal: bool = False,
    tol: float = 1e-10,
    max_iter: int = 2000,
    feas_tol: float = 1e-7,
    progress: bool = False,
) -> AttSVMResult:
    """Self-attention Att-SVM: the queries are the tokens ``x_{bq}`` of ``X (B, T, d)`` themselves.

    Query ``(b, q)`` has its own constraint set ``(x_{b α_{bq}} − x_{bt})ᵀ W x_{bq} ≥ 1``
    (``causal=True``: only over ``t ≤ q``, as a decoder's masked attention sees them).
    ``selected``: ``(B, T)`` token index per query token, or ``(B, T, T)`` boolean sets.
    ``query_mask (B, T)``: which tokens act as queries (default: all real tokens; causal: all but
    position 0, which sees only itself).
    ``queries``: optional ``(B, T, d_z)`` query vectors to use instead of ``X`` (e.g. ``[x, 1]``
    to model a key bias); the constraint sets are still the tokens of ``X``.
    Result arrays are indexed by query, ``result.query_index[k] = (b, q)``.
    """
    X = to_f64(X, "X", 3)
    B, T, _ = X.shape
    Q = X if queries is None else to_f64(queries, "queries", 3, device=X.device)
    if Q.shape[:2] != X.shape[:2]:
        raise ValueError(f"queries: expected shape ({B}, {T}, d_z), got {tuple(Q.shape)}")
    return _att_svm_queries(X, Q, selected, norm, token_mask, query_mask, causal, tol, max_iter, feas_tol, progress)


def _att_svm_queries(
    X, Q, selected, norm, token_mask, query_mask, causal, tol, max_iter, feas_tol, progress
) -> AttSVMResult:
    """Several queries per token set (self-attention, sequence-to-sequence, causal): one constraint set each."""
    T = X.shape[1]
    if T < 2:
        raise ValueError(f"X: expected at least 2 tokens per sequence, got T={T}")
    qidx, z, sel_q, visible = query_layout(X, Q, selected, query_mask=query_mask, token_mask=token_mask, causal=causal)
    ref, kind = selection(sel_q, qidx.shape[0], T, visible)
    res = solve(X, z, qidx[:, 0].contiguous(), ref, kind, check_norm(norm), tol, max_iter, feas_tol, progress)
    res.query_index = qidx
    return res


def _dual_solve(prob: Problem, op: ReducedKernel, tol, max_iter, feas_tol, progress, lp_check: bool):
    """``(λ, K'λ, status, iterations)``: active-set steps, an exact LP feasibility check if they stall, projected Newton."""
    lam, Klam, status, iters = pdas(op, tol, min(max_iter, 50), feas_tol, support_guess(prob, op))
    dims = prob.X.shape[2] * prob.Z.shape[1]
    if status == "continue" and lp_check and op.m * dims <= 2e6:
        # PDAS did not settle (degenerate or nearly infeasible problem): decide feasibility exactly by LP
        theta = certificate_lp(prob)
        if theta is not None:
            lam, Klam, status = theta, op(theta), "infeasible"
    if status == "continue":
        lam, Klam, status, more, _ = projected_newton(op, tol, max_iter, feas_tol, progress, start=(lam, Klam))
        iters += more
    return lam, Klam, status, iters


def _feasible_result(
    prob: Problem, op: ReducedKernel, P, S, lam, Klam, smin: float, status: str, iters: int, t0: float
) -> AttSVMResult:
    """``W = Σλ_k a_k / min margin`` mapped back from the reduced coordinates, with margins, duals and support."""
    n, T, kind = prob.n, prob.T, prob.kind
    coef = op.full_coef(lam) / smin
    W = prob.W_reduced(coef)
    margins = prob.apply_K(coef)
    if P is not None:
        W = P @ W
    if S is not None:
        W = W @ S.T
    margins = torch.where(kind == 0, torch.full_like(margins, math.nan), margins)
    dual = torch.zeros(n * T, dtype=torch.float64, device=W.device)
    dual[prob.ineq_idx] = lam / smin
    return AttSVMResult(
        W=W,
        objective=float(torch.linalg.norm(W)),
        norm="fro",
        feasible=True,
        status=status,
        margins=margins,
        dual=dual.view(n, T),
        active=(kind == 1) & (margins <= 1.0 + 1e-7),  # tight constraints: the support tokens
        constraint=kind,
        selected=prob.ref,
        duality_gap=rel_gap(lam, Klam),
        iterations=iters,
        solve_time=time.perf_counter() - t0,
        solver=solver_name(op),
    )


def solve(X, Z, set_idx, ref, kind, norm, tol, max_iter, feas_tol, progress, lp_check: bool = True) -> AttSVMResult:
    """Solve the Att-SVM with token sets ``X (B, T, dx)``, queries ``Z (n, dz)`` of set ``set_idx``, grid ``kind``."""
    t0 = time.perf_counter()
    if not (kind == 1).any():
        raise ValueError("selected: there is no inequality constraint (every token of every query is selected)")
    Xr, Zr, P, S = reduce(X, Z, set_idx)
    prob = Problem(Xr, Zr, set_idx, ref, kind)
    op = ReducedKernel(prob)
    feat_scale = float((X * X).sum(-1).max()) * 4.0 * float((Z * Z).sum(-1).max())
    # a constraint whose feature is 0 (after eliminating equalities) can never reach margin 1
    zero = zero_feature_result(prob, op, feat_scale, norm, t0)
    if zero is not None:
        return zero
    lam, Klam, status, iters = _dual_solve(prob, op, tol, max_iter, feas_tol, progress, lp_check)
    smin = float(Klam.min()) if lam.sum() > 0 else 0.0
    if status == "infeasible" or smin <= 0:
        return infeasible_result(prob, op, lam, status, iters, feas_tol, norm, t0)
    result = _feasible_result(prob, op, P, S, lam, Klam, smin, status, iters, t0)
    if norm == "nuc":
        result = solve_nuclear(prob, P, S, result, t0)
    return result
