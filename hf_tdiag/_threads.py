"""Thread counts: torch's for the length of a block, and the thread policy of the diagnostics.

**The policy** (:func:`measure_threads`, the one place it is decided). Each diagnostic's call runs inside
``measure_threads(kind)`` — the ``threads`` kind of its declaration in :mod:`hf_tdiag.diagnostics.registry`, applied
by :func:`hf_tdiag.diagnostics.entry.diagnostic_entry` — which sets ``torch.set_num_threads`` and, when threadpoolctl
is installed, the BLAS libraries' limits (NumPy's and SciPy's OpenBLAS/MKL) for the call and restores both
afterwards — on errors too, and whatever the block itself set:

* ``"small"`` — batched factorizations and solves of small matrices (Cholesky, triangular solves, ``eigvalsh``,
  SVDs of a few hundred rows, the Att-SVM's active-set and Newton steps): **one thread**. Each factorization is
  too small to split, and the threads' synchronisation is what collapses on a busy machine (a batched
  ``cholesky_ex`` at two threads with one core kept busy is over ten times slower than at one). The kernels of
  :mod:`hf_tdiag.kernels.small` always run so, inside any diagnostic.
* ``"dense"`` — large matrix products (the SRR's head projections and Gram matrices, model forwards): the caller's
  torch thread count, but never more than the cores idle when the diagnostic starts (:func:`idle_cores`: this
  process's cores minus the runnable tasks of other processes the kernel counts; this process's own threads, such
  as torch's OpenMP workers still spinning after the last parallel region, are not load), so a core kept busy by
  another process is not waited for.

The measures of :mod:`hf_tdiag.measures` set nothing: called directly, they run at the caller's count (wrap them in
:func:`hf_tdiag.diagnostics.entry.thread_policy` to run them as a diagnostic does). Pools of independent
single-threaded jobs (:func:`hf_tdiag.schatten_bounds`' workers, each at one BLAS thread) keep torch's count:
their threads never wait for each other, so a busy core only slows them in proportion. Scopes nest (a ``"small"``
kernel inside a ``"dense"`` diagnostic); a count the caller set below the policy's is kept. Not for GPU work
(nothing is set for CUDA tensors' kernels; the host side is tiny). torch's thread count is process-wide:
diagnostics called from several Python threads at once share it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator

import torch

from ._validation import positive_int


@contextlib.contextmanager
def torch_threads(n: int | None = None) -> Iterator[None]:
    """Set ``torch.set_num_threads(n)`` for the block (``None``: leave it) and restore the caller's
    count afterwards, also on errors and whatever the block itself set."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


SMALL_MODEL_PARAMETERS = 10_000_000


def pick_threads(requested: int | None = None, *, device="cpu", num_parameters: int | None = None) -> int | None:
    """The torch thread count to run with (``None``: leave torch's).

    ``requested`` (a ``--threads`` flag) wins; else an ``OMP_NUM_THREADS`` set in the environment is respected
    (torch already follows it); else one thread for models under ``SMALL_MODEL_PARAMETERS`` on CPU, whose
    small matrix products spend more time synchronising threads than computing (``hf-tdiag srr`` on the digits
    CRATE runs several times faster on one thread than on all cores of a busy machine).
    """
    import os

    if requested is not None:
        return positive_int(requested, "threads")
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    if torch.device(device).type == "cpu" and num_parameters is not None and num_parameters < SMALL_MODEL_PARAMETERS:
        return 1
    return None


def model_threads(requested: int | None, model, device) -> int | None:
    """:func:`pick_threads` for a ``torch.nn.Module`` on ``device``."""
    return pick_threads(requested, device=device, num_parameters=sum(p.numel() for p in model.parameters()))


# ---------------------------------------------------------------------------------------------- the policy

KINDS = ("small", "dense")
_IDLE_TTL_S = 0.5  # idle_cores() is read at most this often (one to three reads of /proc, ~0.1 ms each)
_idle_cache: dict[str, float] = {"at": -1.0, "value": 0.0}
_controller: list = []  # [(len(sys.modules) when made, threadpoolctl.ThreadpoolController)]
_controller_lock = threading.Lock()


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _own_running() -> int:
    """This process's threads in state ``R`` (running or runnable), from ``/proc/self/task/*/stat``."""
    running = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:  # the thread ended between the listing and the read
            continue
        running += stat[stat.rindex(")") + 2 :].startswith("R")
    return running


def _loadavg_running() -> int:
    """Running or runnable tasks on the machine now: ``/proc/loadavg``'s fourth field's numerator."""
    with open("/proc/loadavg", encoding="ascii") as fh:
        return int(fh.read().split()[3].split("/")[0])


def _other_runnable() -> int:
    """Runnable tasks of other processes: ``/proc/loadavg``'s running count minus this process's running threads
    (its own OpenMP workers spin for a while after a parallel region and must not count as load), the smallest
    of up to three reads 1 ms apart (a process that only passes through the run queue drops out); elsewhere the
    rounded 1-minute load average."""
    try:
        best = None
        for i in range(3):
            if i:
                time.sleep(0.001)
            other = max(0, _loadavg_running() - max(1, _own_running()))
            best = other if best is None else min(best, other)
            if best == 0:  # cannot go lower: no more reads
                break
        return best
    except (OSError, ValueError, IndexError):
        try:
            return int(round(os.getloadavg()[0]))
        except (AttributeError, OSError):
            return 0


def idle_cores() -> int:
    """Cores idle right now (at least 1): :func:`usable_cores` minus the other runnable tasks, re-read at most
    every 0.5 s."""
    now = time.monotonic()
    if now - _idle_cache["at"] > _IDLE_TTL_S:
        _idle_cache["value"] = max(1, usable_cores() - _other_runnable())
        _idle_cache["at"] = now
    return int(_idle_cache["value"])


def policy_threads(kind: str = "small") -> int:
    """The thread count :func:`measure_threads` runs ``kind`` at: 1 for ``"small"``; for ``"dense"`` torch's
    current count capped by :func:`idle_cores`."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {list(KINDS)}, got {kind!r}")
    current = torch.get_num_threads()
    if kind == "small" or current <= 1:
        return 1
    return max(1, min(current, idle_cores()))


def _blas_controller():
    """A threadpoolctl controller of the loaded BLAS libraries (re-made when modules were imported since it was:
    a library loaded later would escape its limits); None without threadpoolctl."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    with _controller_lock:
        if not _controller or _controller[0][0] != len(sys.modules):
            _controller[:] = [(len(sys.modules), ThreadpoolController())]
        return _controller[0][1]


@contextlib.contextmanager
def measure_threads(kind: str = "small") -> Iterator[int]:
    """Run the block at :func:`policy_threads` ``(kind)`` torch and BLAS threads; restore both afterwards.

    Yields the count used. See the module docstring for the policy."""
    n = policy_threads(kind)
    controller = _blas_controller()
    limits = controller.limit(limits=n, user_api="blas") if controller is not None else contextlib.nullcontext()
    with limits, torch_threads(n):
        yield n
