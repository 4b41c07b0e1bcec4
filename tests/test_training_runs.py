"""End-to-end trainer runs on tiny CRATEs: kill-and-resume equality, generalization gap, model card, data sources."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from PIL import Image
from safetensors.torch import load_file

from hf_tdiag.training import train
from hf_tdiag.training.checkpointing import latest_checkpoint, list_checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    per_device_train_batch_size=32,
    per_device_eval_batch_size=64,
    max_train_samples=256,
    max_eval_samples=64,
    layer_srr_samples=0,
    disable_tqdm=True,
    seed=3,
)


def _argv(**kwargs):
    out = []
    for key, value in kwargs.items():
        if value is True:
            out.append(f"--{key}")
        else:
            out += [f"--{key}", str(value)]
    return out


_KILLED_CHILD = r"""
import os, signal, sys
import torch
torch.set_num_threads(int(os.environ["HF_TDIAG_TEST_THREADS"]))  # same as the parent: bitwise-equal sums
from accelerate import Accelerator
from hf_tdiag.training.loop import train

original = Accelerator.save_state

def save_state(self, output_dir=None, **kwargs):
    result = original(self, output_dir, **kwargs)
    if output_dir.endswith(".tmp-checkpoint-" + os.environ["KILL_AT_STEP"]):
        # die mid-checkpoint: state written but torn, never renamed
        path = os.path.join(output_dir, "model.safetensors")
        with open(path, "r+b") as fh:
            fh.truncate(os.path.getsize(path) // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    return result

Accelerator.save_state = save_state
train(sys.argv[1:])
"""


@pytest.mark.parametrize(
    "accumulation, kill_at, expected",
    [
        (1, 6, [3]),  # 8 batches/epoch: killed writing step 6, resumes at step 3 = batch 3 of epoch 0
        (2, 8, [4, 6]),  # 4 steps/epoch: killed writing the epoch-end step 8, resumes at step 6 = batch 4 of epoch 1
    ],
)
def test_sigkill_mid_checkpoint_then_resume_latest_gives_identical_weights(tmp_path, accumulation, kill_at, expected):
    common = dict(
        TINY,
        max_train_steps=12,
        checkpointing_steps=3,
        gradient_accumulation_steps=accumulation,
        srr_weight=0.05,
        srr_layer="random",
        hidden_dropout_prob=0.1,  # the resumed run must also restore the RNG state
    )
    full = train(output_dir=str(tmp_path / "full"), **common)
    assert full["steps"] == 12

    killed = tmp_path / "killed"
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "HF_TDIAG_TEST_THREADS": str(torch.get_num_threads()),
        "KILL_AT_STEP": str(kill_at),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_CHILD, *_argv(output_dir=str(killed), **common)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert (killed / f".tmp-checkpoint-{kill_at}").is_dir()  # the torn checkpoint is there ...
    assert [s for s, _ in list_checkpoints(str(killed))] == expected  # ... but does not count
    latest = str(killed / f"checkpoint-{expected[-1]}")
    assert latest_checkpoint(str(killed)) == latest
    assert not (killed / "model.safetensors").exists()

    resumed = train(output_dir=str(killed), resume_from_checkpoint="latest", **common)
    assert resumed["resumed_from"] == latest
    a = load_file(str(tmp_path / "full" / "model.safetensors"))
    b = load_file(str(killed / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert resumed["history"] == full["history"]
    assert not (killed / f".tmp-checkpoint-{kill_at}").exists()  # cleaned on start
    assert len(list_checkpoints(str(killed))) == 2  # checkpoints_total_limit


def test_srr_weight_changes_training(tmp_path):
    base = dict(TINY, max_train_steps=3, with_tracking=True, logging_steps=1)
    plain = train(output_dir=str(tmp_path / "plain"), **base)
    reg = train(output_dir=str(tmp_path / "reg"), srr_weight=1.0, srr_layer="last", **base)
    a = load_file(str(tmp_path / "plain" / "model.safetensors"))
    b = load_file(str(tmp_path / "reg" / "model.safetensors"))
    qkv = "crate.encoder.layer.1.attention.qkv.weight"
    assert not torch.equal(a[qkv], b[qkv])
    lines = [json.loads(x) for x in open(tmp_path / "reg" / "logs" / "crate" / "metrics.jsonl")]
    penalties = [x["train/srr_penalty"] for x in lines if "train/srr_penalty" in x]
    assert len(penalties) == 3 and all(np.isfinite(penalties))
    assert any("eval/accuracy" in x for x in lines)
    assert plain["srr_weight"] == 0.0 and reg["srr_weight"] == 1.0


def test_stop_at_train_loss_gap_results_and_model_card(tmp_path):
    out = tmp_path / "run"
    results = train(
        output_dir=str(out),
        variant="crate-c",
        num_train_epochs=4,
        stop_at_train_loss=50.0,  # any first-epoch loss is below it: stop after one epoch
        **dict(TINY, layer_srr_samples=32),
    )
    assert results["reached_train_loss_target"] is True and results["epochs"] == 1
    on_disk = json.load(open(out / "all_results.json"))
    assert on_disk["generalization_gap"] == pytest.approx(on_disk["eval_loss"] - on_disk["train_loss"])
    assert on_disk["eval_samples"] == 64 and on_disk["train_samples"] == 256

    # independent recomputation from the saved folder: eval-mode cross-entropy on the full train / test subsets
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from hf_tdiag.inputs import digits_split

    model = AutoModelForImageClassification.from_pretrained(str(out)).eval()
    processor = AutoImageProcessor.from_pretrained(str(out))
    x_tr, x_te, y_tr, y_te = digits_split()

    def ce(images, labels):
        pixel_values = processor([Image.fromarray(i) for i in images], return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            logits = model(pixel_values=pixel_values).logits
        return float(torch.nn.functional.cross_entropy(logits, torch.as_tensor(labels)))

    assert on_disk["train_loss"] == pytest.approx(ce(x_tr[:256], y_tr[:256]), rel=1e-5)
    assert on_disk["eval_loss"] == pytest.approx(ce(x_te[:64], y_te[:64]), rel=1e-5)
    assert len(on_disk["layer_srr"]) == 2 and on_disk["layer_srr_samples"] == 32
    # the per-layer SRR of the trained model on the first 32 test images, by hand from its hidden states and U^l
    from test_srr_probes import _by_hand

    x = processor([Image.fromarray(i) for i in x_te[:32]], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        hidden = model(pixel_values=x, output_hidden_states=True).hidden_states
    for ell in (1, 2):
        qkv = model.crate.encoder.layer[ell - 1].attention.qkv.weight
        U = qkv.reshape(model.config.num_attention_heads, -1, qkv.shape[1]).transpose(1, 2)
        by_hand = np.mean([float(_by_hand(z, U.detach(), 0.1, 1.0)[3]) for z in hidden[ell]])
        assert on_disk["layer_srr"][ell - 1] == pytest.approx(by_hand, rel=1e-6)
    # layer_srr.png draws layer_srr.json, whose block outputs are those numbers
    from hf_tdiag.viz import plot_layer_srr

    saved = json.load(open(out / "layer_srr.json"))
    srr_axis = plot_layer_srr(saved, terms=["srr"], states=["output"]).axes[0]
    np.testing.assert_allclose(srr_axis.lines[0].get_ydata()[1:], on_disk["layer_srr"], rtol=1e-9)

    card = ModelCard.load(str(out / "README.md"))
    metrics = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert metrics["accuracy"] == pytest.approx(results["eval_accuracy"])
    assert metrics["generalization_gap"] == pytest.approx(results["generalization_gap"])
    assert card.data.eval_results[0].dataset_split == "test"
    assert card.data.model_name.startswith("CRATE-C")
    text = card.text
    assert "U = [U_1 … U_K]" in text and "White-Box Transformers via Sparse Rate Reduction" in text
    assert (
        "In-depth Investigation of Sparse Rate Reduction" in text
        and "![Per-layer sparse rate reduction](layer_srr.png)" in text
    )
    assert f"{results['generalization_gap']:.4f}" in text
    assert "--variant crate-c" in text and "--stop_at_train_loss 50.0" in text


def test_track_srr_every_writes_history_tracker_and_survives_resume(tmp_path):
    import shutil

    common = dict(
        TINY,
        max_train_steps=6,
        checkpointing_steps=2,
        track_srr_every=2,
        track_srr_samples=16,
        with_tracking=True,
        logging_steps=1,
    )
    full = train(output_dir=str(tmp_path / "full"), **common)
    data = json.load(open(tmp_path / "full" / "srr_history.json"))
    assert [r["step"] for r in data["history"]] == [0, 2, 4, 6] and full["srr_history_records"] == 4
    assert data["layers"] == [1, 2] and full["track_srr_every"] == 2
    first, last = data["history"][0], data["history"][-1]
    assert len(first["output"]["Rc"]) == 2 and len(first["mid"]["sparsity"]) == 2 and first["num_samples"] == 16
    assert first["embeddings"]["sparsity"] == 1.0 and first["output"]["Rc"] != last["output"]["Rc"]
    # the record is layer_srr of the model at that step: the final one equals a fresh measurement of the saved model
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from hf_tdiag import layer_srr
    from hf_tdiag.training.data import digits_split

    model = AutoModelForImageClassification.from_pretrained(str(tmp_path / "full")).eval()
    processor = AutoImageProcessor.from_pretrained(str(tmp_path / "full"))
    x = processor([Image.fromarray(i) for i in digits_split()[1][:16]], return_tensors="pt")["pixel_values"]
    np.testing.assert_allclose(last["output"]["srr"], layer_srr(model, x, progress=False).per_layer("srr"), rtol=1e-6)
    lines = [json.loads(x) for x in open(tmp_path / "full" / "logs" / "crate" / "metrics.jsonl")]
    assert sum("srr/layer_2/Rc" in x for x in lines) == 4
    # resuming from step 2 continues the same history
    (tmp_path / "resumed").mkdir()
    shutil.copytree(tmp_path / "full" / "checkpoint-4", tmp_path / "resumed" / "checkpoint-4")
    train(output_dir=str(tmp_path / "resumed"), resume_from_checkpoint="latest", **common)
    again = json.load(open(tmp_path / "resumed" / "srr_history.json"))
    assert again["history"] == data["history"]


def _write_imagefolder(root, per_class, seed):
    rng = np.random.default_rng(seed)
    for label, shade in (("cat", 40), ("dog", 200)):
        os.makedirs(root / label, exist_ok=True)
        for i in range(per_class):
            pixels = np.clip(rng.normal(shade, 30, size=(16, 16, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / label / f"{i}.png")


SMALL_IMAGES = dict(
    preset="crate-32",
    image_size=16,
    patch_size=4,
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    max_train_steps=2,
    per_device_train_batch_size=4,
    per_device_eval_batch_size=4,
    layer_srr_samples=4,
    disable_tqdm=True,
)


def test_imagefolder_training_with_augmentation(tmp_path):
    _write_imagefolder(tmp_path / "train", 6, 0)
    _write_imagefolder(tmp_path / "val", 3, 1)
    results = train(
        output_dir=str(tmp_path / "out"),
        train_dir=str(tmp_path / "train"),
        validation_dir=str(tmp_path / "val"),
        **SMALL_IMAGES,
    )
    assert results["eval_samples"] == 6 and results["train_samples"] == 12
    assert results["augmentation"] == "pad_crop + horizontal flip (p=0.5)"
    config = json.load(open(tmp_path / "out" / "config.json"))
    assert sorted(config["id2label"].values()) == ["cat", "dog"] and config["num_channels"] == 3


def test_save_to_disk_dataset_through_the_cli_fine_tuning_a_saved_model(tmp_path):
    import datasets

    _write_imagefolder(tmp_path / "imgs", 6, 2)
    train(output_dir=str(tmp_path / "base"), train_dir=str(tmp_path / "imgs"), train_val_split=0.25, **SMALL_IMAGES)
    base = load_file(str(tmp_path / "base" / "model.safetensors"))
    images, labels = [], []
    for label, name in enumerate(("cat", "dog")):
        for f in sorted(os.listdir(tmp_path / "imgs" / name)):
            images.append(Image.open(tmp_path / "imgs" / name / f).convert("RGB"))
            labels.append(label)
    ds = datasets.Dataset.from_dict(
        {"img": images, "label": labels},
        features=datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog"])}),
    )
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "disk"))
    from hf_tdiag.cli import main

    flags = {
        k: v
        for k, v in SMALL_IMAGES.items()
        if k not in ("preset", "image_size", "patch_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
    }
    argv = [
        "train",
        *_argv(
            output_dir=str(tmp_path / "out"),
            dataset_path=str(tmp_path / "disk"),
            train_val_split=0.25,
            model_name_or_path=str(tmp_path / "base"),
            learning_rate=0.0,
            **flags,
        ),
    ]
    assert main(argv) == 0
    results = json.load(open(tmp_path / "out" / "all_results.json"))
    assert results["eval_samples"] == 3 and results["train_samples"] == 9
    assert results["eval_split"].startswith("train[0.25") and results["preset"] is None
    tuned = load_file(str(tmp_path / "out" / "model.safetensors"))
    # learning rate 0: fine-tuning starts from, and keeps, the saved weights
    assert tuned.keys() == base.keys() and all(torch.equal(tuned[k], base[k]) for k in base)
