"""SimDINO / DINO pretraining runs: resumed = uninterrupted, the saved backbone loads with AutoModel, settings."""

import json
import os
import shutil

import pytest
import torch

from hf_tdiag.training.simdino import parse_settings, pretrain
from hf_tdiag.training.simdino.args import PretrainSettings


def _settings(folder, **extra):
    return dict(
        output_dir=str(folder), objective="dino", backbone="vit-digits", max_train_steps=4, batch_size=16,
        warmup_steps=1, n_local=1, hidden_dim=16, bottleneck_dim=8, out_dim=12, track_every=2, track_samples=32,
        checkpointing_steps=2, freeze_last_layer_steps=1, probe=False, **extra,
    )  # fmt: skip


def test_resumed_run_equals_uninterrupted_and_backbone_loads_with_automodel(tmp_path):
    """DINO (its centre is state too): a run killed after its step-2 checkpoint and resumed gives the same teacher
    weights, losses and collapse statistics as the uninterrupted run."""
    from transformers import AutoModel

    whole = pretrain(_settings(tmp_path / "whole"))
    killed = tmp_path / "killed"
    os.makedirs(killed)
    shutil.copytree(tmp_path / "whole" / "checkpoint-2", killed / "checkpoint-2")  # what the killed run left
    # a resume with another training setting is refused, naming it; the folder is left free for the right one
    with pytest.raises(ValueError, match=r"other settings \(learning_rate: 0\.001 -> 0\.002; n_local: 1 -> 2\)"):
        pretrain(_settings(killed, resume_from_checkpoint="latest") | dict(learning_rate=2e-3, n_local=2))
    assert sorted(os.listdir(killed)) == ["checkpoint-2"]
    # how many checkpoints are kept may change
    resumed = pretrain(_settings(killed, resume_from_checkpoint="latest") | dict(checkpoints_total_limit=3))
    assert resumed["resumed_from"] == str(killed / "checkpoint-2") and whole["resumed_from"] is None
    assert resumed["losses"] == whole["losses"] and resumed["history"] == whole["history"]
    assert len(whole["losses"]) == 4 and [h["step"] for h in whole["history"]] == [0, 2, 4]
    a = AutoModel.from_pretrained(tmp_path / "whole" / "backbone", add_pooling_layer=False)  # saved without one
    b = AutoModel.from_pretrained(killed / "backbone", add_pooling_layer=False)
    assert type(a).__name__ == "ViTModel"
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name
    with open(killed / "pretrain_results.json") as fh:
        assert json.load(fh)["steps"] == 4


def test_flags_are_hyphenated_and_checked(tmp_path):
    s = parse_settings(["--output-dir", str(tmp_path), "--objective", "dino", "--local-scale", "0.2", "0.5"])
    assert (s.objective, s.local_scale, s.eps) == ("dino", (0.2, 0.5), pytest.approx(0.5**0.5))
    with pytest.raises(ValueError, match="objective"):
        PretrainSettings(output_dir=str(tmp_path), objective="byol")
    with pytest.raises(ValueError, match="warmup_steps"):
        PretrainSettings(output_dir=str(tmp_path), max_train_steps=5, warmup_steps=6)


def test_teacher_temperature_warms_up_linearly_then_holds(tmp_path):
    """DINO's teacher temperature: linear from --warmup-teacher-temp to --teacher-temp over the warmup steps (both
    ends included), then constant: 0.02 + 0.02 * i / 2 for i = 0, 1, 2."""
    from hf_tdiag.training.simdino.pretrain import _schedules

    s = PretrainSettings(output_dir=str(tmp_path), objective="dino", max_train_steps=5, warmup_steps=0,
                         warmup_teacher_temp=0.02, teacher_temp=0.04, warmup_teacher_temp_steps=3)  # fmt: skip
    assert _schedules(s).teacher_temp == pytest.approx([0.02, 0.03, 0.04, 0.04, 0.04], abs=1e-15)


def test_effective_rank_of_collapsed_and_spread_features():
    from hf_tdiag.training.simdino.pretrain import effective_rank

    line = torch.arange(6.0)[:, None] * torch.tensor([[1.0, 2.0, -1.0]])  # every feature on one line: rank 1
    assert effective_rank(line) == pytest.approx(1.0, abs=1e-9)
    # centred rows ±e_1, ±e_2, ±e_3 (equal singular values): exp(entropy) of three equal shares = 3
    cube = torch.cat([torch.eye(3), -torch.eye(3)])
    assert effective_rank(cube) == pytest.approx(3.0, abs=1e-9)
    # the rank is of the centred features, whatever their offset and scale (singular values summing to far below 1)
    assert effective_rank(1e-3 * cube + 5.0) == pytest.approx(3.0, abs=1e-9)
    skew = torch.cat([torch.diag(torch.tensor([2.0, 1.0])), -torch.diag(torch.tensor([2.0, 1.0]))])
    p = torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)
    assert effective_rank(skew) == pytest.approx(float(torch.exp(-(p * p.log()).sum())), abs=1e-9)


def test_the_pretrain_command_runs_the_same_pretraining(tmp_path, capsys):
    """hf-tdiag pretrain (flags derived from PretrainSettings, underscore spellings accepted) gives the run the Python
    call gives: the same losses, and its summary line."""
    from hf_tdiag.cli import main

    settings = _settings(tmp_path / "py")
    expected = pretrain(settings)
    flags = []
    for key, value in {**settings, "output_dir": str(tmp_path / "cli")}.items():
        flags += [f"--{key.replace('_', '-')}" if key != "n_local" else "--n_local", str(value).lower()]
    capsys.readouterr()
    assert main(["pretrain", *flags]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == expected["steps"] == 4 and summary["resumed_from"] is None
    saved = json.loads((tmp_path / "cli" / "pretrain_results.json").read_text())
    assert saved["losses"] == expected["losses"]
