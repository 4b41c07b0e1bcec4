"""Time and peak memory of one ToST attention (TSSA) against the SDPA self-attention of a ViT block of the same
width, from 256 to 16,384 tokens, on CPU (forward pass, batch 1, float32, no gradients).

TSSA is linear in the number of tokens N (per-head second moments of the tokens, no N x N matrix); softmax
attention is quadratic in time. Each (module, N) runs in its own subprocess so that its peak resident memory
(``ru_maxrss``) belongs to that measurement alone; the memory reported is the peak during the timed forwards
minus the resident memory just before them.

    python benchmarks/bench_tost.py                      # width 384 (ToST-S: 8 heads; ViT-S: 6 heads)
    python benchmarks/bench_tost.py --tokens 256 1024 --repeats 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _module(kind: str, width: int):
    import torch

    if kind == "tssa":
        from hf_tdiag.models.tost import TostConfig
        from hf_tdiag.models.tost.modeling_tost import TostTSSA

        return TostTSSA(TostConfig(hidden_size=width, num_attention_heads=8, image_size=16, patch_size=16)).eval()
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTAttention

    config = ViTConfig(hidden_size=width, num_attention_heads=6)
    config._attn_implementation = "sdpa"

    class Attention(torch.nn.Module):  # ViTAttention returns (output, weights); keep the output
        def __init__(self):
            super().__init__()
            self.inner = ViTAttention(config)

        def forward(self, x):
            return self.inner(x)[0]

    return Attention().eval()


def measure_one(kind: str, tokens: int, width: int, repeats: int) -> dict:
    """``{"seconds": median forward time, "peak_mib": peak RSS increase during the forwards}`` of one module."""
    import torch

    torch.manual_seed(0)
    module = _module(kind, width)
    x = torch.randn(1, tokens, width)
    with torch.no_grad():
        module(x)  # warm-up
        before = _rss_mib()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            module(x)
            times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": statistics.median(times), "peak_mib": max(peak - before, 0.0)}


def _run_child(kind: str, tokens: int, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, str(tokens), "--width", str(args.width),
           "--repeats", str(args.repeats), "--threads", str(args.threads)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the table here")
    p.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(measure_one(args.child[0], int(args.child[1]), args.width, args.repeats)))
        return 0
    rows = []
    print(f"{'tokens':>7} {'TSSA s':>9} {'SDPA s':>9} {'SDPA/TSSA':>9} {'TSSA MiB':>9} {'SDPA MiB':>9}")
    for n in args.tokens:
        tssa, sdpa = _run_child("tssa", n, args), _run_child("sdpa", n, args)
        row = {"tokens": n, "tssa_seconds": tssa["seconds"], "sdpa_seconds": sdpa["seconds"],
               "time_ratio_sdpa_over_tssa": sdpa["seconds"] / tssa["seconds"], "tssa_peak_mib": tssa["peak_mib"],
               "sdpa_peak_mib": sdpa["peak_mib"]}  # fmt: skip
        rows.append(row)
        print(f"{n:>7} {row['tssa_seconds']:>9.4f} {row['sdpa_seconds']:>9.4f} {row['time_ratio_sdpa_over_tssa']:>9.2f} "
              f"{row['tssa_peak_mib']:>9.1f} {row['sdpa_peak_mib']:>9.1f}")  # fmt: skip
    crossover = next((r["tokens"] for r in rows if r["time_ratio_sdpa_over_tssa"] > 1), None)
    print(f"TSSA is faster from {crossover} tokens on" if crossover else "SDPA was faster at every size measured")
    if args.json:
        meta = {"width": args.width, "repeats": args.repeats, "threads": args.threads, "torch": torch.__version__,
                "machine": platform.processor() or platform.machine(), "load_average": os.getloadavg()}  # fmt: skip
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "crossover_tokens": crossover, **meta}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
