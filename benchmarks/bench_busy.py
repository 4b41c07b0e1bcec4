#!/usr/bin/env python
"""Each diagnostic idle and with N−1 cores kept busy, at 1 thread and at torch's default, against its baseline.

One run measures, side by side, every (condition, threads) pair for every case:

* conditions: ``idle`` (nothing started by the benchmark) and ``busy`` (N−1 spinner processes, one
  ``while True: pass`` loop each, N = the cores this process may use);
* threads: ``1`` (``torch.set_num_threads(1)`` and every BLAS limited to 1 by threadpoolctl) and ``default``
  (torch's and the BLAS libraries' own defaults) — the caller's setting; each measure runs under the thread policy
  of the diagnostic that calls it (:func:`hf_tdiag.diagnostics.entry.thread_policy`; a tree from before that
  policy moved to the diagnostics' entry applied it inside the measures, so the same benchmark compares both);
* cases and their baselines (each timed in the same child process, at the same thread setting):
  - ``srr_layer``: :func:`hf_tdiag.measures.sparse_rate_reduction` of one layer's tokens ``Z (16, 197, 768)`` with
    12 heads of 64, against the float32 token-side reference of ``benchmarks/bench_srr.py`` (``torch.logdet`` of
    ``I_N + c·A Aᵀ`` per head, as the official CRATE code), always at one thread (at two on a loaded machine
    MKL's batched LU behind ``torch.logdet`` reports ``SLASWP`` parameter errors and may not return);
  - ``att_svm_small`` / ``att_svm_large``: :func:`hf_tdiag.measures.attention_svm.att_svm` (Frobenius) on
    n32/T50/d64 and n64/T197/d768, against libsvm (``SVC(kernel="precomputed")``, kernel built + fit) as in
    ``benchmarks/bench_attention_svm.py``;
  - ``schatten_bert``: :func:`hf_tdiag.schatten_bounds` of a BERT-base-shaped model (768 wide, 12 heads, FFN 3072)
    against a values-only dense SVD of every explicit matrix (``np.linalg.svd(x, compute_uv=False)``,
    ``tests/test_schatten_reference.py``).

Each (condition, threads) pair runs in a fresh child process (so no thread pool or cache leaks between them) with
a time limit; a case that does not return in time is recorded as ``timeout``. Every timing carries the 1-minute
load average before and after it (``os.getloadavg()``): on a machine shared with other work only the ratios within
one run mean something. Results: ``benchmarks/results/bench_busy_cpu.json`` (or ``--output``).

    python benchmarks/bench_busy.py --quick      # a few minutes: 1-layer BERT-base width, no large Att-SVM case
    python benchmarks/bench_busy.py              # all cases, 12 layers
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("srr_layer", "att_svm_small", "att_svm_large", "schatten_bert")
QUICK_CASES = ("srr_layer", "att_svm_small", "schatten_bert")
CONDITIONS = ("idle", "busy")
THREADS = ("1", "default")


# ---------------------------------------------------------------------------------------------- child side


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _time(fn, repeats: int) -> dict:
    """Median wall and process-CPU seconds of ``repeats`` calls after one warm-up, with the load around them."""
    load0 = _load()
    out = fn()
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return {
        "wall_s": statistics.median(walls),
        "walls_s": walls,
        "cpu_s": statistics.median(cpus),
        "load_before": load0,
        "load_after": _load(),
        "_out": out,
    }


def _as_diagnostic(name: str, fn):
    """``fn`` run under diagnostic ``name``'s thread policy, as the diagnostic runs its measures."""
    try:
        from hf_tdiag.diagnostics.entry import thread_policy
    except ImportError:  # an older tree: its measures applied the policy themselves
        return fn

    def run():
        with thread_policy(name):
            return fn()

    return run


def _srr_layer(repeats: int, quick: bool) -> dict:
    import torch
    from bench_srr import ref_state_terms

    from hf_tdiag._threads import torch_threads
    from hf_tdiag.measures import sparse_rate_reduction

    g = torch.Generator().manual_seed(0)
    Z = torch.randn(16, 197, 768, generator=g)
    U = torch.linalg.qr(torch.randn(12, 768, 64, generator=g))[0]
    ours = _time(_as_diagnostic("srr", lambda: sparse_rate_reduction(Z, U)), repeats)
    # the reference at one thread in both columns: at 2 threads on a loaded machine torch.logdet's batched LU
    # (MKL) prints "Parameter 6 was incorrect on entry to SLASWP" and may not return (seen in this benchmark)
    with torch_threads(1):
        base = _time(lambda: ref_state_terms(Z, U, 0.1, 1.0, torch.float32)[:, 3], repeats)
        exact = ref_state_terms(Z, U, 0.1, 1.0, torch.float64)[:, 3]  # (float64 LU: the same MKL errors at 2)
    agree = {
        "ours_vs_float64_max_rel": float(((ours["_out"] - exact).abs() / exact.abs()).max()),
        "baseline_vs_float64_max_rel": float(((base["_out"] - exact).abs() / exact.abs()).max()),
    }
    return {"ours": ours, "baseline": base, "agreement": agree, "shape": [16, 197, 768], "heads": [12, 64]}


def _att_svm(n: int, T: int, d: int, repeats: int) -> dict:
    import torch
    from bench_attention_svm import libsvm_fro, random_instance

    from hf_tdiag.measures.attention_svm import att_svm

    X, z, sel = random_instance(n, T, d)
    Xt, zt, st = torch.from_numpy(X), torch.from_numpy(z), torch.from_numpy(sel)
    ours = _time(_as_diagnostic("attention_svm", lambda: att_svm(Xt, zt, st)), repeats)
    base = _time(lambda: libsvm_fro(X, z, sel), 1 if n * T * d > 1e6 else repeats)
    rel = abs(base["_out"]["objective"] - ours["_out"].objective) / ours["_out"].objective
    base["_out"] = None
    return {"ours": ours, "baseline": base, "agreement": {"objective_rel_diff": rel}, "shape": [n, T, d]}


def _schatten_bert(repeats: int, quick: bool) -> dict:
    import torch
    from transformers import BertConfig, BertModel

    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from test_schatten_reference import dense_reference

    import hf_tdiag

    layers = 1 if quick else 12
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=512,
        hidden_size=768,
        num_hidden_layers=layers,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=64,
    )
    model = BertModel(cfg).eval()
    ours = _time(lambda: hf_tdiag.schatten_bounds(model), repeats)
    base = _time(lambda: dense_reference(model.state_dict(), layers, 12, svd_call="values"), 1)
    report = ours["_out"]
    value = getattr(report, "schatten_bound", None)
    value = report.schatten_bound if value is None else value
    rel = abs(value - base["_out"]["ours"]) / abs(base["_out"]["ours"])
    base["_out"] = None
    return {"ours": ours, "baseline": base, "agreement": {"bound_rel_diff": rel}, "layers": layers}


def _child(args) -> None:
    sys.path.insert(0, HERE)
    import torch

    if args.threads == "1":
        torch.set_num_threads(1)
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)
    threads_used = torch.get_num_threads()
    runners = {
        "srr_layer": lambda: _srr_layer(args.repeats, args.quick),
        "att_svm_small": lambda: _att_svm(32, 50, 64, args.repeats),
        "att_svm_large": lambda: _att_svm(64, 197, 768, 1),
        "schatten_bert": lambda: _schatten_bert(args.repeats, args.quick),
    }
    for case in args.cases.split(","):
        res = runners[case]()
        for side in ("ours", "baseline"):
            res[side].pop("_out", None)
        res.update(case=case, torch_threads=threads_used)
        with open(args.child_out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(res) + "\n")
        print(f"  {case}: ours {res['ours']['wall_s']:.3f} s, baseline {res['baseline']['wall_s']:.3f} s", flush=True)


def _interleaved(repeats: int) -> dict:
    """Ours at 1 thread and at the default, alternated call by call in one process (load drift cancels)."""
    import torch
    from bench_attention_svm import random_instance

    from hf_tdiag.measures import sparse_rate_reduction
    from hf_tdiag.measures.attention_svm import att_svm

    default = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    Z = torch.randn(16, 197, 768, generator=g)
    U = torch.linalg.qr(torch.randn(12, 768, 64, generator=g))[0]
    X, z, sel = (torch.from_numpy(a) for a in random_instance(32, 50, 64))
    XL, zL, selL = (torch.from_numpy(a) for a in random_instance(64, 197, 768))
    fns = {
        "srr_layer": _as_diagnostic("srr", lambda: sparse_rate_reduction(Z, U)),
        "att_svm_small": _as_diagnostic("attention_svm", lambda: att_svm(X, z, sel)),
        "att_svm_large": _as_diagnostic("attention_svm", lambda: att_svm(XL, zL, selL)),
    }
    out = {}
    for name, fn in fns.items():
        times = {"1": [], "default": []}
        for n in (1, default):
            torch.set_num_threads(n)
            fn()  # warm-up at both counts
        load0 = _load()
        for _ in range(repeats):
            for label, n in (("1", 1), ("default", default)):
                torch.set_num_threads(n)
                t0 = time.perf_counter()
                fn()
                times[label].append(time.perf_counter() - t0)
        torch.set_num_threads(default)
        med = {k: statistics.median(v) for k, v in times.items()}
        out[name] = {"wall_s": med, "walls_s": times, "one_over_default": med["1"] / med["default"]}
        out[name].update(load_before=load0, load_after=_load())
    return out


# ---------------------------------------------------------------------------------------------- parent side


def _spin() -> None:
    while True:
        pass


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _run_child(condition: str, threads: str, cases, args) -> list[dict]:
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as fh:
        out = fh.name
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--threads", threads, "--cases", ",".join(cases)]
    cmd += ["--child-out", out, "--repeats", str(args.repeats)] + (["--quick"] if args.quick else [])
    print(f"[{condition}, threads={threads}] load {_load():.2f}", flush=True)
    status = "ok"
    try:
        subprocess.run(cmd, timeout=args.timeout, check=True)
    except subprocess.TimeoutExpired:
        status = "timeout"
    except subprocess.CalledProcessError as err:
        status = f"failed (exit {err.returncode})"
    with open(out, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    os.unlink(out)
    done = {r["case"] for r in rows}
    rows += [{"case": c, "status": status} for c in cases if c not in done]
    for r in rows:
        r.update(condition=condition, threads=threads)
    return rows


def _table(rows: list[dict]) -> list[list]:
    """One line per case and condition: ours and the baseline at 1 and default threads, the ratios."""
    key = {(r["case"], r["condition"], r["threads"]): r for r in rows}
    lines = []
    for case in dict.fromkeys(r["case"] for r in rows):
        for cond in CONDITIONS:
            one, dflt = key.get((case, cond, "1"), {}), key.get((case, cond, "default"), {})
            if "ours" not in one or "ours" not in dflt:
                lines.append([case, cond] + ["-"] * 9)
                continue
            o1, od = one["ours"]["wall_s"], dflt["ours"]["wall_s"]
            b1, bd = one["baseline"]["wall_s"], dflt["baseline"]["wall_s"]
            loads = [one["ours"]["load_before"], dflt["ours"]["load_before"]]
            lines.append([case, cond, o1, od, b1, bd, b1 / o1, bd / od, o1 / od, min(loads), max(loads)])
    return lines


def _print_table(lines) -> None:
    head = ["case", "cond", "ours 1t", "ours dflt", "base 1t", "base dflt", "x base 1t", "x base dflt", "1t/dflt"]
    print(" ".join(f"{h:>13s}" for h in head) + "   load")
    for ln in lines:
        if ln[2] == "-":
            print(f"{ln[0]:>13s} {ln[1]:>13s}  (missing: timeout or failure)")
            continue
        nums = " ".join(f"{x:13.3f}" for x in ln[2:9])
        print(f"{ln[0]:>13s} {ln[1]:>13s} {nums}   {ln[9]:.1f}-{ln[10]:.1f}")


def _machine() -> dict:
    import numpy
    import torch

    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "usable_cores": _usable_cores(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_default_threads": torch.get_num_threads(),
        "numpy": numpy.__version__,
    }
    try:
        import sklearn

        info["sklearn"] = sklearn.__version__
    except ImportError:
        pass
    return info


def _run_interleaved(args) -> int:
    sys.path.insert(0, HERE)
    spinners_n = max(1, _usable_cores() - 1)
    run = {"benchmark": "bench_busy --interleaved", "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    run.update(machine=_machine(), busy_spinners=spinners_n, repeats=args.repeats, load_average_start=os.getloadavg())
    for cond in CONDITIONS:
        spinners = [mp.Process(target=_spin, daemon=True) for _ in range(spinners_n if cond == "busy" else 0)]
        for s in spinners:
            s.start()
        time.sleep(1.0 if spinners else 0.0)
        try:
            run[cond] = _interleaved(args.repeats)
        finally:
            for s in spinners:
                s.terminate()
                s.join()
        for name, r in run[cond].items():
            w = r["wall_s"]
            print(
                f"{name:14s} {cond}: 1 thread {w['1']:.3f} s, default {w['default']:.3f} s, ratio {r['one_over_default']:.2f}"
            )
    run["load_average_end"] = os.getloadavg()
    out = args.output.replace(".json", "_interleaved.json")
    data = {"benchmark": "bench_busy --interleaved", "runs": []}
    if os.path.exists(out):
        with open(out, encoding="utf-8") as fh:
            data = json.load(fh)
    data["runs"].append(run)
    with open(out + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    os.replace(out + ".tmp", out)
    print(f"wrote {out}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1-layer BERT-base width, no n64/T197/d768 Att-SVM case")
    p.add_argument("--cases", default=None, help=f"comma list from {','.join(CASES)}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=None, help="seconds per child (default 900 quick, 3600 full)")
    p.add_argument("--output", default=os.path.join(HERE, "results", "bench_busy_cpu.json"))
    p.add_argument(
        "--interleaved",
        action="store_true",
        help="only ours, 1 thread and default alternated call by call in one process, idle and busy (SRR, both Att-SVM cases)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", default="default", choices=THREADS, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.cases = args.cases or ",".join(CASES)
        _child(args)
        return 0
    if args.interleaved:
        return _run_interleaved(args)
    cases = args.cases.split(",") if args.cases else list(QUICK_CASES if args.quick else CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"--cases: unknown {unknown}; choose from {list(CASES)}")
    args.timeout = args.timeout or (900 if args.quick else 3600)
    spinners_n = max(1, _usable_cores() - 1)
    run = {
        "benchmark": "bench_busy",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "quick": args.quick,
        "repeats": args.repeats,
        "machine": _machine(),
        "busy_spinners": spinners_n,
        "load_average_start": list(os.getloadavg()),
        "rows": [],
    }
    for cond in CONDITIONS:
        spinners = []
        if cond == "busy":
            spinners = [mp.Process(target=_spin, daemon=True) for _ in range(spinners_n)]
            for s in spinners:
                s.start()
            time.sleep(1.0)
        try:
            for threads in THREADS:
                run["rows"] += _run_child(cond, threads, cases, args)
        finally:
            for s in spinners:
                s.terminate()
                s.join()
    run["load_average_end"] = list(os.getloadavg())
    lines = _table(run["rows"])
    run["table"] = {
        "columns": [
            "case",
            "condition",
            "ours_1_thread_s",
            "ours_default_s",
            "baseline_1_thread_s",
            "baseline_default_s",
            "speedup_vs_baseline_1_thread",
            "speedup_vs_baseline_default",
            "ours_1_thread_over_default",
            "load_min",
            "load_max",
        ],
        "rows": lines,
    }
    _print_table(lines)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    data = {"benchmark": "bench_busy", "runs": []}
    if os.path.exists(args.output):
        with open(args.output, encoding="utf-8") as fh:
            data = json.load(fh)
    data["runs"].append(run)
    tmp = args.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
