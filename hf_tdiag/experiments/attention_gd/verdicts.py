"""Where gradient descent ended up: global or local convergence, the paper's local-optimality test, Assumption B.1.

* :func:`is_locally_optimal` — the selection's Att-SVM is feasible and every support token scores below
  the selected one (the paper's definition of locally-optimal tokens);
* :func:`convergence_verdict` — global (GD selects the optimal tokens), local (another locally-optimal
  selection) or undetermined, with the correlation to that selection's Att-SVM solution;
* :func:`initial_gradient_separates` — Assumption B.1 as we read it (§4.2, Fig. 5; the global-convergence
  theorem starts from ``W = 0`` with a separating first step): the negative gradient at ``W = 0`` already
  ranks every input's optimal token first;
* :func:`all_support` — every non-selected token is a support vector of the solution (all constraints tight).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...measures.attention_svm import AttSVMResult, att_svm, matrix_correlation
from .data import AttentionData
from .model import attention_logits, loss_and_grad_linear

__all__ = [
    "ConvergenceVerdict",
    "convergence_verdict",
    "is_locally_optimal",
    "all_support",
    "initial_gradient_separates",
]


def initial_gradient_separates(data: AttentionData) -> bool:
    """``(x_{i,opt} − x_it)ᵀ(−∇L(0)) z_i > 0`` for every input ``i`` and ``t ≠ opt_i`` (linear head, logistic loss)."""
    W0 = torch.zeros(data.X.shape[-1], data.z.shape[-1], dtype=torch.float64)
    _, G, _ = loss_and_grad_linear(data, W0)
    scores = attention_logits(data, -G)
    best = scores.gather(-1, data.optimal[..., None])
    others = scores.scatter(-1, data.optimal[..., None], -math.inf)
    return bool((best > others).all())


def all_support(svm: AttSVMResult) -> bool:
    """Every constrained (non-selected) token is a support vector of the solution (margin exactly 1)."""
    if not svm.feasible:
        return False
    return bool(svm.active[svm.constraint == 1].all())


def is_locally_optimal(data: AttentionData, svm: AttSVMResult) -> bool:
    """Paper's Definition: the Att-SVM for the selection is feasible and every support token scores below the selected one."""
    if not svm.feasible:
        return False
    gamma = data.scores
    n = gamma.shape[0]
    sel_score = gamma[torch.arange(n), svm.selected]
    support = svm.active
    lower = gamma < sel_score[:, None]
    return bool((lower | ~support).all())


@dataclass
class ConvergenceVerdict:
    """Where GD ended up."""

    kind: str  # "global" | "local" | "undetermined"
    selected: torch.Tensor  # (n,) argmax of each softmax
    optimal: torch.Tensor  # (n,) optimal tokens
    correlation: float  # corr(W, W_mm of the selected tokens); NaN when that SVM is infeasible
    locally_optimal: bool
    svm: AttSVMResult
    min_max_prob: float  # smallest (over inputs) largest softmax probability

    def summary(self) -> dict:
        return {
            "kind": self.kind,
            "correlation": self.correlation,
            "locally_optimal": self.locally_optimal,
            "num_not_optimal": int((self.selected != self.optimal).sum()),
            "min_max_prob": self.min_max_prob,
        }


def convergence_verdict(
    data: AttentionData, W: torch.Tensor, *, norm: str = "fro", threshold: float = 0.99
) -> ConvergenceVerdict:
    """Global if GD selects the optimal tokens, local if it selects another locally-optimal set, with
    correlation ≥ ``threshold`` to that selection's Att-SVM (``norm``) solution; else undetermined."""
    W = W.detach().to(torch.float64)
    probs = torch.softmax(attention_logits(data, W), dim=1)
    selected = probs.argmax(1)
    optimal = data.optimal
    svm = att_svm(data.X, data.z, selected, norm=norm)
    corr = matrix_correlation(W, svm.W) if svm.feasible else math.nan
    loc = is_locally_optimal(data, svm)
    if svm.feasible and corr >= threshold:
        kind = "global" if torch.equal(selected, optimal) else ("local" if loc else "undetermined")
    else:
        kind = "undetermined"
    return ConvergenceVerdict(
        kind=kind,
        selected=selected,
        optimal=optimal,
        correlation=corr,
        locally_optimal=loc,
        svm=svm,
        min_max_prob=float(probs.max(1).values.min()),
    )
