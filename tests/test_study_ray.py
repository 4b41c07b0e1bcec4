"""The Ray executor: the extra named when missing; with a real local Ray instance, records equal to the local
executor's, a killed driver restarted without a run recorded twice, and a killed task retried or reported."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hf_tdiag.study import MeasureSettings, StudyGrid, run_study

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAKE_TRAIN = '''
import os, signal, time
import torch
import hf_tdiag  # registers CRATE
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification


def train(hparams, fixed, output_dir, max_examples=None):
    """A deterministic stand-in for a training run: a seeded tiny CRATE and seeded examples."""
    os.makedirs(output_dir, exist_ok=True)
    a = int(hparams["a"])
    crash_dir = os.environ.get("STUDY_TEST_CRASH_ONCE")
    if crash_dir and a == 1 and not os.path.exists(os.path.join(crash_dir, "crashed")):
        open(os.path.join(crash_dir, "crashed"), "w").close()
        os.kill(os.getpid(), signal.SIGKILL)  # the task's worker process dies mid-run
    time.sleep(float(os.environ.get("STUDY_TEST_SLEEP", "0")))
    torch.manual_seed(a)
    config = CrateConfig.from_preset("crate-digits", hidden_size=8, num_hidden_layers=1, num_attention_heads=1, num_labels=2)
    model = CrateForImageClassification(config).eval()
    x = torch.randn(16, 1, 8, 8)
    y = (x.mean(dim=(1, 2, 3)) > 0).long()
    results = {"generalization_gap": 0.1 * a, "train_accuracy": 1.0, "eval_accuracy": 1.0 - 0.05 * a,
               "reached_train_loss_target": True}
    return results, model, (x, y)
'''

SMALL = MeasureSettings(max_examples=16, flatness_examples=16, pac_draws=4, flatness_depth=6, sharpness_steps=3)
SMALL_KW = "MeasureSettings(max_examples=16, flatness_examples=16, pac_draws=4, flatness_depth=6, sharpness_steps=3)"
GRID = StudyGrid("fake", axes={"a": [1, 2, 3, 4]})


def test_missing_ray_names_the_extra(monkeypatch, tmp_path, capsys):
    from hf_tdiag.cli import main
    from hf_tdiag.study.executors import get_executor

    monkeypatch.setitem(sys.modules, "ray", None)  # "import ray" now raises ImportError
    with pytest.raises(ImportError, match=r'pip install "hf-tdiag\[ray\]"'):
        get_executor("ray")
    assert main(["study", "--grid", "tiny", "--executor", "ray", "--output_dir", str(tmp_path / "s")]) == 1
    assert 'pip install "hf-tdiag[ray]"' in capsys.readouterr().err
    with pytest.raises(ValueError, match="executor"):
        get_executor("dask")


@pytest.fixture
def fake_train(tmp_path, monkeypatch):
    (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
    # Ray's workers inherit the environment of the instance started from this process
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), REPO, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "fake_train:train"


def _runs(out):
    return {n: (out / "runs" / n).read_bytes() for n in sorted(os.listdir(out / "runs")) if n.endswith(".json")}


def _measured(rec):
    return {
        k: rec[k] for k in ("key", "hparams", "train", "measures", "measure_errors", "measure_details", "srr_per_layer")
    }


@pytest.mark.slow
def test_ray_records_equal_the_local_executors(tmp_path, fake_train):
    pytest.importorskip("ray")
    local = run_study(
        GRID, str(tmp_path / "local"), settings=SMALL, train_fn=fake_train, plot=False, progress=False, threads=1
    )
    remote = run_study(
        GRID,
        str(tmp_path / "ray"),
        settings=SMALL,
        train_fn=fake_train,
        plot=False,
        progress=False,
        threads=1,
        jobs=2,
        executor="ray",
    )
    assert local["n_runs"] == remote["n_runs"] == 4 and not local["failures"] and not remote["failures"]
    a = {json.loads(b)["key"]: _measured(json.loads(b)) for b in _runs(tmp_path / "local").values()}
    b = {json.loads(b)["key"]: _measured(json.loads(b)) for b in _runs(tmp_path / "ray").values()}
    assert a == b  # every measured field, bit for bit (one torch thread in both)
    assert local["table"] == remote["table"]
    again = run_study(
        GRID,
        str(tmp_path / "ray"),
        settings=SMALL,
        train_fn=fake_train,
        plot=False,
        progress=False,
        threads=1,
        executor="ray",
    )
    assert again["cached"] == 4  # nothing left to submit


@pytest.mark.slow
def test_ray_driver_killed_then_restarted_records_every_run_once(tmp_path, fake_train):
    pytest.importorskip("ray")
    out = tmp_path / "study"
    script = textwrap.dedent(
        f"""
        from hf_tdiag.study import MeasureSettings, StudyGrid, run_study
        if __name__ == "__main__":
            run_study(StudyGrid("fake", axes={{"a": [1, 2, 3, 4]}}), {str(out)!r}, settings={SMALL_KW},
                      train_fn={fake_train!r}, plot=False, progress=False, threads=1, jobs=1, executor="ray")
        """
    )
    env = dict(os.environ, STUDY_TEST_SLEEP="3")
    driver = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and driver.poll() is None:
            if (out / "runs").is_dir() and any(
                n.endswith(".json") and not n.startswith(".") for n in os.listdir(out / "runs")
            ):
                break
            time.sleep(0.1)
        assert driver.poll() is None, "the study finished before it could be killed"
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    time.sleep(5)  # Ray's processes share the driver's fate; a straggler would write within its 3 s run
    before = _runs(out)
    assert 1 <= len(before) < 4
    new = []
    summary = run_study(
        GRID,
        str(out),
        settings=SMALL,
        train_fn=fake_train,
        plot=False,
        progress=False,
        threads=1,
        executor="ray",
        on_record=new.append,
    )
    assert summary["n_runs"] == 4 and summary["cached"] == len(before) and len(new) == 4 - len(before)
    after = _runs(out)
    assert len(after) == 4 and all(after[n] == data for n, data in before.items())  # none recorded twice
    assert not any(n.startswith(".tmp-") for n in os.listdir(out / "runs"))


@pytest.mark.slow
@pytest.mark.parametrize("retries", [1, 0])
def test_ray_task_killed_mid_run_is_retried_or_reported(tmp_path, fake_train, monkeypatch, retries):
    pytest.importorskip("ray")
    monkeypatch.setenv("STUDY_TEST_CRASH_ONCE", str(tmp_path))
    out = tmp_path / "study"
    summary = run_study(
        GRID,
        str(out),
        settings=SMALL,
        train_fn=fake_train,
        plot=False,
        progress=False,
        threads=1,
        jobs=2,
        executor="ray",
        executor_options={"max_retries": retries},
    )
    assert (tmp_path / "crashed").exists()  # the first attempt of run a=1 killed its own worker
    keys = {json.loads(b)["hparams"]["a"] for b in _runs(out).values()}
    if retries:
        assert summary["n_runs"] == 4 and not summary["failures"] and keys == {1, 2, 3, 4}
    else:
        assert summary["n_runs"] == 3 and keys == {2, 3, 4}  # reported, never half-written
        (failure,) = summary["failures"]
        assert failure["hparams"] == {"a": 1} and "died" in (failure["error"] + failure["traceback"]).lower()
    assert not any(n.startswith(".tmp-") for n in os.listdir(out / "runs"))
