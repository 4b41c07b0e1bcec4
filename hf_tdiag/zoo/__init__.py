"""Diagnose a whole zoo: ``hf_tdiag.scan(models, diagnostics, inputs, output_dir=...)`` and ``hf-tdiag scan``.

Many models (a training run's checkpoints, the fine-tunes of one base model, a family of sizes) × the registry's
diagnostics × one input set -> one tidy table, a row per (model, diagnostic, layer/matrix/step), as Parquet and a
``datasets.Dataset``. A per-(model content hash, diagnostic, settings hash, inputs hash) cache is the source of
truth: a rerun measures only what is missing or changed, a scan killed at any point loses at most the model in
flight, and a model that fails is logged while the others go on. Models are measured one per task by the study's
executors (local processes, or Ray), each worker holding one model at a time.

Modules, one job each: :mod:`.models` (naming and hashing models), :mod:`.inputs` (the input set and its hash),
:mod:`.cache` (one file per entry), :mod:`.worker` (one model's diagnostics), :mod:`.table` (the table from the
cache), :mod:`.compare` (rank correlations with per-model metadata), :mod:`.hub` (the dataset repo and its card),
:mod:`.runner` (``scan``).
"""

from __future__ import annotations

from .runner import ScanResult, scan

__all__ = ["ScanResult", "scan"]
