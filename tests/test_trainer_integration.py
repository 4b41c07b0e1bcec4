"""hf_tdiag.integrations under a real transformers.Trainer: SRRCallback's logged per-layer SRR equals layer_srr of the
saved checkpoint on the same subset; SRRTrainer's loss equals the project loop's on one batch."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import TrainingArguments

from hf_tdiag import layer_srr
from hf_tdiag.integrations import SRRCallback, SRRTrainer
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
from hf_tdiag.training.data import TensorImageDataset
from hf_tdiag.training.loop import compute_loss

pytestmark = pytest.mark.slow

SUBSET = 12


def _model(seed=0):
    torch.manual_seed(seed)
    config = CrateConfig(
        image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        num_labels=3,
    )  # fmt: skip
    return CrateForImageClassification(config)


def _data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return TensorImageDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g))


def _args(folder, **kw):
    base = dict(
        output_dir=str(folder),
        max_steps=4,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        logging_steps=2,
        save_steps=2,
        eval_strategy="steps",
        eval_steps=4,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    return TrainingArguments(**{**base, **kw})


def test_callback_logs_layer_srr_of_each_checkpoint(tmp_path):
    train, evaluation = _data(32, 1), _data(20, 2)
    callback = SRRCallback(every_n_steps=2, num_samples=SUBSET, log_layers=True)
    trainer = SRRTrainer(
        model=_model(),
        args=_args(tmp_path),
        train_dataset=train,
        eval_dataset=evaluation,
        callbacks=[callback],
        srr_weight=0.1,
    )
    trainer.train()
    logged = {e["step"]: e for e in trainer.state.log_history if "srr/mean" in e}
    assert sorted(logged) == [0, 2, 4]  # the start, every 2 steps; the step-4 evaluation reuses step 4's record
    subset = evaluation.pixel_values[:SUBSET]
    for step in (2, 4):
        saved = CrateForImageClassification.from_pretrained(tmp_path / f"checkpoint-{step}").eval()
        report = layer_srr(saved, subset, progress=False)
        for term in ("srr", "R", "Rc", "sparsity"):
            got = [logged[step][f"srr/layer_{ell}/{term}"] for ell in report.layers]
            np.testing.assert_allclose(got, report.per_layer(term), rtol=1e-6, atol=1e-9)
        assert logged[step]["srr/mean"] == pytest.approx(np.mean(report.per_layer("srr")), rel=1e-9)
    history = json.loads((tmp_path / "srr_history.json").read_text())
    assert [r["step"] for r in history["history"]] == [0, 2, 4] and history["layers"] == [1, 2]
    assert history["history"][1]["output"]["srr"] == [logged[2][f"srr/layer_{ell}/srr"] for ell in (1, 2)]
    in_checkpoint = json.loads((tmp_path / "checkpoint-2" / "srr_history.json").read_text())
    assert [r["step"] for r in in_checkpoint["history"]] == [0, 2]
    assert any("eval_loss" in e for e in trainer.state.log_history)


@pytest.mark.parametrize("srr_layer", ["last", "all", "random"])
def test_srr_trainer_loss_is_the_project_loops_loss(tmp_path, srr_layer):
    model = _model(3)
    batch = {"pixel_values": torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(4)), "labels": None}
    batch["labels"] = torch.tensor([0, 1, 2, 0, 1, 2])
    trainer = SRRTrainer(
        model=model, args=_args(tmp_path, eval_strategy="no", label_smoothing_factor=0.1), srr_weight=0.7,
        srr_layer=srr_layer, srr_eps=0.2, srr_lambda=0.5,
    )  # fmt: skip
    trainer.state.global_step = 5
    model.train()
    got = trainer.compute_loss(model, batch).detach()
    loop_args = SimpleNamespace(
        srr_weight=0.7, srr_layer=srr_layer, srr_eps=0.2, srr_lambda=0.5, label_smoothing=0.1, seed=0
    )
    expected, ce, penalty = compute_loss(model, model, batch, loop_args, 5)
    assert abs(float(got) - float(expected)) <= 1e-6 * max(1.0, abs(float(expected)))
    # an independent path to the same number: layer_srr's per-block means of the batch (no dropout in this model)
    report = layer_srr(model, batch["pixel_values"], eps=0.2, lam=0.5, precision="float64", progress=False)
    srr = report.per_layer("srr")
    blocks = {"last": [2], "all": [1, 2]}.get(srr_layer)
    if blocks is not None:
        hand_ce = F.cross_entropy(model(batch["pixel_values"]).logits, batch["labels"], label_smoothing=0.1)
        hand = float(hand_ce) + 0.7 * float(np.mean([srr[b - 1] for b in blocks]))
        assert float(got) == pytest.approx(hand, rel=1e-5)
    model.eval()  # evaluation: cross-entropy alone, as the project loop's eval_loss
    assert float(trainer.compute_loss(model, batch)) == pytest.approx(float(ce), rel=1e-6)


def test_a_measurement_leaves_mode_and_rng_as_found_and_logs_the_schatten_proxies():
    from hf_tdiag.diagnostics.schatten import schatten_bounds
    from hf_tdiag.integrations.srr_callback import fixed_subset, scalars

    model = _model(5).train()
    callback = SRRCallback(inputs=_data(6, 3), num_samples=4, schatten=True)
    callback._batch = fixed_subset(callback.inputs, 4)
    assert tuple(callback._batch["pixel_values"].shape) == (4, 1, 8, 8) and "labels" not in callback._batch
    torch.manual_seed(11)
    entry = callback.measure(model)
    after = torch.rand(3)
    torch.manual_seed(11)
    assert torch.equal(after, torch.rand(3)) and model.training  # the global RNG and the train mode untouched
    bounds = schatten_bounds(model)
    logs = scalars(entry)
    assert logs["schatten/schatten_bound"] == pytest.approx(bounds.schatten_bound, rel=1e-12)
    assert logs["schatten/edelman_bound"] == pytest.approx(bounds.edelman_bound, rel=1e-12)
    report = layer_srr(model.eval(), _data(6, 3).pixel_values[:4], progress=False)
    assert [logs[f"srr/layer_{ell}/srr"] for ell in (1, 2)] == pytest.approx(report.per_layer("srr"), rel=1e-9)
