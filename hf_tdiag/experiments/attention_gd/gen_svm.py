"""The generalized SVM for nonlinear heads (§6): ``W ≈ W_fin + R·W_dir``, and the paper's run-exclusion rule.

* :func:`gen_svm_fit` — selected sets ``O_i = {t : s_it ≥ threshold}`` (1e-3), the finite part ``W_fin``
  from the softmax log-ratios inside each set, the max-margin direction ``W_dir`` (Gen-SVM) and the
  least-squares ``R``; the correlation of ``W_fin + R·W_dir`` with the GD solution;
* :func:`gen_svm_excluded` — the authors' filter for Figs 9/12: a run is dropped when some probability
  lies in ``(1e-6, 1e-3]`` (neither clearly selected nor clearly masked) or when no probability is
  ``≤ 1e-6`` (GD has not separated any token: a finite solution).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...measures.attention_svm import AttSVMResult, att_svm, gen_svm_finite_part, matrix_correlation

__all__ = ["GenSVMFit", "gen_svm_fit", "gen_svm_excluded"]


def gen_svm_excluded(probs: torch.Tensor, *, low: float = 1e-6, high: float = 1e-3) -> str | None:
    """Why a run is excluded from the Gen-SVM statistics (``"ambiguous"`` / ``"finite"``), or None to keep it.

    ``probs``: the run's softmax probabilities ``(n, T)``. Ambiguous: some ``s`` in ``(low, high]``.
    Finite: no ``s ≤ low`` (nothing is masked, so there is no max-margin direction to compare).
    """
    if not (0 < low < high < 1):
        raise ValueError(f"low, high: expected 0 < low < high < 1, got {low!r}, {high!r}")
    if bool(((probs > low) & (probs <= high)).any()):
        return "ambiguous"
    if not bool((probs <= low).any()):
        return "finite"
    return None


@dataclass
class GenSVMFit:
    """Gen-SVM prediction of a GD solution: ``W ≈ W_fin + R·W_dir``."""

    selected: torch.Tensor  # (n, T) bool selected sets O_i
    W_fin: torch.Tensor
    W_dir: torch.Tensor | None  # Gen-SVM solution (None if infeasible)
    R: float
    W_pred: torch.Tensor
    correlation: float  # corr(W_gd, W_fin + R W_dir)
    direction_correlation: float  # corr(W_gd − W_fin, W_dir)
    svm: AttSVMResult

    def summary(self) -> dict:
        sizes = self.selected.sum(1).to(torch.float64)
        return {
            "correlation": self.correlation,
            "direction_correlation": self.direction_correlation,
            "R": self.R,
            "mean_selected": float(sizes.mean()),
            "max_selected": int(sizes.max()),
            "feasible": self.svm.feasible,
        }


def gen_svm_fit(X, z, W_gd: torch.Tensor, *, threshold: float = 1e-3) -> GenSVMFit:
    """Selected sets ``O_i = {t: softmax(X_i W z_i)_t ≥ threshold}``; ``W_fin`` from their log-ratios,
    ``W_dir`` the Gen-SVM, ``R = ⟨W_gd − W_fin, W_dir⟩/‖W_dir‖²`` (least squares)."""
    if not (0 < threshold < 1):
        raise ValueError(f"threshold: expected a number in (0, 1), got {threshold!r}")
    W_gd = W_gd.detach().to(torch.float64)
    X = X.detach().to(torch.float64)
    z = z.detach().to(torch.float64)
    logits = torch.einsum("ntd,de,ne->nt", X, W_gd, z)
    logp = torch.log_softmax(logits, dim=1)
    O = logp.exp() >= threshold
    O[torch.arange(O.shape[0]), logp.argmax(1)] = True
    W_fin = gen_svm_finite_part(X, z, O, logp)
    if bool(O.all()):
        raise ValueError("threshold: every token of every input is selected; there is no max-margin direction to fit")
    svm = att_svm(X, z, O)
    if svm.feasible:
        W_dir = svm.W
        R = float(((W_gd - W_fin) * W_dir).sum() / (W_dir * W_dir).sum())
        W_pred = W_fin + R * W_dir
        dcorr = matrix_correlation(W_gd - W_fin, W_dir)
    else:
        W_dir, R, W_pred, dcorr = None, math.nan, W_fin, math.nan
    return GenSVMFit(
        selected=O,
        W_fin=W_fin,
        W_dir=W_dir,
        R=R,
        W_pred=W_pred,
        correlation=matrix_correlation(W_gd, W_pred),
        direction_correlation=dcorr,
        svm=svm,
    )
