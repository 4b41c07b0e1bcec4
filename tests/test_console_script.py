"""The installed ``hf-tdiag`` console script as a subprocess: exit codes, the one-line stderr message of each failure
(no traceback), ``report``'s exit 1 when a section fails (the page still written), and one success checked by value."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script() -> str:
    """The console script installed beside this interpreter (pip's entry point, as a user runs it)."""
    path = os.path.join(os.path.dirname(sys.executable), "hf-tdiag")
    found = path if os.path.isfile(path) else shutil.which("hf-tdiag")
    assert found, f"the hf-tdiag console script is not installed beside {sys.executable} (pip install -e .)"
    return found


def _run(*args, cwd) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("HF_TDIAG_TRACEBACK", None)
    return subprocess.run([_script(), *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def crate_dir(tmp_path_factory):
    from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor

    folder = tmp_path_factory.mktemp("console") / "crate"
    torch.manual_seed(0)
    config = CrateConfig.from_preset(
        "crate-digits", hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_labels=10
    )
    CrateForImageClassification(config).save_pretrained(folder)
    CrateImageProcessor.for_config(config).save_pretrained(folder)
    return folder


def _last_line(text: str) -> str:
    lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def test_no_command_prints_usage_and_exits_2(tmp_path):
    proc = _run(cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout.startswith("usage: hf-tdiag") and "report" in proc.stdout and "srr" in proc.stdout


def test_unknown_command_exits_2_naming_it(tmp_path):
    proc = _run("no-such-command", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "hf-tdiag: error: argument COMMAND: invalid choice: 'no-such-command'" in proc.stderr


def test_bad_flag_value_exits_2_naming_the_flag(tmp_path):
    proc = _run("report", "x", "--head", "-1", cwd=tmp_path)
    assert proc.returncode == 2 and "--head" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("srr", "{tmp}/missing-model", "--dataset", "digits"),
            "hf-tdiag srr: error: model: '{tmp}/missing-model' is not an existing folder",
        ),
        (
            ("convert-official", "{tmp}/missing.pth", "--preset", "crate-small", "--output-dir", "{tmp}/out"),
            "hf-tdiag convert-official: error: checkpoint: no such file '{tmp}/missing.pth'",
        ),
    ],
)
def test_errors_exit_1_with_one_line_on_stderr_and_no_traceback(args, message, crate_dir, tmp_path):
    fill = {"tmp": tmp_path, "crate": crate_dir}
    proc = _run(*(a.format(**fill) for a in args), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert _last_line(proc.stderr).startswith(message.format(**fill)), proc.stderr[-2000:]


def test_report_refuses_an_out_of_range_layer_before_any_section_runs(crate_dir, tmp_path):
    """An out-of-range --layer is checked against the model before the inputs are read or a section runs: exit 1,
    one line naming the flag and the range, no traceback and no page (a section that fails while it runs still
    leaves the page: tests/test_report.py)."""
    proc = _run(
        "report",
        crate_dir,
        "--dataset",
        "digits",
        "--max-samples",
        "8",
        "--sections",
        "summary",
        "concept_fidelity",
        "--layer",
        "99",
        "--output-dir",
        "rep",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert _last_line(proc.stderr) == (
        "hf-tdiag report: error: --layer: expected a block number 0..2 (0 = the embeddings), got 99"
    )
    assert "Traceback" not in proc.stderr and "  summary    ok" not in proc.stdout
    assert not (tmp_path / "rep" / "report.html").exists() and not (tmp_path / "rep" / "report.json").exists()


def test_srr_subprocess_numbers_are_the_srr_by_hand(crate_dir, tmp_path):
    from test_srr_probes import _by_hand
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from hf_tdiag.inputs import digits_images

    proc = _run(
        "srr",
        crate_dir,
        "--dataset",
        "digits",
        "--max-samples",
        "6",
        "--eps",
        "0.5",
        "--lam",
        "0.25",
        "--output-dir",
        "out",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (report,) = json.loads((tmp_path / "out" / "srr.json").read_text())["reports"].values()
    model = AutoModelForImageClassification.from_pretrained(str(crate_dir)).eval()
    processor = AutoImageProcessor.from_pretrained(str(crate_dir))
    x = processor(digits_images(limit=6).images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        hidden = model(pixel_values=x, output_hidden_states=True).hidden_states
    for ell in (1, 2):
        qkv = model.crate.encoder.layer[ell - 1].attention.qkv.weight.detach()
        U = qkv.reshape(2, 8, 16).transpose(1, 2)
        srr = torch.stack([_by_hand(z, U, 0.5, 0.25) for z in hidden[ell]])[:, 3].mean()
        assert report["mean"]["output"]["srr"][ell - 1] == pytest.approx(float(srr), rel=1e-6)
