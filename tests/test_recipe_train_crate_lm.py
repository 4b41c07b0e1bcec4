"""``recipes/train_crate_lm.py`` on a tiny setting: every model's validation loss falls, the baselines match the CRATE
models' parameter counts, and the reported perplexity of the saved causal model is recomputed here from its folder."""

import importlib.util
import json
import math
import os

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _recipe():
    spec = importlib.util.spec_from_file_location("train_crate_lm", os.path.join(ROOT, "recipes", "train_crate_lm.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_run_learns_matches_parameters_and_reports_true_perplexity(tmp_path):
    from pydoc_data.topics import topics

    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = _recipe()
    out = tmp_path / "run"
    args = ["--output-dir", str(out), "--steps", "12", "--classify-steps", "2", "--hidden-size", "16"]
    args += ["--layers", "1", "--heads", "2", "--vocab-size", "300", "--block-size", "32", "--lr", "3e-3"]
    args += ["--max-train-topics", "12", "--topics", "3"]
    assert recipe.main(args) == 0
    results = json.loads((out / "results.json").read_text())
    rows = results["pretraining"]
    assert set(rows) == {"crate-clm", "gpt2", "crate-mlm", "bert"}
    for name, row in rows.items():
        assert row["val_loss_after"] < row["val_loss_before"], name
        assert row["val_perplexity_after"] == pytest.approx(math.exp(row["val_loss_after"]))
    for crate, baseline in (("crate-clm", "gpt2"), ("crate-mlm", "bert")):
        assert abs(rows[baseline]["parameters"] - rows[crate]["parameters"]) <= 0.01 * rows[crate]["parameters"]
    cls = results["classification"]
    assert len(cls["topics"]) == 3 and all(0.0 <= cls[name]["val_accuracy"] <= 1.0 for name in rows)
    # the saved initialisation is the model before its first step: its loss is the reported "before"
    assert _val_loss(out / "crate-clm-init", 32) == pytest.approx(rows["crate-clm"]["val_loss_before"], rel=1e-4)

    # the validation perplexity of the saved CRATE-CLM, recomputed from its folder: held-out topics are every 10th
    # sorted topic, joined by </s>, cut into 32-token blocks; next-token cross-entropy averaged over all predictions
    folder = out / "crate-clm"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    names = sorted(topics)
    ids = []
    for name in names[9::10]:
        ids += tokenizer(topics[name], add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    data = torch.tensor(ids[: len(ids) // 32 * 32]).view(-1, 32)
    with torch.no_grad():
        logits = model(input_ids=data).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), data[:, 1:].reshape(-1))
    assert float(loss) == pytest.approx(rows["crate-clm"]["val_loss_after"], rel=1e-4)


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "recipes", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _val_loss(folder, block_size):
    """Next-token loss of a saved causal model on the held-out topics (every 10th sorted topic), recomputed here."""
    from pydoc_data.topics import topics

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = []
    for name in sorted(topics)[9::10]:
        ids += tokenizer(topics[name], add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    data = torch.tensor(ids[: len(ids) // block_size * block_size]).view(-1, block_size)
    with torch.no_grad():
        logits = model(input_ids=data).logits
    return float(torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), data[:, 1:].flatten()))


def test_accelerate_variant_learns_and_reports_true_perplexity(tmp_path):
    recipe = _load("train_crate_lm_accelerate")
    out = tmp_path / "acc"
    args = ["--output-dir", str(out), "--steps", "12", "--hidden-size", "16", "--layers", "1", "--heads", "2",
            "--vocab-size", "300", "--block-size", "32", "--lr", "3e-3", "--max-train-topics", "12"]  # fmt: skip
    assert recipe.main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["processes"] == 1 and set(results["pretraining"]) == {"crate-clm", "gpt2"}
    for name, row in results["pretraining"].items():
        assert row["val_loss_after"] < row["val_loss_before"], name
        assert _val_loss(out / name, 32) == pytest.approx(row["val_loss_after"], rel=1e-4), name
    from hf_tdiag._outputs import OutputExistsError

    with pytest.raises(OutputExistsError, match="overwrite-output-dir"):  # a second run into the folder is refused
        recipe.main(args)
