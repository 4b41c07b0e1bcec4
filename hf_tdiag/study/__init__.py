"""Does SRR predict generalization? The correlation study of Hu, Zou & Xu (NeurIPS 2024).

Trains a grid of CRATE-family models (axes: variant, batch size, learning rate,
weight decay or dropout), each to the stop criterion (training loss ≤ 0.01 or
the step budget), records the generalization gap (validation loss − training
loss), computes the SRR measure and the baselines of Jiang et al. (2020) on the
training data, and ranks them by Kendall's τ and the granulated Ψ against the
gap.

Resumability: every finished run is one JSON file ``<study_dir>/runs/<key>.json``
written atomically (temporary file + ``os.replace``), where ``key`` hashes the
run's complete settings. A study killed at any point loses at most the runs in
flight; running it again skips every cached run (and the default trainer
resumes the interrupted training from its last epoch checkpoint). ``jobs > 1``
trains several runs at once in separate processes, each with ``cpu_count //
jobs`` threads and, where GPUs are present, its own GPU (round-robin).

Modules, one job each: :mod:`.grids` (grid definitions), :mod:`.cache` (the
per-run cache), :mod:`.measures` (what is measured on a trained model),
:mod:`.worker` (one run: train, measure, record), :mod:`.executors` (who runs the
runs), :mod:`.table` (τ/Ψ tables and plots), :mod:`.runner` (``run_study``).
Data flow: trainer → model → probes (weights, SRR) → measures (complexity,
sharpness, correlation) → table / plots.
"""

from __future__ import annotations

from .cache import STUDY_VERSION, load_records, run_key, write_json_atomic
from .grids import GRIDS, StudyGrid
from .measures import MEASURES, MeasureSettings, compute_measures
from .runner import run_study
from .table import correlation_table, markdown_table, summarize

__all__ = [
    "GRIDS",
    "MEASURES",
    "STUDY_VERSION",
    "StudyGrid",
    "MeasureSettings",
    "run_key",
    "compute_measures",
    "run_study",
    "correlation_table",
    "markdown_table",
    "summarize",
    "load_records",
    "write_json_atomic",
]
