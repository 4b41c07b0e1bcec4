#!/usr/bin/env python
"""Frobenius Att-SVM: hf-tdiag's dual solver vs cvxpy's default solver, side by side in one process.

1. ``n=32, T=50, d=64`` random unit tokens/queries: ``att_svm`` vs ``cvxpy`` (``problem.solve()`` with no
   solver named, on the natural formulation ``min ‖W‖_F s.t. (x_α − x_t)ᵀ W z_i ≥ 1``); objectives must
   agree to 1e-6 relative; prints the speed ratio.
2. ``n=64, T=100, d=128``: ours only unless ``--cvxpy-large`` (cvxpy did not finish in 5 minutes there).
3. A ViT-B/16-sized head (d = 768, 197 tokens, random init — no Hub access here): the full
   ``attention_svm_diagnostic`` (forward pass + SVM on 64 sampled queries), for 64 queries spread over
   8 images and for 64 queries of one image; and the bare solver on 64 images × 1 query × 197 tokens.

Appends one run (with machine info and the load average, which matters on a shared machine) to
``benchmarks/results/bench_attention_svm_cpu.json``.

    python benchmarks/bench_attention_svm.py [--skip-cvxpy] [--threads N] [--output PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch


def machine_info() -> dict:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "node": platform.node(),
    }
    try:
        info["load_average_1_5_15"] = list(os.getloadavg())
    except OSError:
        pass
    try:
        import cvxpy

        info["cvxpy"] = cvxpy.__version__
    except ImportError:
        pass
    return info


def random_instance(n, T, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d))
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    z = rng.standard_normal((n, d))
    z /= np.linalg.norm(z, axis=-1, keepdims=True)
    sel = rng.integers(0, T, n)
    return X, z, sel


def cvxpy_fro(X, z, sel):
    import cvxpy as cp

    n, T, d = X.shape
    W = cp.Variable((d, d))
    cons = []
    for i in range(n):
        D = np.delete(X[i, sel[i]] - X[i], sel[i], axis=0)
        cons.append(D @ W @ z[i] >= 1)
    prob = cp.Problem(cp.Minimize(cp.norm(W, "fro")), cons)
    t0, c0 = time.perf_counter(), time.process_time()
    prob.solve()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    Wv = np.asarray(W.value)
    margins = np.concatenate([np.delete(X[i, sel[i]] - X[i], sel[i], axis=0) @ Wv @ z[i] for i in range(n)])
    return {"time_s": elapsed, "cpu_time_s": cpu, "objective": float(prob.value), "status": prob.status,
            "solver": prob.solver_stats.solver_name, "min_margin": float(margins.min())}


def ours_fro(X, z, sel, repeats=3):
    from hf_tdiag.measures.attention_svm import att_svm

    Xt, zt, st = torch.from_numpy(X), torch.from_numpy(z), torch.from_numpy(sel)
    times, cpus, res = [], [], None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        res = att_svm(Xt, zt, st)
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    margins = res.margins[res.constraint == 1]
    return {"time_s": statistics.median(times), "times_s": times, "cpu_time_s": statistics.median(cpus), "objective": res.objective, "status": res.status,
            "duality_gap": res.duality_gap, "min_margin": float(margins.min()), "num_active": res.num_active,
            "num_constraints": res.num_constraints, "iterations": res.iterations, "solver": res.solver}


def vit_head(n_images=8, max_queries=64, one_image=False, layer=6, head=0):
    from transformers import ViTConfig, ViTModel

    from hf_tdiag.probes.attention_svm import attention_svm_diagnostic

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=layer + 1,
                    num_attention_heads=12, intermediate_size=3072)
    model = ViTModel(cfg).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.avg_pool2d(torch.randn(1 if one_image else n_images, 3, 224, 224, generator=g), 9, 1, 4) * 3
    t0, c0 = time.perf_counter(), time.process_time()
    diag = attention_svm_diagnostic(model, x, layer, head, max_queries=max_queries)
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = diag.summary()
    return {"time_s": total, "cpu_time_s": cpu, "svm_time_s": s["svm"]["solve_time_s"], "num_queries": s["num_queries"],
            "tokens": 197, "d": 768, "images": 1 if one_image else n_images, "num_constraints": s["svm"]["num_constraints"],
            "num_active": s["svm"]["num_active"], "duality_gap": s["svm"]["duality_gap"], "solver": s["svm"]["solver"],
            "correlation": s["correlation"], "status": s["svm"]["status"]}


def vit_cls_queries(n_images=64, layer=6, head=0):
    """Bare solver: 64 images, one query each (the CLS token), 197 tokens, d = 768."""
    from transformers import ViTConfig, ViTModel

    from hf_tdiag.measures.attention_svm import att_svm, attention_probs

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=layer + 1,
                    num_attention_heads=12, intermediate_size=3072)
    model = ViTModel(cfg).eval()
    cap = {}
    blk = model.layers[layer].attention
    hook = blk.q_proj.register_forward_pre_hook(lambda m, a: cap.__setitem__("x", a[0].detach()))
    g = torch.Generator().manual_seed(1)
    x = torch.nn.functional.avg_pool2d(torch.randn(n_images, 3, 224, 224, generator=g), 9, 1, 4) * 3
    with torch.no_grad():
        model(pixel_values=x)
    hook.remove()
    X = cap["x"].double()
    p = 64
    q = X[:, 0] @ blk.q_proj.weight[head * p:(head + 1) * p].double().T
    k = X @ blk.k_proj.weight[head * p:(head + 1) * p].double().T
    sel = attention_probs(q[:, None], k)[:, 0].argmax(-1)
    t0, c0 = time.perf_counter(), time.process_time()
    res = att_svm(X, X[:, 0], sel)
    return {"time_s": time.perf_counter() - t0, "cpu_time_s": time.process_time() - c0, "queries": n_images, "tokens": 197, "d": 768,
            "num_constraints": res.num_constraints, "num_active": res.num_active, "duality_gap": res.duality_gap,
            "status": res.status, "solver": res.solver}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--skip-cvxpy", action="store_true", help="time only hf-tdiag (no cvxpy baseline)")
    p.add_argument("--cvxpy-large", action="store_true", help="also run cvxpy at n=64, T=100, d=128 (very slow)")
    p.add_argument("--skip-vit", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--output", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "bench_attention_svm_cpu.json"))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    run = {"machine": machine_info(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "cases": []}

    for (n, T, d), with_cvx in (((32, 50, 64), not args.skip_cvxpy), ((64, 100, 128), args.cvxpy_large and not args.skip_cvxpy)):
        X, z, sel = random_instance(n, T, d)
        ours = ours_fro(X, z, sel)
        case = {"case": f"frobenius n={n} T={T} d={d}", "ours": ours}
        print(f"[n={n} T={T} d={d}] hf-tdiag: {ours['time_s']:.3f} s (cpu {ours['cpu_time_s']:.3f} s), objective {ours['objective']:.10g}, "
              f"gap {ours['duality_gap']:.1e}, min margin {ours['min_margin']:.12f}")
        if with_cvx:
            base = cvxpy_fro(X, z, sel)
            rel = abs(base["objective"] - ours["objective"]) / base["objective"]
            case.update(baseline=base, speedup=base["time_s"] / ours["time_s"],
                        speedup_cpu_time=base["cpu_time_s"] / ours["cpu_time_s"], objective_rel_diff=rel)
            print(f"[n={n} T={T} d={d}] cvxpy ({base['solver']}): {base['time_s']:.2f} s (cpu {base['cpu_time_s']:.2f} s), objective {base['objective']:.10g}, "
                  f"min margin {base['min_margin']:.12f}")
            print(f"[n={n} T={T} d={d}] speedup {case['speedup']:.0f}x wall, {case['speedup_cpu_time']:.0f}x cpu time, relative objective difference {rel:.1e}")
        run["cases"].append(case)

    if not args.skip_vit:
        for label, kwargs in (("vit-b head, 64 queries over 8 images (diagnostic end to end)", {}),
                              ("vit-b head, 64 queries of one image (diagnostic end to end)", {"one_image": True})):
            r = vit_head(**kwargs)
            run["cases"].append({"case": label, "ours": r})
            print(f"[{label}] {r['time_s']:.2f} s total (cpu {r['cpu_time_s']:.2f} s), SVM {r['svm_time_s']:.2f} s, {r['num_constraints']} constraints, "
                  f"gap {r['duality_gap']:.1e}")
        r = vit_cls_queries()
        run["cases"].append({"case": "vit-b head, 64 images x CLS query x 197 tokens (solver only)", "ours": r})
        print(f"[64 images x CLS] SVM {r['time_s']:.2f} s (cpu {r['cpu_time_s']:.2f} s), {r['num_constraints']} constraints, gap {r['duality_gap']:.1e}")
    run["machine"]["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None

    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    data = {"benchmark": "attention_svm", "runs": []}
    if os.path.exists(args.output):
        with open(args.output, encoding="utf-8") as fh:
            data = json.load(fh)
    data["runs"].append(run)
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
