"""Recipes without a test file of their own never lose an earlier run: a folder holding the recipe's earlier output
is refused before any work with a one-line message naming --overwrite-output-dir, the old file left byte-identical
and nothing new written; with the flag the output is replaced."""

from __future__ import annotations

import json
import os

import pytest
from script_files import folder_bytes as _snapshot
from script_files import load_script

from hf_tdiag._outputs import adopt_outputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _recipe(name):
    return load_script(f"recipes/{name}.py", f"recipe_{name}")


def _refused(recipe, argv, folder, name, capsys, flag=True):
    """``recipe.main(argv)`` refuses at once with one line (naming the flag where it would help); ``folder`` is
    left as it was."""
    before = _snapshot(folder)
    assert recipe.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"{name}: ") and ("--overwrite-output-dir" in err) == flag, err
    assert _snapshot(folder) == before
    return err


@pytest.mark.parametrize("earlier", ["decoders.png", "decoders.json"])
def test_fig_decoders_refuses_its_earlier_figure(earlier, tmp_path, capsys):
    (tmp_path / earlier).write_bytes(b"an earlier figure")
    err = _refused(_recipe("fig_decoders"), ["--output-dir", str(tmp_path)], tmp_path, "fig_decoders", capsys)
    assert earlier in err


def test_fig_decoders_with_the_flag_replaces_its_earlier_figure(tmp_path):
    (tmp_path / "decoders.json").write_text('{"earlier": true}')
    adopt_outputs(tmp_path, ["decoders.json"])  # an earlier run's, as its manifest records (issue 45)
    assert _recipe("fig_decoders").main(["--output-dir", str(tmp_path), "--overwrite-output-dir"]) == 0
    assert set(json.loads((tmp_path / "decoders.json").read_text())["srr"]) == {"query", "key", "value"}
    assert (tmp_path / "decoders.png").read_bytes()[:4] == b"\x89PNG"


def test_study_seed_stability_refuses_an_earlier_output_before_reading_the_study(tmp_path, capsys):
    output = tmp_path / "results" / "stability.json"
    output.parent.mkdir()
    output.write_text('{"earlier": true}')
    argv = ["--study-dir", str(tmp_path / "no-study-here"), "--output", str(output)]
    err = _refused(_recipe("study_seed_stability"), argv, tmp_path, "study_seed_stability", capsys)
    assert "stability.json" in err


def test_study_seed_stability_never_writes_over_the_study_it_reads(tmp_path, capsys):
    study = tmp_path / "study"
    study.mkdir()
    (study / "study.json").write_text('{"settings": {}}')
    argv = ["--study-dir", str(study), "--output", str(study / "study.json"), "--overwrite-output-dir"]
    err = _refused(_recipe("study_seed_stability"), argv, tmp_path, "study_seed_stability", capsys, flag=False)
    assert "would replace a file of the study" in err  # refused even with the flag


def test_study_seed_stability_with_the_flag_goes_past_the_check(tmp_path, capsys):
    """With the flag the earlier output no longer blocks: the recipe reads the study (here one without kept models,
    so it stops there and the earlier file, not yet replaced, is unchanged)."""
    study = tmp_path / "study"
    (study / "runs").mkdir(parents=True)
    (study / "study.json").write_text(json.dumps({"settings": {}, "grid": {"fixed": {}}}))
    output = tmp_path / "stability.json"
    output.write_text('{"earlier": true}')
    recipe = _recipe("study_seed_stability")
    assert recipe.main(["--study-dir", str(study), "--output", str(output), "--overwrite-output-dir"]) == 1
    assert "no kept models" in capsys.readouterr().err
    assert output.read_text() == '{"earlier": true}'
