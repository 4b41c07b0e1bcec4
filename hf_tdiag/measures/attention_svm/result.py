"""The result type of every Att-SVM / Gen-SVM solve (:class:`AttSVMResult`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .inputs import matrix_correlation

__all__ = ["AttSVMResult", "empty_result"]


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


def empty_result(
    n: int, T: int, kind: torch.Tensor, ref: torch.Tensor, norm: str, device, solver: str, **kw
) -> AttSVMResult:
    """An infeasible (or unsolved) result: no ``W``, ``objective = inf``, NaN margins; ``kw`` overrides fields."""
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
        solver=solver,
    )
    base.update(kw)
    return AttSVMResult(**base)
