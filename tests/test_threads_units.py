"""hf_tdiag._threads' small pieces against hand-written /proc contents and counts: the core count, this process's
running threads, the run-queue read and its fallbacks, the idle-core cache, the policy's counts, and the BLAS
controller's reuse."""

from __future__ import annotations

import io
import os

import pytest
import torch

import hf_tdiag._threads as T


# ------------------------------------------------------------------------------------------------- usable_cores
def test_usable_cores_from_the_affinity_mask_and_without_one(monkeypatch):
    monkeypatch.setattr(T.os, "sched_getaffinity", lambda pid: {0, 2, 5})
    assert T.usable_cores() == 3
    monkeypatch.setattr(T.os, "sched_getaffinity", lambda pid: set())
    assert T.usable_cores() == 1  # never 0

    def no_affinity(pid):
        raise OSError("not here")

    monkeypatch.setattr(T.os, "sched_getaffinity", no_affinity)
    monkeypatch.setattr(T.os, "cpu_count", lambda: 3)
    assert T.usable_cores() == 3
    monkeypatch.setattr(T.os, "cpu_count", lambda: None)  # unknown
    assert T.usable_cores() == 1


# ------------------------------------------------------------------------------------------- /proc, hand-written
def _fake_proc(monkeypatch, files: dict[str, bytes], tasks: list[str] | None = None):
    """``open`` and ``os.listdir`` of the module served from ``files`` (decoded as the caller asks)."""

    def fake_open(path, encoding=None, errors=None):
        if path not in files:
            raise FileNotFoundError(path)
        return io.TextIOWrapper(io.BytesIO(files[path]), encoding=encoding or "utf-8", errors=errors)

    monkeypatch.setattr(T, "open", fake_open, raising=False)
    if tasks is not None:
        monkeypatch.setattr(
            T.os, "listdir", lambda path: list(tasks) if path == "/proc/self/task" else os.listdir(path)
        )


def test_loadavg_running_is_the_fourth_fields_numerator(monkeypatch):
    _fake_proc(monkeypatch, {"/proc/loadavg": b"0.52 0.41 0.30 3/245 12345\n"})
    assert T._loadavg_running() == 3


def test_loadavg_running_reads_the_real_file():
    with open("/proc/loadavg") as fh:
        fields = fh.read().split()
    assert T._loadavg_running() >= 1  # at least the thread reading it
    assert int(fields[3].split("/")[1]) >= 1


def test_own_running_counts_state_r_after_the_last_parenthesis(monkeypatch):
    stats = {
        "/proc/self/task/10/stat": b"10 (python) R 1 10 10 0",
        "/proc/self/task/11/stat": b"11 (a) R b) S 1 10 10 0",  # a thread named "a) R b": it sleeps
        "/proc/self/task/13/stat": b"13 (omp\xff) R 1 10 10 0",  # a name that is not ASCII
        "/proc/self/task/14/stat": b"14 (io) D 1 10 10 0",
    }
    # task 12 ended between the listing and the read: skipped, and the reads go on
    _fake_proc(monkeypatch, stats, tasks=["10", "11", "12", "13", "14"])
    assert T._own_running() == 2
    _fake_proc(monkeypatch, {}, tasks=[])
    assert T._own_running() == 0


def test_other_runnable_takes_the_smallest_read_and_waits_a_millisecond(monkeypatch):
    sleeps = []
    monkeypatch.setattr(T.time, "sleep", sleeps.append)
    reads = iter([3, 5, 4])
    monkeypatch.setattr(T, "_loadavg_running", lambda: next(reads))
    monkeypatch.setattr(T, "_own_running", lambda: 1)
    assert T._other_runnable() == 2  # min(3, 5, 4) - 1, not the last read (3)
    assert sleeps == [0.001, 0.001]


def test_other_runnable_falls_back_to_the_load_average_then_to_zero(monkeypatch):
    def unreadable():
        raise OSError("no /proc")

    monkeypatch.setattr(T, "_loadavg_running", unreadable)
    monkeypatch.setattr(T.os, "getloadavg", lambda: (2.6, 0.2, 0.1))
    assert T._other_runnable() == 3  # the rounded 1-minute average

    def no_loadavg():
        raise OSError("none")

    monkeypatch.setattr(T.os, "getloadavg", no_loadavg)
    assert T._other_runnable() == 0


# --------------------------------------------------------------------------------------------- idle-core cache
def test_idle_cores_is_reread_only_after_the_ttl(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(T.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(T, "usable_cores", lambda: 4)
    monkeypatch.setattr(T, "_idle_cache", {"at": -1.0, "value": 0.0})
    monkeypatch.setattr(T, "_other_runnable", lambda: 1)
    assert T.idle_cores() == 3
    monkeypatch.setattr(T, "_other_runnable", lambda: 3)
    clock[0] = 100.0 + T._IDLE_TTL_S  # exactly the TTL later: the cached value
    assert T.idle_cores() == 3
    clock[0] += 1e-6
    assert T.idle_cores() == 1


# ---------------------------------------------------------------------------------------------------- counts
def test_policy_threads_counts(monkeypatch):
    monkeypatch.setattr(T, "idle_cores", lambda: 2)
    with T.torch_threads(2):
        assert T.policy_threads() == 1  # the default kind is "small"
        assert T.policy_threads("small") == 1
        assert T.policy_threads("dense") == 2
        monkeypatch.setattr(T, "idle_cores", lambda: 1)
        assert T.policy_threads("dense") == 1  # a busy core is not waited for
    monkeypatch.setattr(T, "idle_cores", lambda: 4)
    with T.torch_threads(3):
        assert T.policy_threads("dense") == 3  # never more than the caller's count
    with pytest.raises(ValueError, match="kind"):
        T.policy_threads("Small")


def test_pick_and_model_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert T.pick_threads(num_parameters=10) == 1  # CPU is the default device
    assert T.pick_threads(3, num_parameters=10) == 3
    assert T.pick_threads(num_parameters=T.SMALL_MODEL_PARAMETERS) is None
    with pytest.raises(ValueError, match=r"^threads"):
        T.pick_threads(0)
    model = torch.nn.Linear(4, 4)
    assert T.model_threads(None, model, "cpu") == 1
    assert T.model_threads(2, model, "cpu") == 2
    assert T.model_threads(None, model, "meta") is None  # not a CPU run: torch's own count
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert T.model_threads(None, model, "cpu") is None  # the environment's count is torch's already


def test_blas_controller_is_reused_until_a_module_is_imported(monkeypatch):
    pytest.importorskip("threadpoolctl")
    monkeypatch.setattr(T, "_controller", [])
    first = T._blas_controller()
    assert first is not None and T._blas_controller() is first
    monkeypatch.setitem(T.sys.modules, "hf_tdiag_test_new_module", object())
    assert T._blas_controller() is not first
