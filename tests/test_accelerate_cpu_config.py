"""recipes/accelerate_configs/cpu_two_processes.yaml: `accelerate launch` with it starts two CPU processes that
train one model together (each evaluation sample counted once)."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow  # two processes through accelerate launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "recipes", "accelerate_configs", "cpu_two_processes.yaml")


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def test_the_config_is_two_processes_through_the_torchrun_launcher():
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(CONFIG)
    assert (str(config.distributed_type), config.num_processes, config.use_cpu) == (
        "DistributedType.MULTI_GPU",
        2,
        False,
    )


def test_accelerate_launch_with_the_config_trains_in_two_cpu_processes(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / "hf_home"))
    if torch.accelerator.is_available():  # a GPU machine: the documented prefix keeps the run on the CPU
        env["ACCELERATE_USE_CPU"] = "1"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", CONFIG]
    cmd += ["--main_process_port", _free_port(), os.path.join(ROOT, "recipes", "train_crate.py")]
    cmd += ["--output_dir", str(out), "--hidden_size", "16", "--num_hidden_layers", "1", "--num_attention_heads", "2"]
    cmd += ["--max_train_steps", "2", "--max_train_samples", "64", "--max_eval_samples", "21"]
    cmd += ["--per_device_eval_batch_size", "8", "--layer_srr_samples", "0", "--disable_tqdm"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((out / "all_results.json").read_text())
    assert results["num_processes"] == 2
    # 21 samples over 2 processes x batches of 8: gather_for_metrics drops the padding, every sample once
    assert results["eval_samples"] == 21 and all(h["eval_samples"] == 21 for h in results["history"])
    assert proc.stdout.count("2 process(es)") == 1  # one run announced by the main process, not two lone runs
