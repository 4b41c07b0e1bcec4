"""Issue 45: ``SRRCallback`` resuming from a damaged ``checkpoint-<step>/srr_history.json``. Each damage is a one-line
``ValueError`` naming the file and what to do, raised at ``on_train_begin`` before anything is measured, and the
damaged file is left byte-identical (never deleted or rewritten); an intact file still resumes."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerControl, TrainerState

from hf_tdiag.integrations.srr_callback import HISTORY_FILE, SRRCallback

GOOD = {"history": [{"step": 0, "output": {"srr": [0.5, 0.25]}}, {"step": 2, "output": {"srr": [0.4, 0.2]}}]}
_TEXT = json.dumps(GOOD)

CASES = [  # (id, bytes of the damaged file, words the message must have)
    ("empty", b"", "not valid JSON"),
    ("truncated", _TEXT[: len(_TEXT) // 2].encode(), "not valid JSON"),
    ("not-json", b"srr history\n", "not valid JSON"),
    ("latin-1", '{"history": ["\xe9"]}'.encode("latin-1"), "not UTF-8"),
    ("a-list", json.dumps(GOOD["history"]).encode(), "got a list"),
    ("a-number", b"3", "got a int"),
    ("no-history", b'{"eps": 0.5}', "'history' is missing"),
    ("history-a-dict", b'{"history": {"step": 0}}', "a dict, not a list"),
    ("record-a-string", b'{"history": ["step 0"]}', "history[0] has no step"),
    ("step-a-string", b'{"history": [{"step": "2", "output": {"srr": [0.1]}}]}', "history[0] has no step"),
    ("step-a-bool", b'{"history": [{"step": true, "output": {"srr": [0.1]}}]}', "history[0] has no step"),
    ("step-negative", b'{"history": [{"step": -1, "output": {"srr": [0.1]}}]}', "history[0] has no step"),
    ("no-output", b'{"history": [{"step": 0}]}', "history[0] (step 0) has no output.srr"),
    ("srr-strings", b'{"history": [{"step": 0, "output": {"srr": ["0.1"]}}]}', "has no output.srr"),
    ("srr-empty", b'{"history": [{"step": 0, "output": {"srr": []}}]}', "has no output.srr"),
    ("second-record", b'{"history": [{"step": 0, "output": {"srr": [0.1]}}, {"step": 2}]}', "history[1] (step 2)"),
]


def _resume(tmp_path):
    """``on_train_begin`` of a run resumed at step 2 (the model is never reached when the file is refused)."""
    trainer = SimpleNamespace(args=SimpleNamespace(output_dir=str(tmp_path)), eval_dataset=torch.zeros(2, 1, 8, 8),
                              log=lambda logs: None, callback_handler=SimpleNamespace(callbacks=[]),
                              add_callback=lambda cb: None)  # fmt: skip
    callback = SRRCallback(every_n_steps=2, num_samples=2, trainer=trainer)
    state = TrainerState()
    state.global_step = 2
    callback.on_train_begin(trainer.args, state, TrainerControl(), model=None)
    return callback


@pytest.mark.parametrize("content,words", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_damaged_history_is_named_and_kept(tmp_path, content, words):
    path = tmp_path / "checkpoint-2" / HISTORY_FILE
    path.parent.mkdir()
    path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        _resume(tmp_path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and words in message
    assert "move it aside" in message
    assert path.read_bytes() == content  # the user's file, byte-identical


def test_an_intact_history_still_resumes(tmp_path):
    path = tmp_path / "checkpoint-2" / HISTORY_FILE
    path.parent.mkdir()
    path.write_text(json.dumps({"history": GOOD["history"] + [{"step": 4, "output": {"srr": [0.3, 0.1]}}]}))
    assert [r["step"] for r in _resume(tmp_path).history] == [0, 2]  # step 4 is past the resumed step


@pytest.mark.parametrize(
    "kwargs, words",
    [({"every_n_steps": 0}, "every_n_steps: expected a positive integer, got 0"),
     ({"num_samples": -1}, "num_samples: expected a positive integer, got -1"),
     ({"log_layers": "yes"}, "log_layers: expected True or False, got 'yes'")],
    ids=["every_n_steps 0", "num_samples -1", "log_layers a string"],
)  # fmt: skip
def test_bad_callback_arguments_are_named(kwargs, words):
    with pytest.raises((ValueError, TypeError), match="^" + words.replace("(", r"\(")):
        SRRCallback(**kwargs)


def test_logged_scalars_of_a_record_with_schatten_numbers():
    from hf_tdiag.integrations.srr_callback import scalars

    logs = scalars({"output": {"srr": [1.0, 3.0]}, "schatten": {"bound": 2.5}}, layers=False)
    assert logs == {"srr/mean": 2.0, "srr/last": 3.0, "schatten/bound": 2.5}
