"""recipes/fig_srr_training.py and recipes/fig_linear_probe.py never lose an earlier run (issue 29): a second run into
the same folders is refused with a one-line message naming --overwrite-output-dir — a flag they now have — and
leaves the earlier files byte-identical; with the flag the figure and its JSON are replaced."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _recipe(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "recipes", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _history(path):
    """An srr_history.json as the trainer writes it: two records of a 2-layer model."""
    records = [
        {"step": step, "output": {t: [3.0 - step, 2.0 - step] for t in ("Rc", "sparsity", "srr")}} for step in (0, 1)
    ]
    path.write_text(json.dumps({"variant": "crate", "history": records}))
    return path


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(".hf-")}


def test_srr_training_recipe_refuses_an_earlier_result_before_plotting(tmp_path, capsys):
    recipe = _recipe("fig_srr_training")
    out = tmp_path / "figs"
    out.mkdir()
    (out / "srr_training.png").write_bytes(b"earlier figure")
    history = _history(tmp_path / "srr_history.json")
    assert recipe.main(["--history", str(history), "--output-dir", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--overwrite-output-dir" in err and "srr_training.png" in err, err
    assert _snapshot(out) == {"srr_training.png": b"earlier figure"}


@pytest.mark.slow  # two figures (~3 s)
def test_srr_training_recipe_refuses_a_second_run_and_replaces_with_the_flag(tmp_path, capsys):
    recipe = _recipe("fig_srr_training")
    out = tmp_path / "figs"
    history = _history(tmp_path / "srr_history.json")
    assert recipe.main(["--history", str(history), "--output-dir", str(out)]) == 0
    first = _snapshot(out)
    assert set(first) == {"srr_training.json", "srr_training.png"}
    capsys.readouterr()
    assert recipe.main(["--history", str(history), "--output-dir", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--overwrite-output-dir" in err and "srr_training.json" in err, err
    assert _snapshot(out) == first  # nothing removed or rewritten
    _history(history).write_text(history.read_text().replace('"crate"', '"crate-t"'))
    assert recipe.main(["--history", str(history), "--output-dir", str(out), "--overwrite-output-dir"]) == 0
    assert json.loads((out / "srr_training.json").read_text())["variant"] == "crate-t"  # the new run's


@pytest.mark.slow  # imports the trainer (~7 s)
def test_srr_training_recipe_refuses_a_run_folder_holding_a_model_before_training(tmp_path, capsys):
    """The training run's folder (``--run-dir``) is claimed by the trainer, whose message names the recipe's flag."""
    recipe = _recipe("fig_srr_training")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"model_type": "crate"}')  # an earlier run's model
    assert recipe.main(["--output-dir", str(tmp_path / "figs"), "--run-dir", str(run)]) == 1
    err = capsys.readouterr().err
    assert "--overwrite-output-dir" in err and "config.json" in err, err
    assert (run / "config.json").read_text() == '{"model_type": "crate"}' and sorted(os.listdir(run)) == ["config.json"]


@pytest.fixture
def tiny_crate(tmp_path):
    from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification, CrateImageProcessor

    torch.manual_seed(0)
    cfg = CrateConfig.from_preset(
        "crate-digits", num_labels=10, num_hidden_layers=1, hidden_size=16, num_attention_heads=2
    )
    folder = tmp_path / "model"
    CrateForImageClassification(cfg).save_pretrained(folder)
    CrateImageProcessor.for_config(cfg).save_pretrained(folder)
    return folder


def test_linear_probe_recipe_refuses_an_earlier_result_before_measuring(tiny_crate, tmp_path, capsys):
    recipe = _recipe("fig_linear_probe")
    out = tmp_path / "figs"
    out.mkdir()
    (out / "linear_probe.json").write_text('{"earlier": true}')
    assert recipe.main(["--model", str(tiny_crate), "--output-dir", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--overwrite-output-dir" in err and "linear_probe.json" in err, err
    assert _snapshot(out) == {"linear_probe.json": b'{"earlier": true}'}


@pytest.mark.slow  # measures a linear probe per layer (~3 s)
def test_linear_probe_recipe_with_the_flag_replaces_the_earlier_result(tiny_crate, tmp_path):
    recipe = _recipe("fig_linear_probe")
    out = tmp_path / "figs"
    out.mkdir()
    (out / "linear_probe.json").write_text('{"earlier": true}')
    from hf_tdiag._outputs import adopt_outputs

    adopt_outputs(out, ["linear_probe.json"])  # an earlier run's, as its manifest records (issue 45)
    assert recipe.main(["--model", str(tiny_crate), "--output-dir", str(out), "--overwrite-output-dir"]) == 0
    data = json.loads((out / "linear_probe.json").read_text())
    assert "earlier" not in data and len(data["probe_accuracy"]) == 2  # embeddings and the one block
    assert (out / "linear_probe.png").read_bytes()[:4] == b"\x89PNG"
