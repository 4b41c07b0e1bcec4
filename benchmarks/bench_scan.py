#!/usr/bin/env python
"""``hf_tdiag.scan`` against a plain loop over a zoo: models per minute and peak resident memory per worker.

One run builds a zoo of small models (random CRATE digits classifiers of 1–4 blocks and ViTs of two widths, saved
with ``save_pretrained``) and measures SRR (on 32 digits images) and both Schatten proxies of every model with:

* ``loop``: a plain Python loop in one process — ``load_model``, ``layer_srr``, ``schatten_bounds`` per model, no
  cache, no table (what a user scripts by hand);
* ``local1``: ``scan(..., jobs=1)`` (the models one after another in the scan's process);
* ``local2``: ``scan(..., jobs=2, threads=1)`` (two worker processes, one thread each);
* ``ray2``: ``scan(..., executor="ray", jobs=2)`` (a local Ray instance, one CPU per task), when Ray is installed;

each in a fresh child process with an empty scan folder, first idle and then with one core kept busy by a spinner
process (``while True: pass``). Models per minute is the zoo's size over the child's wall time for the measuring
call (imports excluded); peak memory per worker is the child's peak RSS (``loop``, ``local1``), or the largest
peak RSS the workers report (``local2``, ``ray2``: ``ScanResult.summary["worker_peak_rss_mb"]``). A second part scans
10 and then 20 models with ``local1`` to show the peak does not grow with the zoo. Every number carries the
1-minute load average before and after it (``os.getloadavg()``): on a machine shared with other work only the
ratios within one run mean something. Results: ``benchmarks/results/bench_scan_cpu.json`` (or ``--output``).

    python benchmarks/bench_scan.py             # 20 models, every mode idle and busy, then 10 vs 20 models
    python benchmarks/bench_scan.py --models 24 --modes loop,local1
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

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("loop", "local1", "local2", "ray2")
SAMPLES = 32


def build_zoo(root: str, count: int) -> list[str]:
    """``count`` small image classifiers: CRATE of 1–4 blocks and ViTs of widths 16 and 32, each with its processor."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor

    models = []
    for i in range(count):
        folder = os.path.join(root, f"model-{i:02d}")
        torch.manual_seed(i)
        if i % 3 == 2:
            width = 16 if i % 2 else 32
            config = ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=width, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=2 * width, num_labels=10)  # fmt: skip
            ViTForImageClassification(config).save_pretrained(folder)
            ViTImageProcessor(size={"height": 8, "width": 8}).save_pretrained(folder)
        else:
            config = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=1 + i % 4)
            CrateForImageClassification(config).save_pretrained(folder)
            CrateImageProcessor.for_config(config).save_pretrained(folder)
        models.append(folder)
    return models


def _peak_rss_mb() -> float:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def child(mode: str, models: list[str], out: str) -> dict:
    """One measurement in this (fresh) process: the seconds of the measuring call and the peak memory per worker."""
    import hf_tdiag
    from hf_tdiag.inputs import load_images

    images = load_images("digits", limit=SAMPLES).images
    start = time.perf_counter()
    if mode == "loop":
        from hf_tdiag.batching import encoded_batches
        from hf_tdiag.diagnostics.schatten import schatten_bounds
        from hf_tdiag.diagnostics.srr import layer_srr
        from hf_tdiag.loading import load_model

        for model in models:
            loaded = load_model(model, eager_attention=False)
            layer_srr(loaded.model, encoded_batches(loaded, images, 32), progress=False)
            schatten_bounds(loaded.model)
        peak = _peak_rss_mb()
    else:
        options = {"executor": "ray", "jobs": 2, "executor_options": {"num_cpus": 1}} if mode == "ray2" else {}
        if mode == "local2":
            options = {"jobs": 2, "threads": 1}
        result = hf_tdiag.scan(models, ["srr", "schatten"], images, output_dir=out, progress=False, figures=False,
                               **options)  # fmt: skip
        assert not result.failures, result.failures
        peak = _peak_rss_mb() if mode == "local1" else result.summary["worker_peak_rss_mb"]
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 3), "models_per_minute": round(60 * len(models) / seconds, 2),
            "peak_rss_mb_per_worker": round(peak, 1), "driver_peak_rss_mb": round(_peak_rss_mb(), 1)}  # fmt: skip


def _run_child(mode: str, models: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_scan_") as out:
        before = os.getloadavg()[0]
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, "--scan-dir", out, *models],
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
        after = os.getloadavg()[0]
    if proc.returncode != 0:
        return {"error": proc.stderr[-1500:], "load_before": before, "load_after": after}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "load_before": before, "load_after": after}


def _spinner():
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=int, default=20, help="zoo size (default 20)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {','.join(MODES)}")
    p.add_argument("--timeout", type=float, default=900, help="seconds per measurement (default 900)")
    p.add_argument("--output", default=os.path.join(HERE, "results", "bench_scan_cpu.json"))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--scan-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("zoo", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.zoo, args.scan_dir)))
        return 0
    modes = [m for m in args.modes.split(",") if m]
    if "ray2" in modes:
        try:
            import ray  # noqa: F401
        except ImportError:
            modes.remove("ray2")
    with tempfile.TemporaryDirectory(prefix="bench_scan_zoo_") as root:
        models = build_zoo(root, max(args.models, 20))
        results = {"machine": {"platform": platform.platform(), "python": platform.python_version(),
                               "cpus": os.cpu_count(), "load_at_start": os.getloadavg()},
                   "zoo": {"models": len(models), "diagnostics": ["srr", "schatten"], "images": SAMPLES},
                   "runs": {}}  # fmt: skip
        for condition in ("idle", "busy"):
            spinner = _spinner() if condition == "busy" else None
            try:
                for mode in modes:
                    results["runs"][f"{condition}/{mode}"] = r = _run_child(mode, models, args.timeout)
                    print(f"{condition:>4} {mode:>6}: {json.dumps(r)[:200]}", flush=True)
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
        for condition in ("idle", "busy"):
            base = results["runs"].get(f"{condition}/loop", {}).get("seconds")
            for mode in modes:
                r = results["runs"][f"{condition}/{mode}"]
                if base and "seconds" in r:
                    r["speed_vs_loop"] = round(base / r["seconds"], 3)
        results["memory_growth"] = {n: _run_child("local1", models[:n], args.timeout) for n in (10, 20)}
        print(f"peak RSS 10 vs 20 models: {json.dumps(results['memory_growth'])}", flush=True)
    results["machine"]["load_at_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=2)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
