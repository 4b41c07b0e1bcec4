"""Executors: who runs a study's uncached runs. Each takes the run specs and reports every finished run.

An executor is a function ``(specs, *, jobs, threads, on_done, task, **options) -> None`` that runs
``task(spec)`` for each spec (default: train, measure and record one study run) and calls
``on_done(spec, record, failure)`` once per spec, with ``record`` what the task returned
(already written to the cache by the worker) or ``failure`` a dict with ``hparams``,
``error`` and ``traceback``. The per-run cache stays the single source of truth. Specs are
plain dicts with at least ``hparams`` (what names the run in the failure log); the Schatten
trained grid (:func:`hf_tdiag.study.schatten_grid.run_grid`) hands its cells to the same executors.

``local`` (:mod:`.local`, the default, no extra dependency) runs in this process or a
process pool; ``ray`` (:mod:`.ray`, ``pip install "hf-tdiag[ray]"``) hands each run to Ray.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["EXECUTORS", "get_executor", "failure_of"]

EXECUTORS = ("local", "ray")


def failure_of(spec: dict, err: BaseException, tb: str) -> dict:
    """The failure-log entry of a run that raised ``err``."""
    return {"hparams": spec["hparams"], "error": f"{type(err).__name__}: {err}", "traceback": tb}


def get_executor(name: str) -> Callable:
    """The executor function called ``name``."""
    if name == "local":
        from .local import run_local

        return run_local
    if name == "ray":
        from .ray import import_ray, run_ray

        import_ray()  # fail now, naming the extra, rather than after the planning
        return run_ray
    raise ValueError(f"executor: expected one of {list(EXECUTORS)}, got {name!r}")
