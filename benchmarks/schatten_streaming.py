"""Memory and time of ``schatten_bounds(path, streaming=True)`` against the in-memory path on a sharded decoder.

Run through ``benchmarks/bench_schatten.py --streaming`` (or directly). A Llama-style decoder (grouped-query
attention, gated MLP, untied embeddings; default ≈ 0.6 B parameters) is built from a config with random weights and
saved once in bfloat16 with ``save_pretrained(max_shard_size=...)`` into a cache folder outside the repository (free
disk is checked first); later runs reuse it. Each measurement runs in its own subprocess and reports its peak
resident memory (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) and wall time:

* ``baseline``  — the fixed overhead: Python + torch + transformers + hf_tdiag imported and the checkpoint's
  layout read (config, index, meta-device model), no tensor read;
* ``streaming`` — ``schatten_bounds(path, streaming=True)``: one job's tensors at a time from the shards;
* ``memory``    — ``schatten_bounds(path)``: the model loaded (bf16, as saved), then the same computation.

Reported: each peak, ``streaming − baseline`` against the largest layer's weights as stored (the target:
``≤ 1.5×``), the streaming / in-memory time ratio (target ≤ 1.2) and that both paths give the same numbers.

Every measurement runs twice: with glibc's default allocator settings and with ``MALLOC_MMAP_THRESHOLD_=131072``
(allocations above 128 KiB mapped and unmapped individually). By default glibc raises its mmap threshold to the size
of the last freed block (up to 32 MiB), so the streaming path's short-lived float64 blocks (8 MiB) and the tensors it
reads come from the heap afterwards and freed heap memory is not returned: the peak then depends on fragmentation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CACHE = os.path.join(tempfile.gettempdir(), "hf_tdiag_bench", "llama-gqa-bf16")
SHAPE = {  # ≈ 0.6 B parameters: 16 blocks of ≈ 31.7 M + 2 × 49 M embeddings
    "hidden_size": 1536,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "intermediate_size": 5504,
    "vocab_size": 32000,
}


def _config(shape: dict):
    from transformers import LlamaConfig

    return LlamaConfig(**shape, max_position_embeddings=2048, tie_word_embeddings=False)


def _param_count(shape: dict) -> int:
    d, L, H, Hkv, inter, V = (
        shape[k]
        for k in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "vocab_size",
        )
    )
    p = d // H
    per_layer = 2 * d * d + 2 * d * Hkv * p + 3 * d * inter + 2 * d
    return L * per_layer + 2 * V * d + d


def build_checkpoint(folder: str, shape: dict, shard: str) -> dict:
    """Write the random bf16 checkpoint once (refuses when the disk has less than 3× its size free)."""
    info = os.path.join(folder, "bench_info.json")
    if os.path.isfile(info):
        with open(info, encoding="utf-8") as fh:
            data = json.load(fh)
        if data["shape"] == shape:
            return data
        shutil.rmtree(folder)
    need = 2 * _param_count(shape)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    free = shutil.disk_usage(os.path.dirname(folder)).free
    if free < 3 * need:
        raise SystemExit(f"--cache-dir: {free / 1e9:.1f} GB free, the checkpoint needs {need / 1e9:.1f} GB (x3 margin)")
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(shape), dtype=torch.bfloat16)
    with torch.no_grad():
        for _name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0, 0.02)
    model.save_pretrained(folder, max_shard_size=shard)
    data = {
        "shape": shape,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "bfloat16",
        "max_shard_size": shard,
        "shards": len([f for f in os.listdir(folder) if f.endswith(".safetensors")]),
        "write_s": time.perf_counter() - t0,
    }
    with open(info, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
    return data


def largest_layer_bytes(folder: str) -> dict:
    """Bytes as stored of every block's weight tensors (read from the shard headers), and the largest."""
    from hf_tdiag.probes.checkpoint import open_checkpoint
    from hf_tdiag.probes.describe import describe

    ckpt = open_checkpoint(folder)
    layout = describe(ckpt.meta_model).decoder_layout()
    per = [layout.layer_bytes(i, ckpt.nbytes) for i in range(layout.num_layers)]
    return {"per_layer": per, "largest": max(per)}


def measure(folder: str, mode: str) -> dict:
    """One measurement in this process (run in a fresh subprocess): peak RSS and wall time."""
    t0 = time.perf_counter()
    import hf_tdiag
    from hf_tdiag.probes.checkpoint import open_checkpoint

    out = {"mode": mode, "import_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    if mode == "baseline":  # the libraries the computation uses are loaded too (scipy's LAPACK, threadpoolctl)
        import scipy.linalg  # noqa: F401
        import threadpoolctl  # noqa: F401

        open_checkpoint(folder)
    else:
        report = hf_tdiag.schatten_bounds(folder, streaming=mode == "streaming")
        out.update(
            ours=report.schatten_bound,
            edelman=report.edelman_bound,
            num_matrices=len(report.matrices),
            per_matrix=[m.min_contribution for m in report.matrices],
        )
    out["seconds"] = time.perf_counter() - t0
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes
    return out


ALLOCATORS = {"glibc_default": {}, "mmap_threshold_128k": {"MALLOC_MMAP_THRESHOLD_": "131072"}}


def _run(folder: str, mode: str, allocator: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    env.update(ALLOCATORS[allocator])
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--measure", mode, "--cache-dir", folder],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"measurement {mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _summary(runs: dict, largest: int) -> dict:
    """Peaks, working memory over the fixed overhead, best times and their ratio of one allocator setting."""
    peak = {m: max(r["peak_rss_bytes"] for r in rs) for m, rs in runs.items()}
    best = {m: min(r["seconds"] for r in rs) for m, rs in runs.items() if m != "baseline"}
    working = peak["streaming"] - peak["baseline"]
    return {
        "peak_rss_bytes": peak,
        "peak_rss_bytes_all": {m: [r["peak_rss_bytes"] for r in rs] for m, rs in runs.items()},
        "fixed_overhead_bytes": peak["baseline"],
        "streaming_working_bytes": working,
        "streaming_working_over_largest_layer": working / largest,
        "streaming_target_met": working <= 1.5 * largest,
        "memory_working_bytes": peak["memory"] - peak["baseline"],
        "streaming_peak_over_memory_peak": peak["streaming"] / peak["memory"],
        "seconds_best": best,
        "seconds_all": {k: [r["seconds"] for r in v] for k, v in runs.items()},
        "time_ratio_streaming_over_memory": best["streaming"] / best["memory"],
    }


def run(cache_dir: str, output: str, repeats: int, shard: str) -> dict:
    load_before = os.getloadavg()
    # written by a child: a child's ru_maxrss starts at its parent's high-water mark (Linux keeps the peak across
    # fork and exec), so a parent that once held the 1.2 GB model would inflate every measurement after it
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--build-only",
        "--cache-dir",
        cache_dir,
        "--max-shard-size",
        shard,
    ]
    subprocess.run(cmd, check=True)
    ckpt = build_checkpoint(cache_dir, SHAPE, shard)  # reads the record the child wrote
    layers = largest_layer_bytes(cache_dir)
    runs = {a: {"baseline": [], "streaming": [], "memory": []} for a in ALLOCATORS}
    for _ in range(repeats):  # alternate paths and allocator settings so background load hits all alike
        for allocator in ALLOCATORS:
            for mode in ("baseline", "streaming", "memory"):
                r = _run(cache_dir, mode, allocator)
                runs[allocator][mode].append(r)
                print(
                    f"  {allocator:>20} {mode:>9}: {r['seconds']:7.2f}s, peak RSS {r['peak_rss_bytes'] / 2**20:8.1f} MiB",
                    flush=True,
                )
    first = {a: (rs["streaming"][0], rs["memory"][0]) for a, rs in runs.items()}
    same = all(
        s["ours"] == m["ours"] and s["edelman"] == m["edelman"] and s["per_matrix"] == m["per_matrix"]
        for s, m in first.values()
    )
    s0 = first["glibc_default"][0]
    result = {
        "benchmark": "schatten_streaming_memory",
        "targets": "streaming peak RSS <= 1.5 x largest layer's weights + fixed overhead; time <= 1.2 x in-memory",
        "fixed_overhead": "peak RSS of a process that imports hf_tdiag (torch, transformers), scipy.linalg and "
        "threadpoolctl and reads the checkpoint's layout (config, index, meta-device model)",
        "checkpoint": ckpt,
        "largest_layer_bytes": layers["largest"],
        "model_weight_bytes": 2 * ckpt["num_parameters"],
        "allocators": {a: _summary(rs, layers["largest"]) for a, rs in runs.items()},
        "same_numbers": same,
        "values": {"ours": s0["ours"], "edelman": s0["edelman"], "num_matrices": s0["num_matrices"]},
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "nice": os.nice(0),
        },
    }
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with open(output, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)
    mib = 2**20
    print(
        f"checkpoint: {ckpt['num_parameters'] / 1e9:.3f} B parameters, bf16, {ckpt['shards']} shards; largest layer "
        f"{layers['largest'] / mib:.1f} MiB; same numbers streaming / in memory: {same}"
    )
    for a, sm in result["allocators"].items():
        peak = sm["peak_rss_bytes"]
        print(
            f"{a}: fixed overhead {peak['baseline'] / mib:.0f} MiB; streaming peak {peak['streaming'] / mib:.0f} MiB = "
            f"overhead + {sm['streaming_working_bytes'] / mib:.0f} MiB ({sm['streaming_working_over_largest_layer']:.2f}x "
            f"the largest layer); in-memory peak {peak['memory'] / mib:.0f} MiB; time streaming "
            f"{sm['seconds_best']['streaming']:.1f}s, in memory {sm['seconds_best']['memory']:.1f}s, ratio "
            f"{sm['time_ratio_streaming_over_memory']:.2f}"
        )
    print(f"wrote {output}")
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cache-dir", default=DEFAULT_CACHE, help=f"where the checkpoint is written once (default {DEFAULT_CACHE})"
    )
    ap.add_argument("--output", default=os.path.join(HERE, "results", "bench_schatten_streaming_cpu.json"))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-shard-size", default="200MB")
    ap.add_argument("--measure", choices=("baseline", "streaming", "memory"), help=argparse.SUPPRESS)
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.build_only:
        build_checkpoint(args.cache_dir, SHAPE, args.max_shard_size)
        return
    if args.measure:
        print(json.dumps(measure(args.cache_dir, args.measure)))
        return
    run(args.cache_dir, args.output, args.repeats, args.max_shard_size)


if __name__ == "__main__":
    main()
