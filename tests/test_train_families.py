"""`hf-tdiag train` trains CRATE-α and ToST from their presets with the Accelerate trainer: the saved folder reloads
as that family, its logits on the evaluation digits give the accuracy the run recorded, and what only CRATE has is
refused by name (--variant)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoImageProcessor, AutoModelForImageClassification

import hf_tdiag  # noqa: F401  (registers the families)
from hf_tdiag.cli import main as cli_main
from hf_tdiag.training import train

pytestmark = pytest.mark.slow

TINY = dict(max_train_steps=3, max_train_samples=64, max_eval_samples=32, layer_srr_samples=0, disable_tqdm=True,
            seed=0, learning_rate=1e-3)  # fmt: skip


@pytest.mark.parametrize(
    ("preset", "cls", "model_type"),
    [
        ("crate-alpha-digits", "CrateAlphaForImageClassification", "crate-alpha"),
        ("tost-digits", "TostForImageClassification", "tost"),
    ],  # fmt: skip
)
def test_train_builds_and_saves_the_family_of_the_preset(tmp_path, monkeypatch, preset, cls, model_type):
    monkeypatch.chdir(tmp_path)  # the card names a folder under the working directory by its relative path
    out = tmp_path / "run"
    results = train(output_dir=str(out), preset=preset, hidden_size=32, num_hidden_layers=2, **TINY)
    assert results["variant"] == model_type and results["steps"] == 3 and results["eval_samples"] == 32
    model = AutoModelForImageClassification.from_pretrained(out).eval()
    assert type(model).__name__ == cls and model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    processor = AutoImageProcessor.from_pretrained(out)
    assert processor.size == {"height": 8, "width": 8}
    saved = json.loads((out / "all_results.json").read_text())
    assert saved["eval_accuracy"] == pytest.approx(results["eval_accuracy"])
    # the family's card, with the run's metrics in the model-index and a snippet that names the folder
    from huggingface_hub import ModelCard

    card = ModelCard.load(str(out / "README.md"))
    metrics = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert metrics["accuracy"] == pytest.approx(results["eval_accuracy"]) and model_type in card.data.tags
    assert 'model = AutoModelForImageClassification.from_pretrained("run")' in card.text
    # the recorded accuracy is the reloaded model's on the same evaluation images (the trainer's own datasets)
    from hf_tdiag.training.args import make_args
    from hf_tdiag.training.data import build_datasets, load_raw_data

    args = make_args(output_dir=str(tmp_path / "x"), preset=preset, max_eval_samples=32)
    raw = load_raw_data(args)
    evaluation = build_datasets(args, raw, processor, 1, (8, 8)).eval
    batch = [evaluation[i] for i in range(len(evaluation))]
    pixels = torch.stack([torch.as_tensor(b["pixel_values"]) for b in batch])
    labels = torch.tensor([int(b["labels"]) for b in batch])
    with torch.no_grad():
        logits = model(pixel_values=pixels).logits
    assert len(batch) == 32
    assert float((logits.argmax(-1) == labels).float().mean()) == pytest.approx(results["eval_accuracy"])


def test_train_refuses_a_crate_variant_for_another_family(tmp_path, capsys):
    code = cli_main(["train", "--preset", "tost-digits", "--variant", "crate-c", "--output-dir", str(tmp_path / "r"),
                     "--max-train-steps", "1", "--disable-tqdm"])  # fmt: skip
    assert code != 0
    assert "variant: --variant chooses CRATE's MSSA output matrix" in capsys.readouterr().err
