"""The Ray executor: every uncached run becomes a Ray task, on a local Ray instance or a cluster.

Install with ``pip install "hf-tdiag[ray]"``; Ray is imported only when this executor is asked
for. Each task asks for ``num_cpus`` CPUs (default: ``threads``, else 1; torch uses that many
threads in the task) and ``num_gpus`` GPUs (default 1 where the driver sees CUDA, else 0). The
per-run cache stays the single source of truth: a task writes its run's record atomically when
it finishes (as the local executor's workers do), and a task whose run is already recorded
returns that record without training, so re-submitting a finished run is a no-op. A task whose
worker process dies is retried ``max_retries`` times (Ray's task retries); the retried training
resumes from the run's last epoch checkpoint. Runs that raise are not retried: their traceback
goes to the study's failure log, exactly as with the local executor.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence

from ..cache import read_record, record_path
from ..worker import execute
from . import failure_of

__all__ = ["run_ray", "import_ray"]


def import_ray():
    """``ray``, or an ImportError that names the extra to install."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(
            'executor="ray" needs Ray, an optional dependency: pip install "hf-tdiag[ray]" (or pip install ray)'
        ) from err
    return ray


def execute_once(spec: dict) -> dict:
    """The run's cached record if it exists, else train, measure and record it (what a Ray task runs)."""
    cached = read_record(record_path(spec["study_dir"], spec["key"]), spec["key"])
    return cached if cached is not None else execute(spec)


def _gpus_default() -> int:
    try:
        import torch

        return 1 if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install must not stop a CPU study
        return 0


def _traceback_of(err: BaseException) -> str:
    cause = getattr(err, "cause", None)  # RayTaskError carries the task's own exception and traceback text
    return str(err) if cause is not None else "".join(traceback.format_exception(err))


def run_ray(
    specs: Sequence[dict],
    *,
    jobs: int = 1,
    threads: int | None = None,
    on_done: Callable,
    task: Callable = execute_once,
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: float | None = None,
    max_retries: int = 1,
    memory: int | None = None,
) -> None:
    """Run ``task(spec)`` for every spec as a Ray task (the spec carrying ``threads = num_cpus``) and report each as
    it finishes (any order). ``task`` must be safe to run twice for one spec (a retried task): the default returns a
    run's cached record without training it again.

    Connects to ``address`` (e.g. ``"auto"`` for a cluster started with ``ray start --head``) or, without one,
    starts a local instance with ``jobs × num_cpus`` CPUs and shuts it down afterwards; an instance the caller
    already initialised is used as it is. ``memory``: the bytes each task asks Ray for (default: none asked).
    """
    ray = import_ray()
    cpus = int(num_cpus or threads or 1)
    gpus = _gpus_default() if num_gpus is None else num_gpus
    started_here = not ray.is_initialized()
    if started_here:
        kwargs = {"address": address} if address else {"num_cpus": jobs * cpus}
        ray.init(include_dashboard=False, log_to_driver=False, **kwargs)
    try:
        extra = {"memory": int(memory)} if memory else {}
        remote = ray.remote(task).options(
            num_cpus=cpus, num_gpus=gpus, max_retries=max_retries, retry_exceptions=False, **extra
        )
        pending = {remote.remote(dict(spec, threads=cpus)): spec for spec in specs}
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            spec = pending.pop(ref)
            try:
                rec = ray.get(ref)
            except Exception as err:  # the run raised, or its worker died more often than max_retries
                on_done(spec, None, failure_of(spec, getattr(err, "cause", None) or err, _traceback_of(err)))
            else:
                on_done(spec, rec, None)
    finally:
        if started_here:
            ray.shutdown()
