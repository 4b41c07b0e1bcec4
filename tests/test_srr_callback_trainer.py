"""``SRRCallback`` in the standard position, ``Trainer(..., callbacks=[SRRCallback(...)])`` with a plain
``transformers.Trainer``: the measured scalars reach ``state.log_history``, the ``on_log`` of the callbacks before it
(where the reporting integrations sit), the checkpoints' ``trainer_state.json`` and ``srr_history.json``; the Trainer's
own loss logs stay on their schedule; the compact key set by default, every layer's terms with ``log_layers=True``."""

import json

import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from hf_tdiag import layer_srr
from hf_tdiag.integrations import SRRCallback
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
from hf_tdiag.training.data import TensorImageDataset


class Recorder(TrainerCallback):
    """Stands where transformers puts TensorBoard, W&B, ...: before the user's callbacks; keeps every on_log."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append((state.global_step, dict(logs)))


def _run(tmp_path, **callback_kw):
    torch.manual_seed(0)
    config = CrateConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_labels=3)  # fmt: skip
    g = torch.Generator().manual_seed(1)
    train = TensorImageDataset(torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 3, (16,), generator=g))
    evaluation = TensorImageDataset(torch.randn(6, 1, 8, 8, generator=g), torch.randint(0, 3, (6,), generator=g))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=8, learning_rate=1e-2,
                             logging_steps=2, save_steps=2, eval_strategy="no", report_to="none", use_cpu=True,
                             disable_tqdm=True, seed=0, dataloader_num_workers=0)  # fmt: skip
    recorder, callback = Recorder(), SRRCallback(every_n_steps=2, num_samples=4, **callback_kw)
    trainer = Trainer(model=CrateForImageClassification(config), args=args, train_dataset=train,
                      eval_dataset=evaluation, callbacks=[recorder, callback])  # fmt: skip
    trainer.train()
    return trainer, recorder, callback, evaluation


def test_standard_position_logs_through_the_trainer_compact_by_default(tmp_path):
    trainer, recorder, callback, evaluation = _run(tmp_path)
    assert callback.trainer is trainer
    logged = {e["step"]: e for e in trainer.state.log_history if "srr/mean" in e}
    assert sorted(logged) == [0, 2, 4]
    for entry in logged.values():
        assert set(entry) == {"srr/mean", "srr/last", "epoch", "step"}  # compact: no per-layer keys
    # the reporting integrations' place in the callback list saw the same numbers
    seen = {step: logs for step, logs in recorder.logs if "srr/mean" in logs}
    assert {s: (v["srr/mean"], v["srr/last"]) for s, v in seen.items()} == {
        s: (v["srr/mean"], v["srr/last"]) for s, v in logged.items()
    }
    # the numbers are layer_srr of the checkpoint saved at that step, on the first 4 evaluation images
    saved = CrateForImageClassification.from_pretrained(tmp_path / "checkpoint-4").eval()
    srr = layer_srr(saved, evaluation.pixel_values[:4], progress=False).per_layer("srr")
    assert logged[4]["srr/last"] == pytest.approx(srr[-1], rel=1e-6)
    assert logged[4]["srr/mean"] == pytest.approx(sum(srr) / len(srr), rel=1e-6)
    # the Trainer's own loss logs at its logging steps (2 and 4) were not displaced by the SRR records there
    assert sorted(e["step"] for e in trainer.state.log_history if "loss" in e) == [2, 4]
    # the checkpoints' trainer state and the history file hold them
    state = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"] if "srr/mean" in e] == [0, 2, 4]
    history = json.loads((tmp_path / "srr_history.json").read_text())["history"]
    assert [r["step"] for r in history] == [0, 2, 4] and history[-1]["output"]["srr"] == pytest.approx(srr, rel=1e-6)


def test_log_layers_gives_every_blocks_terms(tmp_path):
    trainer, _, callback, _ = _run(tmp_path, log_layers=True)
    entry = [e for e in trainer.state.log_history if "srr/mean" in e][-1]
    record = callback.history[-1]["output"]
    for term in ("R", "Rc", "sparsity", "srr"):
        assert [entry[f"srr/layer_{ell}/{term}"] for ell in (1, 2)] == record[term]


def test_log_layers_must_be_a_bool():
    with pytest.raises(TypeError, match="log_layers"):
        SRRCallback(log_layers="all")


def test_outside_a_trainer_it_says_how_to_use_it(tmp_path):
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    callback = SRRCallback(inputs=torch.randn(2, 1, 8, 8))
    with pytest.raises(RuntimeError, match=r"callbacks=\[SRRCallback"):
        callback.on_train_begin(SimpleNamespace(output_dir=str(tmp_path)), TrainerState(), TrainerControl())
