"""``SRRCallback``'s schedule, driven event by event with a ``TrainerState`` and a stand-in Trainer (no training):
which steps it records, that each record is the model as it is at that step (``layer_srr`` computed here on the
same subset), what it logs, the history file beside and inside the checkpoints, and a resumed run continuing it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerControl, TrainerState

from hf_tdiag.diagnostics.srr import layer_srr
from hf_tdiag.integrations.srr_callback import HISTORY_FILE, SRRCallback
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification


class _Trainer:
    """What the callback uses of a Trainer: ``log``, ``args.output_dir``, ``eval_dataset``, the callback list."""

    def __init__(self, output_dir, eval_dataset):
        self.args = SimpleNamespace(output_dir=str(output_dir))
        self.eval_dataset = eval_dataset
        self.logged: list[dict] = []
        self.callback_handler = SimpleNamespace(callbacks=[])

    def log(self, logs: dict) -> None:
        self.logged.append(dict(logs))

    def add_callback(self, callback) -> None:
        self.callback_handler.callbacks.append(callback)


def _model():
    torch.manual_seed(0)
    config = CrateConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_labels=3)  # fmt: skip
    return CrateForImageClassification(config).eval()


def _step(model, state, step):
    """One 'optimizer step': the weights change (so that each record can only be this step's model)."""
    state.global_step = step
    state.epoch = step / 10
    with torch.no_grad():
        model.crate.encoder.layer[0].attention.qkv.weight.mul_(1.5)


def test_records_at_start_every_n_steps_and_at_evaluations(tmp_path):
    model = _model()
    data = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    trainer = _Trainer(tmp_path, [{"pixel_values": x, "labels": 0} for x in data])
    callback = SRRCallback(every_n_steps=3, num_samples=4, log_layers=True).attach(trainer)
    assert trainer.callback_handler.callbacks == [callback]
    state, control, args = TrainerState(), TrainerControl(), trainer.args
    expected = {}

    def measured():
        return layer_srr(model, {"pixel_values": data[:4]}, progress=False).per_layer("srr")

    callback.on_train_begin(args, state, control, model=model)
    expected[0] = measured()
    for step in range(1, 8):
        _step(model, state, step)
        callback.on_step_end(args, state, control, model=model)
        if step % 3 == 0:
            expected[step] = measured()
        if step in (6, 7):
            callback.on_evaluate(args, state, control, model=model)  # at 6: the weights are those step 6 recorded
    expected[7] = measured()
    assert [(r["step"], r["event"]) for r in callback.history] == [(0, "start"), (3, "step"), (6, "step"),
                                                                   (7, "evaluate")]  # fmt: skip
    assert [r["epoch"] for r in callback.history] == [0.0, 0.3, 0.6, 0.7]
    for record in callback.history:
        assert record["num_samples"] == 4
        torch.testing.assert_close(torch.tensor(record["output"]["srr"]), torch.tensor(expected[record["step"]]))
    assert len(trainer.logged) == 4
    for logs, record in zip(trainer.logged, callback.history):
        srr = record["output"]["srr"]
        assert logs["srr/layer_2/srr"] == pytest.approx(srr[1]) and logs["srr/mean"] == pytest.approx(sum(srr) / 2)
        assert logs["srr/last"] == pytest.approx(srr[-1])
        assert {f"srr/layer_{ell}/{t}" for ell in (1, 2) for t in ("R", "Rc", "sparsity", "srr")} < set(logs)
    written = json.loads((tmp_path / HISTORY_FILE).read_text())
    assert [r["step"] for r in written["history"]] == [0, 3, 6, 7] and written["every_n_steps"] == 3


def test_without_every_n_steps_only_the_start_and_evaluations(tmp_path):
    model = _model()
    trainer = _Trainer(tmp_path, torch.randn(4, 1, 8, 8))
    callback = SRRCallback(num_samples=2, at_start=False).attach(trainer)  # default: the compact keys
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(trainer.args, state, control, model=model)
    for step in range(1, 5):
        _step(model, state, step)
        callback.on_step_end(trainer.args, state, control, model=model)
    callback.on_evaluate(trainer.args, state, control, model=model)
    assert [(r["step"], r["event"]) for r in callback.history] == [(4, "evaluate")]
    assert set(trainer.logged[0]) == {"srr/mean", "srr/last"}


def test_a_resumed_run_continues_the_checkpoints_history(tmp_path):
    model = _model()
    data = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    trainer = _Trainer(tmp_path, data)
    first = SRRCallback(every_n_steps=2, num_samples=4).attach(trainer)
    state, control = TrainerState(), TrainerControl()
    first.on_train_begin(trainer.args, state, control, model=model)
    for step in (1, 2, 3, 4):
        _step(model, state, step)
        first.on_step_end(trainer.args, state, control, model=model)
        if step == 2:
            (tmp_path / "checkpoint-2").mkdir()
            first.on_save(trainer.args, state, control)
    saved = json.loads((tmp_path / "checkpoint-2" / HISTORY_FILE).read_text())["history"]
    assert [r["step"] for r in saved] == [0, 2]
    resumed_state = TrainerState()
    resumed_state.global_step = 2
    second = SRRCallback(every_n_steps=2, num_samples=4).attach(_Trainer(tmp_path, data))
    second.on_train_begin(trainer.args, resumed_state, control, model=model)
    assert [r["step"] for r in second.history] == [0, 2]  # no second start record; step 4 of the first run dropped
    _step(model, resumed_state, 3)
    second.on_step_end(trainer.args, resumed_state, control, model=model)
    _step(model, resumed_state, 4)
    second.on_step_end(trainer.args, resumed_state, control, model=model)
    assert [r["step"] for r in second.history] == [0, 2, 4]
