"""recipes/train_whitebox_digits.py: its warm-up-then-cosine schedule, a tiny run's results.json, and a folder holding
an earlier run's results refused before any training (the old file unchanged) unless --overwrite-output-dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_files import load_script

from hf_tdiag._threads import torch_threads

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recipe():
    return load_script("recipes/train_whitebox_digits.py")


def test_recipe_schedule_warms_up_linearly_then_decays_by_cosine(recipe):
    f = recipe.lr_factor
    assert [f(s, 100, 4) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4, 100, 4) == 1.0 and f(52, 100, 4) == pytest.approx(0.5) and f(100, 100, 4) == 0.0
    assert f(0, 10, 0) == 1.0 and f(5, 10, 0) == pytest.approx(0.5)  # no warm-up: the plain cosine
    assert all(f(s + 1, 100, 4) <= f(s, 100, 4) for s in range(3, 100))


TINY = [
    "--families",
    "crate-mae",
    "--epochs",
    "1",
    "--pretrain-epochs",
    "1",
    "--target-params",
    "20000",
    "--threads",
    "1",
]


def test_a_folder_with_earlier_results_is_refused_before_any_training(recipe, tmp_path, capsys):
    (tmp_path / "results.json").write_text('{"earlier": true}')
    assert recipe.main([*TINY, "--output-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("train_whitebox_digits: output_dir:") and "--overwrite-output-dir" in err
    assert "\n" not in err
    assert (tmp_path / "results.json").read_text() == '{"earlier": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


@pytest.mark.slow  # trains two tiny models (3 s)
def test_overwrite_replaces_them_with_a_tiny_run(recipe, tmp_path):
    (tmp_path / "results.json").write_text('{"earlier": true}')
    from hf_tdiag._outputs import adopt_outputs

    adopt_outputs(tmp_path, ["results.json"])  # an earlier run's, as its manifest records (issue 45)
    with torch_threads(None):  # the recipe sets the process's thread count (--threads 1): restore it for the suite
        assert recipe.main([*TINY, "--output-dir", str(tmp_path), "--overwrite_output_dir"]) == 0
    out = json.loads((tmp_path / "results.json").read_text())
    (row,) = out["results"]
    assert row["family"] == "crate-mae" and out["settings"]["mae_patch_gain"] == recipe.MAE_PATCH_GAIN
    for key in ("test_accuracy", "test_accuracy_without_pretraining"):
        assert 0.0 <= row[key] <= 1.0
    assert row["pretrain_masked_mse_test"] > 0 and row["ledger_trained"]["num_steps"] == 2 * 4
