"""hf_tdiag._threads.torch_threads: the count inside the block, and the caller's count afterwards."""

import os

import pytest
import torch

from hf_tdiag._threads import torch_threads


def test_sets_and_restores_the_thread_count():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads():  # None leaves the count, but still undoes what the block sets
        assert torch.get_num_threads() == before
        torch.set_num_threads(1)
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="inside"):
        with torch_threads(1):
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before


# ---------------------------------------------------------------------------------------------- the thread policy

threadpoolctl = pytest.importorskip("threadpoolctl")


def _limits(paths=None):
    """torch's count and each threadpoolctl-visible library's (api, path, num_threads) (only ``paths``, when given:
    a library first loaded by the call has no limit to restore)."""
    info = [i for i in threadpoolctl.threadpool_info() if paths is None or i["filepath"] in paths]
    return torch.get_num_threads(), sorted((i["user_api"], i["filepath"], i["num_threads"]) for i in info)


def test_measure_threads_sets_the_policy_count_and_restores_torch_and_blas():
    from hf_tdiag._threads import idle_cores, measure_threads, policy_threads

    before = _limits()
    with torch_threads(2):
        assert policy_threads("small") == 1
        assert 1 <= policy_threads("dense") <= min(2, idle_cores())
        with measure_threads("dense") as n:
            assert torch.get_num_threads() == n == policy_threads("dense")
            with measure_threads("small") as m:
                assert m == torch.get_num_threads() == 1
                blas = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
                assert all(b == 1 for b in blas)
            assert torch.get_num_threads() == n
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="kind"):
            policy_threads("large")
    with torch_threads(1):
        assert policy_threads("dense") == 1  # never above the caller's own count
    assert _limits() == before


def test_idle_cores_reads_the_run_queue(monkeypatch):
    import hf_tdiag._threads as T

    monkeypatch.setattr(T, "usable_cores", lambda: 4)
    monkeypatch.setattr(T, "_idle_cache", {"at": -1.0, "value": 0.0})
    monkeypatch.setattr(T, "_other_runnable", lambda: 3)
    assert T.idle_cores() == 1
    monkeypatch.setattr(T, "_idle_cache", {"at": -1.0, "value": 0.0})
    monkeypatch.setattr(T, "_other_runnable", lambda: 9)
    assert T.idle_cores() == 1  # never below one
    monkeypatch.setattr(T, "_idle_cache", {"at": -1.0, "value": 0.0})
    monkeypatch.setattr(T, "_other_runnable", lambda: 1)
    assert T.idle_cores() == 3
    monkeypatch.setattr(T, "_other_runnable", lambda: 0)
    assert T.idle_cores() == 3  # cached for half a second


def test_other_runnable_leaves_out_this_process_threads(monkeypatch):
    import hf_tdiag._threads as T

    monkeypatch.setattr(T.time, "sleep", lambda s: None)
    reads = iter([4, 5, 3])
    monkeypatch.setattr(T, "_loadavg_running", lambda: next(reads))
    monkeypatch.setattr(T, "_own_running", lambda: 2)
    assert T._other_runnable() == 1  # min(4, 5, 3) - 2 own threads (the caller and a spinning worker)
    reads = iter([2, 7])
    monkeypatch.setattr(T, "_loadavg_running", lambda: next(reads))
    assert T._other_runnable() == 0  # a read with nothing else running ends the reads (the 7 is never taken)
    monkeypatch.setattr(T, "_loadavg_running", lambda: 3)
    monkeypatch.setattr(T, "_own_running", lambda: 0)
    assert T._other_runnable() == 2  # the calling thread counts as one of ours even if read asleep


def test_own_running_counts_a_busy_thread_of_this_process():
    import threading

    import hf_tdiag._threads as T

    if not os.path.exists("/proc/self/task"):
        pytest.skip("no /proc/self/task on this platform")
    stop = threading.Event()
    a = torch.randn(256, 256)

    def spin():
        while not stop.is_set():
            a @ a  # releases the GIL: this thread stays in state R

    worker = threading.Thread(target=spin)
    worker.start()
    try:
        counts = [T._own_running() for _ in range(50)]
    finally:
        stop.set()
        worker.join()
    assert max(counts) >= 2  # the reading thread and the worker
    assert min(counts) >= 1  # the reading thread is running while it reads


def _tiny_crate():
    from hf_tdiag import CrateConfig, CrateForImageClassification

    cfg = CrateConfig.from_preset(
        "crate-digits", hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_labels=3
    )
    return CrateForImageClassification(cfg).eval()


def _tiny_bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    return BertModel(cfg).eval()


DIAGNOSTICS = {
    "layer_srr": lambda hf, x: hf.layer_srr(_tiny_crate(), x, batch_size=4, progress=False),
    "schatten_bounds": lambda hf, x: hf.schatten_bounds(_tiny_bert(), num_workers=2),
    "concept_fidelity": lambda hf, x: hf.concept_fidelity(_tiny_crate(), x, 1, 2, power_iters=2, progress=False),
    "attention_svm_diagnostic": lambda hf, x: hf.attention_svm_diagnostic(_tiny_crate(), x, 1, 0, max_queries=8),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DIAGNOSTICS))
@pytest.mark.parametrize("threads", [1, 2])
def test_each_diagnostic_leaves_torch_and_threadpoolctl_as_found(name, threads):
    import hf_tdiag

    x = torch.rand(4, 1, 8, 8)
    with torch_threads(threads), threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = _limits()
        DIAGNOSTICS[name](hf_tdiag, x)
        assert _limits({path for _, path, _ in before[1]}) == before
