"""End to end: a 2x2 grid of real trainings, and a study killed with SIGKILL that continues where it stopped."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from hf_tdiag.measures.correlation import kendall_tau
from hf_tdiag.study import GRIDS, MEASURES, MeasureSettings, run_key, run_study

FAST = MeasureSettings(max_examples=128, batch_size=64, sharpness_steps=2, sharpness_batches=1, pac_samples=2, pac_iters=5)
FAST_KW = (
    "MeasureSettings(max_examples=128, batch_size=64, sharpness_steps=2, sharpness_batches=1, pac_samples=2, pac_iters=5)"
)


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    out = tmp_path_factory.mktemp("study_tiny")
    t0 = time.time()
    # one torch thread everywhere: training is bitwise reproducible only at equal thread counts
    summary = run_study("tiny", str(out), jobs=1, settings=FAST, plot=True, progress=False, threads=1)
    return out, summary, time.time() - t0


def _runs(out):
    runs = {}
    for name in sorted(os.listdir(out / "runs")):
        if name.endswith(".json"):
            runs[name] = (out / "runs" / name).read_bytes()
    return runs


def test_tiny_grid_end_to_end(tiny_study):
    out, summary, seconds = tiny_study
    print(f"2x2 grid end to end: {seconds:.1f}s")
    grid = GRIDS["tiny"]
    assert summary["complete"] and summary["n_runs"] == 4 and not summary["failures"]
    runs = [json.loads(b) for b in _runs(out).values()]
    assert len(runs) == 4
    assert {run_key(r["hparams"], grid.fixed, FAST) for r in runs} == {run_key(h, grid.fixed, FAST) for h in grid.runs()}
    for r in runs:
        t = r["train"]
        # the gap is validation loss minus training loss, as the trainer measured them
        assert t["generalization_gap"] == pytest.approx(t["eval_loss"] - t["train_loss"])
        assert t["variant"] == r["hparams"]["variant"] and t["steps"] <= grid.fixed["max_train_steps"]
        for m in ("srr_mean", "srr_last", "l2_norm", "path_norm", "sum_spectral", "log_prod_spectral", "sharpness", "pac_bayes_flatness"):
            assert isinstance(r["measures"][m], float), (m, r["measure_errors"])
        assert len(r["srr_per_layer"]) == grid.fixed["num_hidden_layers"]
        assert r["measures"]["srr_last"] == pytest.approx(r["srr_per_layer"][-1])
        assert r["measures"]["srr_mean"] == pytest.approx(sum(r["srr_per_layer"]) / len(r["srr_per_layer"]))
    # no trained model is left behind unless asked
    assert not os.listdir(out / "work") if (out / "work").exists() else True
    table = {row["measure"]: row for row in summary["table"]}
    assert list(table) == list(MEASURES)
    gaps = [r["train"]["generalization_gap"] for r in runs]
    for m in ("srr_mean", "l2_norm", "sharpness"):
        assert table[m]["tau"] == pytest.approx(kendall_tau([r["measures"][m] for r in runs], gaps))
        assert set(table[m]["psi_per_axis"]) == set(grid.axes)
    for kind in ("json", "csv", "markdown", "plot"):
        assert os.path.getsize(summary["paths"][kind]) > 0


def test_study_killed_mid_run_continues_and_loses_nothing(tmp_path, tiny_study):
    out = tmp_path / "study"
    script = textwrap.dedent(
        f"""
        from hf_tdiag.study import MeasureSettings, run_study
        if __name__ == "__main__":
            run_study("tiny", {str(out)!r}, settings={FAST_KW}, plot=False, progress=False, threads=1)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if (out / "runs").is_dir() and any(n.endswith(".json") and not n.startswith(".") for n in os.listdir(out / "runs")):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the study finished before it could be killed"
        proc.kill()  # SIGKILL: no cleanup runs in the child
    finally:
        proc.kill()
        proc.wait()
    before = _runs(out)
    assert 1 <= len(before) < 4
    # a writer killed mid-write leaves at most a temporary file; it is never read as a result
    (out / "runs" / ".tmp-killed.json").write_text('{"key": "trunc')

    new = []
    summary = run_study(
        "tiny", str(out), jobs=2, settings=FAST, plot=False, progress=False, on_record=new.append, threads=1
    )
    assert summary["complete"] and summary["n_runs"] == 4 and summary["cached"] == len(before)
    assert len(new) == 4 - len(before)  # only the missing runs were trained
    after = _runs(out)
    assert all(after[name] == data for name, data in before.items())  # cached results untouched
    assert not any(n.startswith(".tmp-") for n in os.listdir(out / "runs"))
    # the continued study (cached runs + the interrupted run resumed from its checkpoint + fresh runs in two
    # worker processes) reaches the same results as the uninterrupted one: same seeds, settings, thread count
    reference = {json.loads(b)["key"]: json.loads(b) for b in _runs(tiny_study[0]).values()}
    for data in after.values():
        rec = json.loads(data)
        ref = reference[rec["key"]]
        assert rec["train"]["generalization_gap"] == pytest.approx(ref["train"]["generalization_gap"], rel=1e-5, abs=1e-7)
        for m in ("l2_norm", "srr_mean", "sharpness"):
            assert rec["measures"][m] == pytest.approx(ref["measures"][m], rel=1e-5, abs=1e-7), m
