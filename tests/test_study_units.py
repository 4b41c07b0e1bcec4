"""The study's small pieces by value, in this process: the seed-stability CVs, the failure log entry, the serial
executor, the Ray task's cache check, the worker's helpers (the end-to-end study runs them in worker processes)."""

import json
import math
import os
import statistics

import pytest
import torch

import hf_tdiag  # noqa: F401  (registers CRATE)
from hf_tdiag.measures import sharpness
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
from hf_tdiag.study import MeasureSettings, worker
from hf_tdiag.study import stability as st
from hf_tdiag.study.cache import record_path
from hf_tdiag.study.executors import failure_of
from hf_tdiag.study.executors.local import run_local

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_cv_by_hand():
    assert st._cv([1.0, 2.0, 3.0]) == {"values": [1.0, 2.0, 3.0], "mean": 2.0, "std": 1.0, "cv": 0.5}
    assert st._cv([4.0]) == {"values": [4.0], "mean": 4.0, "std": 0.0, "cv": 0.0}
    assert st._cv([0.0, 0.0])["cv"] is None  # no CV of a zero mean


def test_seed_stability_is_the_cv_of_the_searches_over_seeds():
    torch.manual_seed(0)
    model = CrateForImageClassification(
        CrateConfig.from_preset("crate-digits", hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    ).eval()
    x = torch.randn(10, 1, 8, 8)
    with torch.no_grad():
        y = model(pixel_values=x).logits.argmax(1)
    settings = MeasureSettings(
        max_examples=8, flatness_examples=6, batch_size=4, flatness_depth=3, flatness_target=0.2, magnitude_eps=0.01
    )
    out = st.seed_stability(model, x, y, settings, seeds=3, draws=(2, 3))
    # the reference: each search called directly on the first 6 examples in batches of 4, seeds 0, 1, 2
    params = [p for p in model.parameters() if p.requires_grad]
    batches = [(x[:4], y[:4]), (x[4:6], y[4:6])]
    search = dict(target=0.2, tolerance=settings.flatness_tolerance, depth=3, sigma_max=settings.flatness_upper)

    def logits_fn(inputs):
        return model(pixel_values=inputs).logits.float()

    assert set(out) == {"pacbayes_flatness", "pacbayes_flatness_mag"}
    for d in (2, 3):
        for name, extra in (("pacbayes_flatness", {}), ("pacbayes_flatness_mag", {"eps": 0.01})):
            fn = getattr(sharpness, name)
            ref = [fn(logits_fn, params, batches, draws=d, seed=s, **search, **extra)["flatness"] for s in range(3)]
            got = out[name][d]
            assert got["values"] == pytest.approx(ref, rel=1e-12)
            assert got["mean"] == pytest.approx(statistics.fmean(ref))
            assert got["std"] == pytest.approx(statistics.stdev(ref))
            assert got["cv"] == pytest.approx(statistics.stdev(ref) / statistics.fmean(ref))
    with pytest.raises(ValueError, match="seeds"):
        st.seed_stability(model, x, y, settings, seeds=1)


def test_failure_entry_and_the_serial_executor_report_every_run():
    def task(spec):
        if spec["hparams"]["lr"] < 0:
            raise ValueError("negative lr")
        return {"key": spec["key"], "value": 2 * spec["hparams"]["lr"]}

    specs = [{"key": "a", "hparams": {"lr": 1.0}}, {"key": "b", "hparams": {"lr": -1.0}}]
    seen = []
    run_local(specs, jobs=1, on_done=lambda spec, rec, fail: seen.append((spec["key"], rec, fail)), task=task)
    assert seen[0] == ("a", {"key": "a", "value": 2.0}, None)
    key, rec, fail = seen[1]
    assert key == "b" and rec is None
    assert fail["hparams"] == {"lr": -1.0} and fail["error"] == "ValueError: negative lr"
    assert "raise ValueError" in fail["traceback"]
    try:
        raise KeyError("k")
    except KeyError as err:
        assert failure_of({"hparams": {"x": 1}}, err, "tb") == {
            "hparams": {"x": 1},
            "error": "KeyError: 'k'",
            "traceback": "tb",
        }


def test_ray_task_returns_the_cached_record_without_training(tmp_path, monkeypatch):
    from hf_tdiag.study.executors import ray as ray_executor

    study = str(tmp_path)
    record = {"key": "k1", "train": {}, "measures": {"l2": 1.5}}
    path = record_path(study, "k1")
    (tmp_path / "runs").mkdir()
    with open(path, "w") as f:
        json.dump(record, f)
    monkeypatch.setattr(ray_executor, "execute", lambda spec: {"trained": spec["key"]})
    assert ray_executor.execute_once({"study_dir": study, "key": "k1"}) == record
    assert ray_executor.execute_once({"study_dir": study, "key": "k2"}) == {"trained": "k2"}


def test_worker_helpers():
    assert worker._import_callable("math:sqrt") is math.sqrt
    with pytest.raises(ValueError, match="module:function"):
        worker._import_callable("math.sqrt")
    summary = worker._train_summary({"a": 1.0, "b": float("nan"), "c": float("inf"), "d": "x", "e": [1], "f": None})
    assert summary == {"a": 1.0, "b": None, "c": None, "d": "x", "f": None}
    kwargs = worker._trainer_kwargs({"learning_rate": 0.1}, {"max_train_steps": 5, "disable_tqdm": False})
    assert kwargs == {
        "disable_tqdm": False,
        "layer_srr_samples": 0,
        "checkpointing_steps": "epoch",
        "checkpoints_total_limit": 1,
        "overwrite_output_dir": True,
        "max_train_steps": 5,
        "learning_rate": 0.1,
        "resume_from_checkpoint": "latest",  # a run killed mid-way resumes from its checkpoint
    }
    assert "resume_from_checkpoint" not in worker._trainer_kwargs({}, {"checkpointing_steps": None})


def test_worker_examples_from_a_pair_or_a_dataset():
    x, y = torch.arange(12.0).reshape(6, 2), torch.arange(6)
    px, py = worker.examples_tensors((x, y), 4)
    assert torch.equal(px, x[:4]) and torch.equal(py, y[:4])
    items = [{"pixel_values": x[i], "labels": int(y[i])} for i in range(6)]
    dx, dy = worker.examples_tensors(items, 10)  # fewer than asked: all of them
    assert torch.equal(dx, x) and torch.equal(dy, y)


@pytest.mark.parametrize("keep", [True, False])
def test_execute_one_run_in_this_process(tmp_path, keep):
    from dataclasses import asdict

    import numpy as np
    from PIL import Image

    from hf_tdiag.loading import load_image_processor
    from hf_tdiag.training import args as targs
    from hf_tdiag.training import data

    settings = MeasureSettings(
        max_examples=16, flatness_examples=8, batch_size=8, flatness_depth=2, sharpness_steps=1, pac_draws=2
    )
    fixed = dict(
        max_train_steps=2,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_train_samples=64,
        max_eval_samples=32,
        per_device_train_batch_size=32,
    )
    spec = {
        "key": "run0",
        "study_dir": str(tmp_path),
        "hparams": {"learning_rate": 1e-3},
        "fixed": fixed,
        "settings": asdict(settings),
        "keep_models": keep,
    }
    rec = worker.execute(spec)
    with open(record_path(str(tmp_path), "run0")) as f:
        assert json.load(f) == json.loads(json.dumps(rec))
    assert rec["train"]["steps"] == 2 and rec["model_config"]["hidden_size"] == 16
    work = tmp_path / "work" / "run0"
    assert work.is_dir() == keep
    if keep:  # the measures are of the saved model, on the first 16 training images as the processor gives them
        model, examples = worker.load_trained(spec["hparams"], fixed, str(work), max_examples=16)
        weights = [p.detach().double() for n, p in model.named_parameters() if p.ndim == 2 and "position" not in n]
        weights = [w for w in weights if w.shape != (1, 16)]  # the CLS token is a parameter, not a weight matrix
        assert rec["measures"]["l2"] == pytest.approx(sum(float((w**2).sum()) for w in weights), rel=1e-6)
        px, py = worker.examples_tensors(examples, 16)
        raw = data.load_raw_data(targs.make_args(output_dir=str(tmp_path / "x"), max_train_samples=16))
        processor = load_image_processor(str(work))
        images = [Image.fromarray(a).convert("L") for a in raw.train["images"][:16]]
        expected = processor(images, return_tensors="pt")["pixel_values"]
        np.testing.assert_allclose(px.numpy(), expected.numpy(), atol=1e-6)
        assert py.tolist() == raw.train["labels"][:16].tolist()


CALLS = []


def _fake_train(hparams, fixed, output_dir, max_examples=None):
    """A study train_fn: an untrained tiny CRATE and 12 random examples, the gap set by the grid's axis."""
    CALLS.append(hparams["gap"])
    torch.manual_seed(0)
    model = CrateForImageClassification(
        CrateConfig.from_preset(
            "crate-digits", hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_labels=10
        )
    )
    x = torch.randn(12, 1, 8, 8)
    return {"generalization_gap": hparams["gap"], "eval_accuracy": 0.5}, model, (x, torch.arange(12) % 10)


def test_run_study_writes_its_manifest_and_reuses_the_cache(tmp_path):
    from dataclasses import asdict

    from hf_tdiag.study import StudyGrid, run_study
    from hf_tdiag.study.cache import STUDY_VERSION

    grid = StudyGrid("unit", axes={"gap": [0.1, 0.3]}, fixed={"max_train_steps": 1})
    settings = MeasureSettings(max_examples=12, flatness_examples=4, flatness_depth=1, sharpness_steps=1, pac_draws=1)
    CALLS.clear()
    kwargs = dict(settings=settings, train_fn="test_study_units:_fake_train", plot=False, progress=False)
    run_study(grid, str(tmp_path), **kwargs)
    with open(tmp_path / "study.json") as f:
        manifest = json.load(f)
    assert manifest == {
        "grid": {"name": "unit", "axes": {"gap": [0.1, 0.3]}, "fixed": {"max_train_steps": 1}, "description": ""},
        "settings": asdict(settings),
        "version": STUDY_VERSION,
        "train_fn": "test_study_units:_fake_train",
    }
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(runs) == 2 and CALLS == [0.1, 0.3]
    gaps = sorted(json.load(open(tmp_path / "runs" / r))["train"]["generalization_gap"] for r in runs)
    assert gaps == [0.1, 0.3]
    run_study(grid, str(tmp_path), **kwargs)  # everything cached: nothing is trained again
    assert CALLS == [0.1, 0.3]


def test_worker_init_sets_threads_and_takes_one_gpu_from_the_queue(monkeypatch):
    import queue

    from hf_tdiag.study.executors.local import _init_worker

    before = torch.get_num_threads()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "unset-by-test")
    try:
        _init_worker(1)  # no GPU queue: CUDA_VISIBLE_DEVICES is left alone
        assert torch.get_num_threads() == 1 and os.environ["CUDA_VISIBLE_DEVICES"] == "unset-by-test"
        q = queue.Queue()
        q.put(3)
        q.put(5)
        _init_worker(0, q)  # threads clamp to at least 1; the worker takes the first free GPU
        assert torch.get_num_threads() == 1 and os.environ["CUDA_VISIBLE_DEVICES"] == "3" and q.get_nowait() == 5
    finally:
        torch.set_num_threads(before)
