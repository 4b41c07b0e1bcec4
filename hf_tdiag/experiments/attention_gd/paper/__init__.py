"""Every synthetic experiment of Tarzanagh et al. (2023) at the paper's settings (``PAPER``) or a CI size (``QUICK``).

One module per figure group; each ``run_*`` takes a settings dict and returns a JSON-friendly dict with the
settings and the data its figure plots (:mod:`hf_tdiag.viz.attention_svm` draws them; ``recipes/attention_svm.py``
runs them).
"""

from .convergence import gamma_filtered_instances, run_convergence
from .local import run_local
from .multitoken import run_multitoken_lambda, run_multitoken_tau, waterfill_support
from .nonlinear import run_nonlinear
from .rank import run_rank_m, run_svm_rank
from .settings import EXPERIMENTS, PAPER, QUICK
from .trajectories import run_trajectories

RUNNERS = {
    "trajectories": run_trajectories,
    "local": run_local,
    "convergence": run_convergence,
    "rank_m": run_rank_m,
    "svm_rank": run_svm_rank,
    "nonlinear": run_nonlinear,
    "multitoken_lambda": run_multitoken_lambda,
    "multitoken_tau": run_multitoken_tau,
}

__all__ = [
    "EXPERIMENTS",
    "PAPER",
    "QUICK",
    "RUNNERS",
    "gamma_filtered_instances",
    "waterfill_support",
    "run_trajectories",
    "run_local",
    "run_convergence",
    "run_rank_m",
    "run_svm_rank",
    "run_nonlinear",
    "run_multitoken_lambda",
    "run_multitoken_tau",
]
