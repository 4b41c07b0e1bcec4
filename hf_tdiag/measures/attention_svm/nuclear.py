"""The nuclear-norm Att-SVM (KQ-parameterization) through cvxpy, on the reduced coordinates of the Frobenius solve.

``min ‖W‖_* s.t. ⟨W, a_k⟩ ≥ 1 (inequalities), ⟨W, e_j⟩ = 0 (equalities)`` with Clarabel (interior point)
when installed, else SCS. The returned ``W`` is scaled to smallest margin exactly 1; the relative gap
``(P − D)/P`` uses the dual bound ``1ᵀλ / ‖Σλ_k a_k + Σβ_j e_j‖_op`` from cvxpy's multipliers.
Needs the optional extra ``hf-tdiag[svm]``.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from .problem import Problem
from .result import AttSVMResult

__all__ = ["solve_nuclear"]


def _import_cvxpy():
    try:
        import cvxpy as cp
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "att_svm(norm='nuc') needs cvxpy: install the optional extra with `pip install hf-tdiag[svm]`"
        ) from err
    return cp


def _nuclear_gap(
    AI: np.ndarray, AE: np.ndarray | None, lam: np.ndarray, beta, primal: float, dx: int, dz: int
) -> float:
    """Relative gap ``(P − D)/P`` with ``D = 1ᵀλ / min_β ‖Σλ_k a_k ± Σβ_j e_j‖_op`` (both sign conventions tried)."""
    G = AI.T @ lam
    candidates = [G]
    if AE is not None and beta is not None:
        beta = np.asarray(beta, dtype=np.float64).reshape(-1)
        candidates += [G + AE.T @ beta, G - AE.T @ beta]
    op_norm = min(np.linalg.norm(c.reshape(dz, dx).T, 2) for c in candidates)
    dual_val = float(lam.sum()) / op_norm if op_norm > 0 else 0.0
    return max(0.0, (primal - dual_val) / primal) if primal > 0 else math.nan


def _grid(prob: Problem, values: dict, fill: float) -> torch.Tensor:
    """An ``(n, T)`` grid with ``values[flat_idx] = array`` placed at those constraints, ``fill`` elsewhere."""
    out = torch.full((prob.n * prob.T,), fill, dtype=torch.float64, device=prob.X.device)
    for idx, vals in values.items():
        out[idx] = torch.as_tensor(vals, dtype=torch.float64, device=prob.X.device)
    return out.view(prob.n, prob.T)


def _fall_back(fro: AttSVMResult, status: str, what: str) -> AttSVMResult:
    fro.status = status
    fro.message = f"the Frobenius solution is returned; the nuclear-norm solve {what}"
    return fro


def solve_nuclear(prob: Problem, P, S, fro: AttSVMResult, t0: float) -> AttSVMResult:
    """Nuclear-norm solution of ``prob`` (``P``, ``S``: the reduction bases); ``fro`` is returned if cvxpy fails."""
    cp = _import_cvxpy()
    I, E = prob.ineq_idx, prob.eq_idx
    dx, dz = prob.X.shape[2], prob.Z.shape[1]
    AI = prob.features(I).cpu().numpy()
    AE = prob.features(E).cpu().numpy() if E.numel() else None
    Wv = cp.Variable((dx, dz))
    w = cp.vec(Wv, order="F")
    cons = [AI @ w >= 1] + ([AE @ w == 0] if AE is not None else [])
    problem = cp.Problem(cp.Minimize(cp.normNuc(Wv)), cons)
    solver = "CLARABEL" if "CLARABEL" in cp.installed_solvers() else "SCS"
    try:
        problem.solve(solver=solver)
    except cp.error.SolverError as err:
        return _fall_back(fro, f"nuclear solver failed: {err}", "failed")
    if Wv.value is None or problem.status not in ("optimal", "optimal_inaccurate"):
        return _fall_back(fro, f"nuclear solver status {problem.status}", "did not finish")
    Wr = torch.as_tensor(np.asarray(Wv.value), dtype=torch.float64, device=prob.X.device)
    wflat = Wr.T.reshape(-1).cpu().numpy()  # vec_F
    marg_I = AI @ wflat
    smin = float(marg_I.min())
    Wr = Wr / smin
    lam = np.maximum(np.asarray(cons[0].dual_value, dtype=np.float64).reshape(-1), 0.0)
    primal = float(torch.linalg.matrix_norm(Wr, ord="nuc"))
    gap = _nuclear_gap(AI, AE, lam, cons[1].dual_value if AE is not None else None, primal, dx, dz)
    W = Wr if P is None else P @ Wr
    W = W if S is None else W @ S.T
    margins = _grid(prob, {I: marg_I / smin, **({E: AE @ wflat / smin} if AE is not None else {})}, math.nan)
    return AttSVMResult(
        W=W,
        objective=primal,
        norm="nuc",
        feasible=True,
        status=problem.status,
        margins=margins,
        dual=_grid(prob, {I: lam}, 0.0),
        active=(prob.kind == 1) & (margins <= 1.0 + 1e-5),
        constraint=prob.kind,
        selected=prob.ref,
        duality_gap=gap,
        iterations=int(problem.solver_stats.num_iters or 0),
        solve_time=time.perf_counter() - t0,
        solver=f"cvxpy-{solver.lower()}",
        extra={"fro_objective": fro.objective},
    )
