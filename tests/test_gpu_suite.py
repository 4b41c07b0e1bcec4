"""The GPU suite must run where the GPU machine's Python runs it: without datasets and evaluate."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BLOCKED_RUN = """
import runpy, sys
sys.modules["datasets"] = None  # importing either now raises ImportError, as on the GPU machine
sys.modules["evaluate"] = None
sys.argv = ["benchmarks/gpu_suite.py"] + sys.argv[1:]
runpy.run_path("benchmarks/gpu_suite.py", run_name="__main__")
"""


def test_gpu_suite_smoke_runs_without_datasets_and_evaluate(tmp_path):
    out = tmp_path / "suite.json"
    env = dict(os.environ, PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN, "--smoke", "--output", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["errors"] == {}, record["errors"]
    assert set(record["sections"]) == {
        "machine",
        "train_step",
        "srr_pass",
        "srr_profile",
        "trainer_step",
        "whitebox_step",
    }
    srr = record["sections"]["srr_pass"]
    # the ratio is the two timings it is made of
    assert abs(srr["ratio_layer_srr_to_forward"] - srr["layer_srr_s"] / srr["forward_s"]) < 1e-12
    assert srr["num_images"] == 16


def test_gpu_suite_refuses_to_run_without_cuda_unless_smoke(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_suite.py", "--output", str(tmp_path / "x.json")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
    assert not (tmp_path / "x.json").exists()
