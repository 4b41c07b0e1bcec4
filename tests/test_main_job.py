"""The README's main command, ``recipes/main_job.py``, on a short budget: every number it writes is recomputed
independently from the saved folder (reload with the Auto classes, classify, SRR by hand, accuracy by hand)."""

import importlib.util
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image
from script_files import folder_bytes as _snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = [
    "--num-train-epochs",
    "2",
    "--max-train-samples",
    "256",
    "--max-eval-samples",
    "64",
    "--hidden-size",
    "16",
    "--num-hidden-layers",
    "2",
    "--num-attention-heads",
    "2",
    "--layer-srr-samples",
    "16",
    "--per-device-train-batch-size",
    "64",
    "--disable-tqdm",
    "--seed",
    "3",
]


def _recipe():
    spec = importlib.util.spec_from_file_location("main_job", os.path.join(ROOT, "recipes", "main_job.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("main") / "runs" / "main"
    code = _recipe().main(["--output-dir", str(out), *FLAGS])
    return code, out


def _reload(out):
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    import hf_tdiag  # noqa: F401

    return AutoModelForImageClassification.from_pretrained(str(out)).eval(), AutoImageProcessor.from_pretrained(
        str(out)
    )


def _test_split():
    from hf_tdiag.inputs import digits_split

    _, x_test, _, y_test = digits_split()
    return x_test, np.asarray(y_test)


def _pixels(processor, images):
    return processor([Image.fromarray(np.asarray(i)) for i in images], return_tensors="pt")["pixel_values"]


def test_main_job_writes_every_promised_file(main_job):
    code, out = main_job
    assert code == 0
    for name in (
        "model.safetensors",
        "config.json",
        "preprocessor_config.json",
        "README.md",
        "all_results.json",
        "layer_srr.json",
        "layer_srr.png",
        "report.html",
        "report.json",
        "main_job.json",
    ):
        assert (out / name).is_file(), name
    assert any(p.name.endswith(".py") for p in out.iterdir())  # the remote-code files


def test_reloaded_accuracy_is_the_saved_models_accuracy_on_the_held_out_split(main_job):
    _, out = main_job
    summary = json.loads((out / "main_job.json").read_text())
    model, processor = _reload(out)
    x_test, y_test = _test_split()
    pixel_values = _pixels(processor, x_test)
    assert pixel_values.shape[-1] == model.config.image_size
    with torch.no_grad():
        predictions = model(pixel_values=pixel_values).logits.argmax(-1).numpy()
    assert summary["num_test_images"] == len(y_test) == 360
    assert summary["reloaded_test_accuracy"] == pytest.approx(float((predictions == y_test).mean()), abs=1e-12)
    assert summary["report"] == str(out / "report.html")
    # the trainer's own evaluation: the first 64 held-out images (--max-eval-samples 64)
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_samples"] == 64
    assert results["eval_accuracy"] == pytest.approx(float((predictions[:64] == y_test[:64]).mean()), abs=1e-6)
    with torch.no_grad():
        eval_loss = torch.nn.functional.cross_entropy(
            model(pixel_values=pixel_values[:64]).logits, torch.as_tensor(y_test[:64])
        )
    assert results["eval_loss"] == pytest.approx(float(eval_loss), rel=1e-5)
    for key in ("eval_accuracy", "eval_loss", "train_loss", "generalization_gap"):
        assert summary[key] == results[key]


def test_layer_srr_json_is_the_srr_of_the_block_outputs_by_hand(main_job):
    from test_srr_probes import _by_hand

    _, out = main_job
    saved = json.loads((out / "layer_srr.json").read_text())
    model, processor = _reload(out)
    x_test, _ = _test_split()
    with torch.no_grad():
        hidden = model(pixel_values=_pixels(processor, x_test[:16]), output_hidden_states=True).hidden_states
    K = model.config.num_attention_heads
    assert saved["num_samples"] == 16 and saved["layers"] == [1, 2]
    for ell in (1, 2):
        qkv = model.crate.encoder.layer[ell - 1].attention.qkv.weight.detach()
        U = qkv.reshape(K, -1, qkv.shape[1]).transpose(1, 2)
        terms = torch.stack([_by_hand(z, U, 0.1, 1.0) for z in hidden[ell]]).mean(0)
        for i, term in enumerate(("R", "Rc", "sparsity", "srr")):
            assert saved["mean"]["output"][term][ell - 1] == pytest.approx(float(terms[i]), rel=1e-6, abs=1e-9)
    U1 = model.crate.encoder.layer[0].attention.qkv.weight.detach().reshape(K, -1, 16).transpose(1, 2)
    emb = torch.stack([_by_hand(z, U1, 0.1, 1.0) for z in hidden[0]]).mean(0)
    assert saved["embeddings"]["mean"]["srr"] == pytest.approx(float(emb[3]), rel=1e-6)


def test_report_numbers_are_the_models_predictions_on_64_test_images(main_job):
    _, out = main_job
    report = json.loads((out / "report.json").read_text())
    sections = report["sections"]
    assert {k: s["status"] for k, s in sections.items()} == dict.fromkeys(
        ("summary", "srr", "schatten", "concept_fidelity", "attention_svm", "objective_ledger"), "ok"
    )
    model, processor = _reload(out)
    x_test, y_test = _test_split()
    with torch.no_grad():
        probs = model(pixel_values=_pixels(processor, x_test[:64])).logits.softmax(-1)
    numbers = sections["summary"]["numbers"]
    assert numbers["num_inputs"] == 64
    assert numbers["predictions"] == probs.argmax(-1).tolist()
    np.testing.assert_allclose(numbers["confidence"], probs.max(-1).values.numpy(), rtol=1e-5)
    assert numbers["accuracy"] == pytest.approx(float((probs.argmax(-1).numpy() == y_test[:64]).mean()))
    n_params = sum(p.numel() for p in model.parameters())
    assert numbers["num_parameters"] == n_params and numbers["num_layers"] == 2 and numbers["hidden_size"] == 16


@pytest.mark.parametrize("earlier", ["main_job.json", "report.html", "config.json"])
def test_main_job_refuses_a_folder_holding_an_earlier_run_before_any_work(earlier, tmp_path, capsys):
    out = tmp_path / "main"
    out.mkdir()
    (out / earlier).write_text('{"earlier": true}')
    recipe = _recipe()
    assert recipe.main(["--output-dir", str(out), *FLAGS]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("main_job: ") and "--overwrite-output-dir" in err, err
    assert earlier in err
    assert _snapshot(out) == {earlier: b'{"earlier": true}'}


@pytest.mark.slow  # trains the tiny CRATE and writes its report again (~15 s)
def test_main_job_with_the_flag_replaces_the_earlier_run(tmp_path, capsys):
    out = tmp_path / "main"
    out.mkdir()
    (out / "main_job.json").write_text('{"earlier": true}')
    (out / "report.html").write_text("an earlier report")
    (out / "notes.txt").write_text("mine")
    from hf_tdiag._outputs import adopt_outputs

    adopt_outputs(out, ["main_job.json", "report.html"])  # an earlier run's, as its manifest records (issue 45)
    assert _recipe().main(["--output-dir", str(out), *FLAGS, "--overwrite-output-dir"]) == 0
    summary = json.loads((out / "main_job.json").read_text())
    assert "earlier" not in summary and summary["report"] == str(out / "report.html")
    assert (out / "report.html").read_text() != "an earlier report" and (out / "notes.txt").read_text() == "mine"
