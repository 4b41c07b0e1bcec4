"""The Space's default model cache: trained once (threads and processes), atomic, retried after a failure.

The training function is replaced here by one that saves a small random CRATE (the real recipe runs in
``test_space_app.py``); what is tested is the caching around it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from hf_tdiag.gradio_app import default_model

FAKE_TRAIN = """
def fake_train(counter, delay=0.0, fail=False, **kwargs):
    import time
    import torch
    from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor

    with open(counter, "a") as fh:
        fh.write(kwargs["variant"] + "\\n")
    time.sleep(delay)
    cfg = CrateConfig.from_preset(kwargs["preset"], num_labels=10, variant=kwargs["variant"])
    torch.manual_seed(0)
    CrateForImageClassification(cfg).save_pretrained(kwargs["output_dir"])
    if fail:
        raise RuntimeError("training crashed")
    CrateImageProcessor.for_config(cfg).save_pretrained(kwargs["output_dir"])
    return {}
"""


@pytest.fixture()
def fake_train(monkeypatch, tmp_path):
    import hf_tdiag.training as training

    namespace: dict = {}
    exec(FAKE_TRAIN, namespace)
    counter = tmp_path / "calls.txt"
    state = {"delay": 0.0, "fail": False}

    def train(**kwargs):
        return namespace["fake_train"](str(counter), state["delay"], state["fail"], **kwargs)

    monkeypatch.setattr(training, "train", train, raising=False)
    monkeypatch.setenv(default_model.CACHE_ENV, str(tmp_path / "cache"))
    return counter, state


def _calls(counter) -> list[str]:
    return counter.read_text().split() if counter.exists() else []


def test_trained_once_even_with_concurrent_threads(fake_train):
    counter, state = fake_train
    state["delay"] = 0.5
    results, errors = [], []

    def worker():
        try:
            results.append(default_model.ensure_default_model("crate-n"))
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _calls(counter) == ["crate-n"]
    assert len(set(results)) == 1 and default_model.is_complete(results[0])
    assert results[0] == default_model.default_model_dir("crate-n")
    # no temporary folders left next to it
    assert sorted(p.name for p in results[0].parent.iterdir() if not p.name.endswith(".lock")) == [results[0].name]


def test_failed_training_leaves_nothing_and_is_retried(fake_train):
    counter, state = fake_train
    state["fail"] = True
    with pytest.raises(RuntimeError, match="crashed"):
        default_model.ensure_default_model()
    target = default_model.default_model_dir()
    assert not target.exists()
    assert [p.name for p in target.parent.iterdir() if not p.name.endswith(".lock")] == []
    state["fail"] = False
    assert default_model.is_complete(default_model.ensure_default_model())
    assert _calls(counter) == ["crate", "crate"]
    default_model.ensure_default_model()  # cached now
    assert len(_calls(counter)) == 2
    default_model.ensure_default_model(force=True)
    assert len(_calls(counter)) == 3


def test_unknown_variant_is_rejected():
    with pytest.raises(ValueError, match="variant"):
        default_model.default_model_dir("crate-z")


def test_two_processes_train_once(tmp_path):
    counter = tmp_path / "calls.txt"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    script = textwrap.dedent(
        f"""
        import os, sys, time
        import hf_tdiag.training as training
        from hf_tdiag.gradio_app import default_model
        {textwrap.indent(FAKE_TRAIN, " " * 8).strip()}
        training.train = lambda **kw: fake_train({str(counter)!r}, 1.5, False, **kw)
        open(os.path.join({str(barrier)!r}, sys.argv[1]), "w").close()
        while len(os.listdir({str(barrier)!r})) < 2:  # both processes imported: start together
            time.sleep(0.01)
        print(default_model.ensure_default_model())
        """
    )
    env = {**os.environ, default_model.CACHE_ENV: str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert outs[0][0].strip() == outs[1][0].strip() != ""
    assert _calls(counter) == ["crate"]
