"""Peak resident memory and time of ``layer_srr`` and ``schatten_bounds`` on a decoder in memory against the same
decoder with every block offloaded to disk (Accelerate big-model inference, passed to the diagnostics as it is),
on an idle machine and with a busy-loop process beside it.

A GPT-2-style decoder (default 8 blocks of width 1024, random weights, float32, ~400 MiB) is saved once with
``save_pretrained`` into a cache folder outside the repository. Each measurement runs in its own subprocess; after
the imports it resets the kernel's peak-RSS counter (``/proc/self/clear_refs``, ``VmHWM``, Linux), so the imports'
own transient peak (several hundred MiB) does not mask what follows, and reports its resident memory before
loading, the peak while loading, the resident memory after loading, the peak during the diagnostic (the counter
reset again after loading), its wall time and the numbers it measured:

* ``baseline`` — a meta-device model built, no weight read;
* ``memory-<diag>`` — ``from_pretrained(path)`` then the diagnostic;
* ``disk-<diag>``   — ``from_pretrained(path, device_map=<embeddings and head in memory, every block on disk>,
  offload_folder=...)`` then the diagnostic (no wrapper: the diagnostics read offloaded weights one job at a time).

``<diag>``: ``srr`` (``layer_srr`` on 8 sequences of 64 tokens) or ``schatten`` (``schatten_bounds``). The whole set
runs twice: ``idle`` (nothing of ours beside it; other users' load is recorded as the 1-minute load average) and
``spinner`` (one busy-loop process running throughout). Reported per condition: the peaks above the memory before
loading, disk / memory ratios of the diagnostic's peak and of the times, and whether disk and memory gave the same
numbers (relative difference ≤ 1e-6). Usage: ``python benchmarks/bench_offload_memory.py [--out FILE]``.
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

_CHILD = r"""
import json, os, re, sys, time
import torch
torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
import hf_tdiag
from transformers import AutoConfig, AutoModelForCausalLM
mode, diag, path, offload = sys.argv[1:5]

def status(key):
    with open("/proc/self/status") as fh:
        return int(re.search(key + r":\s+(\d+)", fh.read()).group(1)) / 1024

def reset_peak():  # Linux: VmHWM (peak resident memory) starts again from the current VmRSS
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")

ids = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(0))
config = AutoConfig.from_pretrained(path)
reset_peak()
before = status("VmRSS")
start = time.perf_counter()
numbers = None
if mode == "baseline":
    with torch.device("meta"):
        AutoModelForCausalLM.from_config(config)
    loaded, load_peak = status("VmRSS"), status("VmHWM")
else:
    if mode == "memory":
        model = AutoModelForCausalLM.from_pretrained(path).eval()
    else:
        device_map = {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.drop": "cpu",
                      **{f"transformer.h.{i}": "disk" for i in range(config.n_layer)},
                      "transformer.ln_f": "cpu", "lm_head": "cpu"}
        model = AutoModelForCausalLM.from_pretrained(path, device_map=device_map, offload_folder=offload).eval()
    loaded, load_peak = status("VmRSS"), status("VmHWM")
    reset_peak()
    if diag == "srr":
        numbers = hf_tdiag.layer_srr(model, {"input_ids": ids}, batch_size=4, progress=False).per_layer("srr")
    else:
        rep = hf_tdiag.schatten_bounds(model, progress=False, num_workers=1)
        numbers = [rep.schatten_bound, rep.edelman_bound, *[m.spectral_norm for m in rep.matrices]]
diag_peak = status("VmHWM") if mode != "baseline" else loaded
print(json.dumps({"rss_before_load_mib": before, "load_peak_mib": load_peak, "rss_after_load_mib": loaded,
                  "diagnostic_peak_mib": diag_peak, "seconds": time.perf_counter() - start, "numbers": numbers}))
"""

_SPIN = "while True:\n    pass\n"
RUNS = ("baseline", "memory-srr", "disk-srr", "memory-schatten", "disk-schatten")


def _ensure_model(cache: str, shape: dict) -> tuple[str, float]:
    """The saved decoder's folder and its size in MiB (built once per shape)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = os.path.join(cache, f"l{shape['n_layer']}-d{shape['n_embd']}")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        import torch

        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config(**shape)).save_pretrained(folder)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))
    return folder, size / 2**20


def _run(name: str, path: str, offload: str, threads: int) -> dict:
    mode, _, diag = name.partition("-")
    env = {**os.environ, "BENCH_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, diag or "none", path, offload],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{name}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _same(a, b) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-6 * max(1.0, abs(x)) for x, y in zip(a, b))


def _condition(path: str, threads: int, spinner: bool) -> dict:
    spin = subprocess.Popen([sys.executable, "-c", _SPIN]) if spinner else None
    try:
        load_before = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="hf_tdiag_offload_") as offload:
            runs = {name: _run(name, path, os.path.join(offload, name), threads) for name in RUNS}
        load_after = os.getloadavg()[0]
    finally:
        if spin is not None:
            spin.kill()
            spin.wait()
    out = {"load_average_1min_before": load_before, "load_average_1min_after": load_after}
    for name, run in runs.items():
        for key in ("rss_before_load_mib", "load_peak_mib", "rss_after_load_mib", "diagnostic_peak_mib"):
            out[f"{name}_{key}"] = round(run[key], 1)
        out[f"{name}_seconds"] = round(run["seconds"], 2)
    for diag in ("srr", "schatten"):
        mem, disk = runs[f"memory-{diag}"], runs[f"disk-{diag}"]
        for which, run in (("memory", mem), ("disk", disk)):
            out[f"{diag}_{which}_load_peak_above_imports_mib"] = round(
                run["load_peak_mib"] - run["rss_before_load_mib"], 1
            )
            out[f"{diag}_{which}_peak_above_imports_mib"] = round(
                run["diagnostic_peak_mib"] - run["rss_before_load_mib"], 1
            )
        out[f"{diag}_disk_over_memory_peak"] = round(
            out[f"{diag}_disk_peak_above_imports_mib"] / max(out[f"{diag}_memory_peak_above_imports_mib"], 1e-9), 3
        )
        out[f"{diag}_disk_over_memory_time"] = round(disk["seconds"] / mem["seconds"], 2)
        out[f"{diag}_same_numbers"] = _same(mem["numbers"], disk["numbers"])
    return out


def _table(result: dict) -> str:
    rows = [
        ("loading: peak above imports, memory", "{d}_memory_load_peak_above_imports_mib"),
        ("loading: peak above imports, disk", "{d}_disk_load_peak_above_imports_mib"),
        ("diagnostic: peak above imports, memory", "{d}_memory_peak_above_imports_mib"),
        ("diagnostic: peak above imports, disk", "{d}_disk_peak_above_imports_mib"),
        ("disk / memory, diagnostic peak", "{d}_disk_over_memory_peak"),
        ("disk / memory, time", "{d}_disk_over_memory_time"),
        ("same numbers", "{d}_same_numbers"),
    ]
    lines = [f"{'':40s} {'idle':>12s} {'spinner':>12s}"]
    for diag in ("srr", "schatten"):
        lines.append(diag)
        for label, key in rows:
            k = key.format(d=diag)
            lines.append(f"  {label:38s} {result['idle'][k]!s:>12s} {result['spinner'][k]!s:>12s}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=DEFAULT_CACHE, help="folder of the saved decoders (built once per shape)")
    parser.add_argument("--layers", type=int, default=8, help="decoder blocks")
    parser.add_argument("--width", type=int, default=1024, help="hidden size (16 heads of width/16)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each measurement")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    shape = {"n_layer": args.layers, "n_embd": args.width, "n_head": 16, "n_positions": 128, "vocab_size": 256}
    path, size_mib = _ensure_model(args.cache, shape)
    block_mib = 12 * args.width**2 * 4 / 2**20
    result = {
        "shape": shape,
        "model_mib_as_stored": round(size_mib, 1),
        "block_weights_mib": round(block_mib, 1),
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.platform(),
        "idle": _condition(path, args.threads, spinner=False),
        "spinner": _condition(path, args.threads, spinner=True),
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    print(_table(result))
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    same = all(result[c][f"{d}_same_numbers"] for c in ("idle", "spinner") for d in ("srr", "schatten"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
