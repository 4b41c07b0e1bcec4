"""The local executor: runs one after another in this process (``jobs == 1``) or in a pool of processes.

In the pool each worker process gets ``threads`` torch CPU threads and, where GPUs
are present, one GPU of its own (round-robin through ``CUDA_VISIBLE_DEVICES``).
Workers die with the study process, even when it is killed with SIGKILL: on Linux
the kernel sends them SIGKILL (``prctl(PR_SET_PDEATHSIG)``); elsewhere a daemon
thread in each worker exits it as soon as its parent process is gone.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence

from ..worker import execute
from . import failure_of

__all__ = ["run_local"]


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _watch_parent(parent_pid: int, interval: float = 0.5) -> None:
    """Exit this process as soon as its parent is no longer ``parent_pid`` (it died; we were re-parented)."""
    while os.getppid() == parent_pid:
        time.sleep(interval)
    os._exit(1)


def _die_with_parent(parent_pid: int) -> None:
    """Make this worker process end when the study process ends, however it ends."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            ok = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            ok = False
        if ok:
            if os.getppid() != parent_pid:  # the parent died before prctl took effect
                os._exit(1)
            return
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="study-parent-watch").start()


def _init_worker(threads: int, gpu_queue=None, parent_pid: int | None = None):
    """Worker setup: die with the study process, CPU threads, one GPU per worker when GPUs are present."""
    if parent_pid is not None:
        _die_with_parent(parent_pid)
    if gpu_queue is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu_queue.get())
    import torch

    torch.set_num_threads(max(1, threads))


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install must not stop a CPU study
        return 0


def _run_serial(specs: Sequence[dict], threads: int | None, on_done: Callable, task: Callable) -> None:
    from ..._threads import torch_threads

    with torch_threads(threads):
        for spec in specs:
            try:
                rec = task(spec)
            except Exception as err:  # one failed run does not stop the study; it is retried next time
                on_done(spec, None, failure_of(spec, err, traceback.format_exc()))
            else:
                on_done(spec, rec, None)


def _run_pool(specs: Sequence[dict], jobs: int, threads: int, on_done: Callable, task: Callable) -> None:
    ctx = mp.get_context("spawn")
    gpus = _gpu_count()
    gpu_queue = None
    if gpus:
        gpu_queue = ctx.Queue()  # a pipe, handed to each worker at its start (no manager process to outlive us)
        for i in range(jobs):
            gpu_queue.put(i % gpus)  # several workers share a GPU when jobs > GPUs
    with cf.ProcessPoolExecutor(
        max_workers=jobs, mp_context=ctx, initializer=_init_worker, initargs=(threads, gpu_queue, os.getpid())
    ) as pool:
        futures = {pool.submit(task, dict(spec, threads=threads)): spec for spec in specs}
        for fut in cf.as_completed(futures):
            spec = futures[fut]
            try:
                rec = fut.result()
            except Exception as err:
                tb = "".join(traceback.format_exception(err.__cause__ or err))
                on_done(spec, None, failure_of(spec, err, tb))
            else:
                on_done(spec, rec, None)


def run_local(
    specs: Sequence[dict],
    *,
    jobs: int = 1,
    threads: int | None = None,
    on_done: Callable,
    task: Callable = execute,
    **options,
) -> None:
    """Run ``task(spec)`` for every spec; ``jobs == 1`` in this process (``threads`` torch threads, or unchanged if
    ``None``), else in ``jobs`` worker processes with ``threads`` (default ``cpu_count // jobs``) threads each (the
    spec then carries ``threads``). ``task`` must be importable by name (a module-level function)."""
    if options:
        raise ValueError(f"executor_options: the local executor takes none, got {sorted(options)}")
    if jobs == 1:
        _run_serial(specs, threads, on_done, task)
    else:
        _run_pool(specs, jobs, threads or max(1, (os.cpu_count() or 1) // jobs), on_done, task)
