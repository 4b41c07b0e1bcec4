"""Figures for the attention-as-SVM experiments and the head diagnostic (``Figure`` objects, no pyplot state).

* ``head`` — :func:`plot_head_diagnostic`, a head's margins against the SVM margin and its attention peakedness;
* ``curves`` — correlation curves, convergence shares, rank lines and Gen-SVM bars (the Space uses them);
* ``paper`` — one function per figure of the paper's synthetic experiments (``recipes/attention_svm.py``).

Save with :func:`hf_tdiag.viz.save_figure`.
"""

from .curves import plot_correlation_curves, plot_gen_svm, plot_global_frequency, plot_rank
from .head import _hist_range as _hist_range  # noqa: F401  (re-exported for the tests)
from .head import plot_head_diagnostic
from .paper import (
    plot_convergence,
    plot_gamma,
    plot_local,
    plot_margins,
    plot_multitoken_lambda,
    plot_multitoken_tau,
    plot_nonlinear,
    plot_rank_m,
    plot_svm_rank,
    plot_trajectories,
)

__all__ = [
    "plot_head_diagnostic",
    "plot_correlation_curves",
    "plot_global_frequency",
    "plot_rank",
    "plot_gen_svm",
    "plot_trajectories",
    "plot_local",
    "plot_convergence",
    "plot_margins",
    "plot_rank_m",
    "plot_svm_rank",
    "plot_nonlinear",
    "plot_gamma",
    "plot_multitoken_lambda",
    "plot_multitoken_tau",
]
