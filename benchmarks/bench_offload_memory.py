"""Peak resident memory and time of ``layer_srr`` on a decoder in memory against the same decoder dispatched with
its blocks offloaded to disk (Accelerate big-model inference, ``hf_tdiag.integrations.big_model.readable_weights``).

A GPT-2-style decoder (default 8 blocks of width 512, random weights, float32) is saved once with
``save_pretrained`` into a cache folder outside the repository. Each measurement runs in its own subprocess and
reports its peak resident memory (``resource.getrusage(RUSAGE_SELF).ru_maxrss``), its wall time and the per-layer
SRR it measured:

* ``baseline`` — Python + torch + transformers + hf_tdiag imported and a meta-device model built, no weight read;
* ``memory``   — ``from_pretrained(path)`` then ``layer_srr``;
* ``disk``     — ``from_pretrained(path, device_map=<embeddings in memory, every block on disk>, offload_folder=...)``
  then ``layer_srr`` inside ``readable_weights(model)``.

Reported: each peak, the model's size as stored, the disk / memory time ratio and whether both give the same
per-layer SRR (relative difference ≤ 1e-6). Usage: ``python benchmarks/bench_offload_memory.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

DEFAULT_CACHE = os.path.join(tempfile.gettempdir(), "hf_tdiag_bench", "gpt2-offload")
SHAPE = {"n_layer": 8, "n_embd": 512, "n_head": 8, "n_positions": 128, "vocab_size": 256}

_CHILD = r"""
import json, os, resource, sys, time
import torch
torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
import hf_tdiag
from transformers import AutoConfig, AutoModelForCausalLM
from hf_tdiag.integrations.big_model import readable_weights
mode, path, offload = sys.argv[1:4]
ids = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(0))
start = time.perf_counter()
srr = None
if mode == "baseline":
    with torch.device("meta"):
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
elif mode == "memory":
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    srr = hf_tdiag.layer_srr(model, {"input_ids": ids}, batch_size=4, progress=False).per_layer("srr")
else:
    config = AutoConfig.from_pretrained(path)
    device_map = {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.drop": "cpu",
                  **{f"transformer.h.{i}": "disk" for i in range(config.n_layer)},
                  "transformer.ln_f": "cpu", "lm_head": "cpu"}
    model = AutoModelForCausalLM.from_pretrained(path, device_map=device_map, offload_folder=offload).eval()
    with readable_weights(model):
        srr = hf_tdiag.layer_srr(model, {"input_ids": ids}, batch_size=4, progress=False).per_layer("srr")
print(json.dumps({"mode": mode, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "seconds": time.perf_counter() - start, "srr": srr}))
"""


def _ensure_model(cache: str) -> tuple[str, float]:
    """The saved decoder's folder and its size in MiB (built once)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    if not os.path.isfile(os.path.join(cache, "config.json")):
        import torch

        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config(**SHAPE)).save_pretrained(cache)
    size = sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache) if f.endswith(".safetensors"))
    return cache, size / 2**20


def _run(mode: str, path: str, offload: str, threads: int) -> dict:
    env = {**os.environ, "BENCH_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, path, offload], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"{mode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=DEFAULT_CACHE, help="folder of the saved decoder (built once)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each measurement")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    path, size_mib = _ensure_model(args.cache)
    with tempfile.TemporaryDirectory(prefix="hf_tdiag_offload_") as offload:
        runs = {mode: _run(mode, path, os.path.join(offload, mode), args.threads) for mode in ("baseline", "memory")}
        runs["disk"] = _run("disk", path, os.path.join(offload, "disk"), args.threads)
    memory, disk = runs["memory"]["srr"], runs["disk"]["srr"]
    same = all(abs(a - b) <= 1e-6 * max(1.0, abs(a)) for a, b in zip(memory, disk)) and len(memory) == len(disk)
    result = {
        "shape": SHAPE,
        "model_mib_as_stored": round(size_mib, 1),
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        **{f"{mode}_peak_rss_mib": round(run["peak_rss_mib"], 1) for mode, run in runs.items()},
        **{f"{mode}_seconds": round(run["seconds"], 2) for mode, run in runs.items()},
        "disk_over_memory_time": round(runs["disk"]["seconds"] / runs["memory"]["seconds"], 2),
        "same_per_layer_srr": same,
        "srr_memory": memory,
        "srr_disk": disk,
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
