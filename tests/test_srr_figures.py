"""The SRR paper figures: MSSA-step compression, SRR across training, linear probe vs SRR (probes, measures, recipes)."""

import importlib.util
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from hf_tdiag.diagnostics.mssa_step import mssa_step_compression
from hf_tdiag.measures.linear_probe import linear_probe_accuracy
from hf_tdiag.probes.layer_features import layer_features

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _recipe(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "recipes", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mssa_step_is_the_models_step_and_crate_c_compresses_less():
    out = mssa_step_compression([0.0, 0.25, 0.5], num_tokens=12, hidden_size=16, num_heads=4, seeds=[0, 1, 2])
    # kappa = 0 is Rc(Z; U) of the Gaussian tokens, computed here by hand (token side, float64)
    g = torch.Generator().manual_seed(0)
    Z = torch.randn(1, 12, 16, generator=g, dtype=torch.float64)[0]
    basis, _ = torch.linalg.qr(torch.randn(16, 16, generator=g, dtype=torch.float64))
    U = basis.reshape(16, 4, 4).permute(1, 0, 2)
    by_hand = sum(
        0.5 * torch.linalg.slogdet(torch.eye(12, dtype=torch.float64) + 4 / (12 * 0.01) * (Z @ U[k]) @ (Z @ U[k]).T)[1]
        for k in range(4)
    )
    for variant in out["variants"]:
        assert out["Rc"][variant][0][0] == pytest.approx(float(by_hand), rel=1e-10)
    rc = {v: np.asarray(c) for v, c in out["Rc"].items()}
    # Hu et al.: the CRATE-C step raises Rc, the CRATE-N step (output -U) lowers it, for every draw
    assert (rc["crate-c"][:, 1] > rc["crate-c"][:, 0]).all() and (rc["crate-n"][:, 1] < rc["crate-n"][:, 0]).all()
    with pytest.raises(ValueError, match="variants"):
        mssa_step_compression([0.0], variants=["crate-x"])


def test_linear_probe_and_layer_features():
    g = np.random.default_rng(0)
    x = np.concatenate([g.normal(-2, 1, (40, 3)), g.normal(2, 1, (40, 3))])
    y = np.repeat([0, 1], 40)
    assert linear_probe_accuracy(x[::2], y[::2], x[1::2], y[1::2]) == 1.0  # separable
    noise = g.normal(0, 1, (80, 3))
    assert linear_probe_accuracy(noise[::2], y[::2], noise[1::2], y[1::2]) < 0.8
    with pytest.raises(ValueError, match="train_x"):
        linear_probe_accuracy(x, y, x[:, :2], y)

    from hf_tdiag import CrateConfig, CrateForImageClassification

    model = CrateForImageClassification(
        CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2)
    ).eval()
    batches = [torch.randn(3, 1, 8, 8), torch.randn(2, 1, 8, 8)]
    feats = layer_features(model, batches)
    with torch.no_grad():
        hidden = [model(b, output_hidden_states=True).hidden_states for b in batches]
    assert len(feats) == 3 and feats[0].shape == (5, 64)
    for ell in range(3):
        torch.testing.assert_close(feats[ell], torch.cat([h[ell].mean(1) for h in hidden]).double())
    cls = layer_features(model, batches, pool="cls")
    torch.testing.assert_close(cls[2], torch.cat([h[2][:, 0] for h in hidden]).double())


def test_mssa_step_recipe_writes_png_and_json(tmp_path):
    assert (
        _recipe("fig_mssa_step").main(
            [
                "--output-dir",
                str(tmp_path),
                "--num-steps",
                "3",
                "--seeds",
                "2",
                "--num-tokens",
                "8",
                "--hidden-size",
                "8",
                "--num-heads",
                "2",
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "mssa_step.json").read_text())
    assert data["step_sizes"] == [0.0, 2.0, 4.0] and set(data["Rc"]) == {"crate", "crate-c", "crate-n", "crate-t"}
    with Image.open(tmp_path / "mssa_step.png") as im:
        assert im.format == "PNG"


TINY_MSSA = ["--num-steps", "3", "--seeds", "2", "--num-tokens", "8", "--hidden-size", "8", "--num-heads", "2"]


def test_mssa_step_recipe_refuses_its_earlier_figure_and_replaces_it_with_the_flag(tmp_path, capsys):
    recipe = _recipe("fig_mssa_step")
    (tmp_path / "mssa_step.json").write_text('{"earlier": true}')
    assert recipe.main(["--output-dir", str(tmp_path), *TINY_MSSA]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fig_mssa_step: ") and "--overwrite-output-dir" in err, err
    assert "mssa_step.json" in err
    assert [p.name for p in tmp_path.iterdir()] == ["mssa_step.json"]
    assert (tmp_path / "mssa_step.json").read_text() == '{"earlier": true}'
    from hf_tdiag._outputs import adopt_outputs

    adopt_outputs(tmp_path, ["mssa_step.json"])  # an earlier run's, as its manifest records (issue 45)
    assert recipe.main(["--output-dir", str(tmp_path), *TINY_MSSA, "--overwrite-output-dir"]) == 0
    assert json.loads((tmp_path / "mssa_step.json").read_text())["step_sizes"] == [0.0, 2.0, 4.0]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".hf-tdiag-manifest.json") == [
        "mssa_step.json",
        "mssa_step.png",
    ]


@pytest.fixture(scope="module")
def tiny_history_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig") / "run"
    from hf_tdiag.training import train

    train(
        output_dir=str(out),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_train_samples=128,
        max_eval_samples=32,
        num_train_epochs=2,
        track_srr_every="epoch",
        track_srr_samples=16,
        layer_srr_samples=0,
        disable_tqdm=True,
        seed=1,
        after_fit=[],
    )
    return out


def test_srr_training_recipe_plots_the_history(tiny_history_run, tmp_path):
    history = tiny_history_run / "srr_history.json"
    assert _recipe("fig_srr_training").main(["--history", str(history), "--output-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "srr_training.json").read_text())
    assert [r["step"] for r in data["history"]] == [0, 2, 4] and data["summary"]["steps"] == [
        0,
        4,
    ]  # 128 images / 64 a batch
    with Image.open(tmp_path / "srr_training.png") as im:
        assert im.format == "PNG"


def test_linear_probe_recipe_on_a_trained_model(tiny_history_run, tmp_path):
    assert _recipe("fig_linear_probe").main(["--model", str(tiny_history_run), "--output-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "linear_probe.json").read_text())
    assert (
        data["layers"] == [0, 1, 2]
        and len(data["probe_accuracy"]) == 3
        and -1 <= data["kendall_tau_srr_vs_accuracy"] <= 1
    )
    # the SRR column is layer_srr of the same model on the test images: layer 0 = embeddings, l = block outputs
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from hf_tdiag import layer_srr
    from hf_tdiag.training.data import digits_split

    model = AutoModelForImageClassification.from_pretrained(str(tiny_history_run)).eval()
    processor = AutoImageProcessor.from_pretrained(str(tiny_history_run))
    x = processor([Image.fromarray(i) for i in digits_split()[1]], return_tensors="pt")["pixel_values"]
    rep = layer_srr(model, x, batch_size=128, progress=False)
    np.testing.assert_allclose(data["srr"], [rep.embeddings["mean"]["srr"]] + rep.per_layer("srr"), rtol=1e-6)
    with Image.open(tmp_path / "linear_probe.png") as im:
        assert im.format == "PNG"
