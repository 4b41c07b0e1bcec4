"""A real two-process CPU run (torchrun, gloo): evaluation counts every validation sample exactly once."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = [
    "--hidden_size",
    "16",
    "--num_hidden_layers",
    "2",
    "--num_attention_heads",
    "2",
    "--max_train_steps",
    "4",
    "--per_device_train_batch_size",
    "16",
    "--per_device_eval_batch_size",
    "8",
    "--max_train_samples",
    "128",
    "--max_eval_samples",
    "61",
    "--layer_srr_samples",
    "13",
    "--disable_tqdm",
]


@pytest.mark.slow  # two torchrun processes: ~15 s
def test_two_process_torchrun_counts_each_eval_sample_once(tmp_path):
    out = tmp_path / "ddp"
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    with socket.socket() as sock:  # torchrun's static rendezvous needs a concrete free port
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        port,
        os.path.join(ROOT, "recipes", "train_crate.py"),
        "--output_dir",
        str(out),
        *FLAGS,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((out / "all_results.json").read_text())
    assert results["num_processes"] == 2
    # 61 is not a multiple of 2 processes x 8: gather_for_metrics must drop the padding duplicates
    assert results["eval_samples"] == 61 and results["train_samples"] == 128
    assert results["layer_srr_samples"] == 13
    assert all(h["eval_samples"] == 61 for h in results["history"])

    # the reported metrics are those of the saved model over exactly those 61 images (single process here)
    from hf_tdiag.training import train

    single = train(
        output_dir=str(tmp_path / "single"),
        **{
            FLAGS[i].lstrip("-"): (int(FLAGS[i + 1]) if FLAGS[i + 1].isdigit() else FLAGS[i + 1])
            for i in range(0, len(FLAGS) - 1, 2)
            if FLAGS[i] != "--disable_tqdm"
        }
        | {"disable_tqdm": True},
    )
    assert single["eval_samples"] == results["eval_samples"]

    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    import hf_tdiag  # noqa: F401
    from hf_tdiag.inputs import digits_split

    model = AutoModelForImageClassification.from_pretrained(str(out)).eval()
    processor = AutoImageProcessor.from_pretrained(str(out))
    _, x_te, _, y_te = digits_split()
    x = processor([Image.fromarray(i) for i in x_te[:61]], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        logits = model(pixel_values=x).logits
    y = torch.as_tensor(y_te[:61])
    assert results["eval_accuracy"] == pytest.approx(float((logits.argmax(-1) == y).double().mean()))
    assert results["eval_loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)), rel=1e-5)
