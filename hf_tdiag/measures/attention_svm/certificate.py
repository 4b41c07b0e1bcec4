"""Infeasibility: the Gordan certificate ``θ ≥ 0, Σθ = 1, Σ_k θ_k a_k (+ Σ_j β_j e_j) ≈ 0`` and the results built from it.

* :func:`certificate_lp` decides feasibility exactly by linear programming (used when the active-set
  steps do not settle);
* :func:`zero_feature_result`: a constraint whose feature is 0 after eliminating equalities can never
  reach margin 1 (a selected token equal to another token, a zero query, ...);
* :func:`infeasible_result`: the offending queries (those carrying the certificate's mass) and the
  residual ``‖Σθ_k a_k‖ / max_k ‖a_k‖``.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from .kernel import ReducedKernel
from .problem import Problem
from .result import AttSVMResult, empty_result
from .solvers import solver_name

__all__ = ["certificate_lp", "zero_feature_result", "infeasible_result"]


def certificate_lp(prob: Problem) -> torch.Tensor | None:
    """Gordan certificate by linear programming: θ ≥ 0, Σθ = 1, Σ_k θ_k a_k + Σ_j β_j e_j = 0.

    Returns θ (over the inequality constraints) when it exists — the SVM is then
    infeasible — and None when the LP is infeasible (the SVM is feasible).
    """
    from scipy.optimize import linprog

    I, E = prob.ineq_idx, prob.eq_idx
    AI = prob.features(I).cpu().numpy()
    scale = np.abs(AI).max()
    cols = [AI.T / scale]
    ne = 0
    if E.numel():
        AE = prob.features(E).cpu().numpy()
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


def zero_feature_result(
    prob: Problem, op: ReducedKernel, feat_scale: float, norm: str, t0: float
) -> AttSVMResult | None:
    """The infeasible result when some constraint's feature is (numerically) zero, else None."""
    zero = op.diag <= 1e-20 * max(feat_scale, 1e-300)
    if not zero.any():
        return None
    flat = prob.ineq_idx[zero]
    offending = torch.unique(flat // prob.T)
    return empty_result(
        prob.n,
        prob.T,
        prob.kind,
        prob.ref,
        norm,
        prob.X.device,
        "none (a zero feature decides before any solve)",
        offending=offending,
        certificate_residual=0.0,
        solve_time=time.perf_counter() - t0,
        message=(
            f"{int(zero.sum())} constraint(s) have a zero feature: the selected token equals another token "
            f"(or the query is zero / the token is tied to the selected set by equalities) in queries {offending[:10].tolist()}"
        ),
    )


def infeasible_result(
    prob: Problem, op: ReducedKernel, lam: torch.Tensor, status: str, iters: int, feas_tol: float, norm: str, t0: float
) -> AttSVMResult:
    """Result for a dual iterate ``lam`` that certifies infeasibility (or a solver that stopped before a feasible W)."""
    n, T = prob.n, prob.T
    su = float(lam.sum())
    theta = lam / su if su > 0 else torch.full_like(lam, 1.0 / lam.numel())
    resid = math.sqrt(max(float(theta @ op(theta)), 0.0) / float(op.diag.max()))
    mass = torch.zeros(n * T, dtype=torch.float64, device=prob.X.device)
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
    return empty_result(
        n,
        T,
        prob.kind,
        prob.ref,
        norm,
        prob.X.device,
        solver_name(op),
        status=status,
        offending=offending,
        certificate_residual=resid,
        iterations=iters,
        solve_time=time.perf_counter() - t0,
        message=msg,
    )
