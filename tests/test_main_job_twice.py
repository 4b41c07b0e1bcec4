"""The README's main-job command run twice in a row as written (``--overwrite-output-dir``): the second run replaces
the first's model, report and ``main_job.json`` (every file the first wrote is in the folder's manifest), and a
file of the user's in the folder is kept."""

import json

import pytest
from script_files import load_script

pytestmark = pytest.mark.slow  # two tiny main jobs (~30 s)

TINY = ["--num-train-epochs", "1", "--max-train-samples", "64", "--max-eval-samples", "32", "--hidden-size", "16",
        "--num-hidden-layers", "1", "--num-attention-heads", "2", "--layer-srr-samples", "8", "--disable-tqdm"]  # fmt: skip


def test_the_main_job_runs_twice_into_the_same_folder(tmp_path):
    out = tmp_path / "runs" / "main"
    first = ["--output-dir", str(out), "--overwrite-output-dir", *TINY, "--seed", "1"]
    assert load_script("recipes/main_job.py").main(first) == 0
    (out / "notes.txt").write_text("mine")
    before = json.loads((out / "main_job.json").read_text())
    second = ["--output-dir", str(out), "--overwrite-output-dir", *TINY, "--seed", "2"]
    assert load_script("recipes/main_job.py").main(second) == 0
    after = json.loads((out / "main_job.json").read_text())
    assert before["seed"] == 1 and after["seed"] == 2  # the second run's summary replaced the first's
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "report.html").exists() and (out / "model.safetensors").exists()
