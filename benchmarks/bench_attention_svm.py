#!/usr/bin/env python
"""Frobenius Att-SVM: hf-tdiag's dual solver against libsvm (and, optionally, cvxpy), side by side in one process.

The Frobenius Att-SVM is a hard-margin SVM without bias whose training points are the features
``a_k = (x_{iα_i} − x_{it}) z_iᵀ`` (all labelled +1); its kernel is
``K[(i,t),(j,s)] = ((x_{iα}−x_{it})·(x_{jα}−x_{js}))·(z_i·z_j)``. libsvm solves it through
``sklearn.svm.SVC(kernel="precomputed")`` on the **symmetrized** set ``{(a_k, +1)} ∪ {(−a_k, −1)}`` (whose
max-margin separator has zero bias by symmetry) with a large ``C`` (hard margin) and a tolerance tight
enough that its objective equals ours to 1e-8. Both objectives are the primal ``‖W‖_F`` of a feasible
``W`` scaled to smallest margin exactly 1 (for libsvm ``W = Σ_j coef_j φ_j``, its margins read off the
kernel), so each is an upper bound of the optimum and their difference bounds both errors.

Cases (random unit tokens and queries, random selections): ``n=32, T=50, d=64`` and ``n=64, T=197,
d=768`` (ViT-B/16 sized). libsvm is timed twice: the fit alone, and the fit plus building the
``2m × 2m`` kernel it needs (``m = n(T−1)``; 5 GB at the large case). ``--cvxpy`` adds cvxpy's default
solver at the small case (about 13 minutes); ``--vit`` adds the end-to-end diagnostic of a randomly
initialised ViT-B/16 head. One run (machine info and load average included) is appended to
``benchmarks/results/bench_attention_svm_cpu.json``.

    python benchmarks/bench_attention_svm.py [--threads 1] [--cvxpy] [--vit] [--skip-large]
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

CASES = ((32, 50, 64), (64, 197, 768))
LIBSVM_C = 1e10
LIBSVM_TOL = 1e-11  # tight enough for 1e-8 agreement of the objectives (default 1e-3 is ~1e-4 off)


def machine_info() -> dict:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }
    for name in ("sklearn", "cvxpy"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            pass
    if hasattr(os, "getloadavg"):
        info["load_average_1_5_15"] = list(os.getloadavg())
    return info


def random_instance(n, T, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d))
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    z = rng.standard_normal((n, d))
    z /= np.linalg.norm(z, axis=-1, keepdims=True)
    return X, z, rng.integers(0, T, n)


def _timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def ours_fro(X, z, sel, repeats=3) -> dict:
    from hf_tdiag.diagnostics.entry import thread_policy
    from hf_tdiag.measures.attention_svm import att_svm

    Xt, zt, st = torch.from_numpy(X), torch.from_numpy(z), torch.from_numpy(sel)
    with thread_policy("attention_svm"):  # as the diagnostic runs the solver: one thread
        runs = [_timed(lambda: att_svm(Xt, zt, st)) for _ in range(repeats)]
    res = runs[-1][0]
    return {
        "time_s": statistics.median(r[1] for r in runs),
        "times_s": [r[1] for r in runs],
        "cpu_time_s": statistics.median(r[2] for r in runs),
        "objective": res.objective,
        "status": res.status,
        "duality_gap": res.duality_gap,
        "min_margin": float(res.margins[res.constraint == 1].min()),
        "num_active": res.num_active,
        "num_constraints": res.num_constraints,
        "solver": res.solver,
    }


def symmetrized_kernel(X, z, sel) -> np.ndarray:
    """The ``2m × 2m`` kernel of ``{a_k} ∪ {−a_k}``: ``[[K, −K], [−K, K]]`` with ``K = (ΔΔᵀ) ∘ (z zᵀ)`` per constraint."""
    n, T, _ = X.shape
    D = np.concatenate([np.delete(X[i, sel[i]] - X[i], sel[i], axis=0) for i in range(n)])  # (m, d)
    q = np.repeat(np.arange(n), T - 1)
    m = D.shape[0]
    Ks = np.empty((2 * m, 2 * m))
    K = Ks[:m, :m]
    np.matmul(D, D.T, out=K)
    C = z @ z.T
    for i in range(n):  # multiply row block i by z_i·z_j without forming an m×m temporary
        rows = slice(i * (T - 1), (i + 1) * (T - 1))
        K[rows] *= C[i, q][None, :]
    Ks[m:, m:] = K
    np.negative(K, out=Ks[:m, m:])
    Ks[m:, :m] = Ks[:m, m:]
    return Ks


def libsvm_fro(X, z, sel, tol=LIBSVM_TOL) -> dict:
    from sklearn.svm import SVC

    Ks, t_kernel, c_kernel = _timed(lambda: symmetrized_kernel(X, z, sel))
    m = Ks.shape[0] // 2
    y = np.concatenate([np.ones(m), -np.ones(m)])
    svc, t_fit, c_fit = _timed(lambda: SVC(kernel="precomputed", C=LIBSVM_C, tol=tol, cache_size=1000).fit(Ks, y))
    c = np.zeros(2 * m)
    c[svc.support_] = svc.dual_coef_[0]
    g = Ks @ c  # ⟨w, φ_j⟩ for every point; the first m are the margins of the original constraints
    norm = float(np.sqrt(c @ g))
    margins = g[:m]
    sv = svc.support_
    out = {
        "fit_time_s": t_fit,
        "fit_cpu_time_s": c_fit,
        "kernel_time_s": t_kernel,
        "kernel_cpu_time_s": c_kernel,
        "time_s": t_fit + t_kernel,
        "cpu_time_s": c_fit + c_kernel,
        "objective": norm / float(margins.min()),
        "intercept": float(svc.intercept_[0]),
        "num_support": int(sv.size),
        "iterations": int(svc.n_iter_[0]),
        "C": LIBSVM_C,
        "tol": tol,
        "kernel_gb": Ks.nbytes / 1e9,
    }
    return out


def cvxpy_fro(X, z, sel) -> dict:
    import cvxpy as cp

    n, T, d = X.shape
    W = cp.Variable((d, d))
    cons = [np.delete(X[i, sel[i]] - X[i], sel[i], axis=0) @ W @ z[i] >= 1 for i in range(n)]
    prob = cp.Problem(cp.Minimize(cp.norm(W, "fro")), cons)
    _, t, c = _timed(prob.solve)
    return {
        "time_s": t,
        "cpu_time_s": c,
        "objective": float(prob.value),
        "status": prob.status,
        "solver": prob.solver_stats.solver_name,
    }


def vit_head(n_images=8, max_queries=64, one_image=False, layer=6, head=0):
    from transformers import ViTConfig, ViTModel

    from hf_tdiag.diagnostics.attention_svm import attention_svm_diagnostic

    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=224,
        patch_size=16,
        hidden_size=768,
        num_hidden_layers=layer + 1,
        num_attention_heads=12,
        intermediate_size=3072,
    )
    model = ViTModel(cfg).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.avg_pool2d(torch.randn(1 if one_image else n_images, 3, 224, 224, generator=g), 9, 1, 4) * 3
    t0, c0 = time.perf_counter(), time.process_time()
    diag = attention_svm_diagnostic(
        model, x, layer + 1, head, max_queries=max_queries
    )  # block number layer + 1: the last
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = diag.summary()
    return {
        "time_s": total,
        "cpu_time_s": cpu,
        "svm_time_s": s["svm"]["solve_time_s"],
        "num_queries": s["num_queries"],
        "tokens": 197,
        "d": 768,
        "images": 1 if one_image else n_images,
        "num_constraints": s["svm"]["num_constraints"],
        "num_active": s["svm"]["num_active"],
        "duality_gap": s["svm"]["duality_gap"],
        "solver": s["svm"]["solver"],
        "correlation": s["correlation"],
        "status": s["svm"]["status"],
    }


def vit_cls_queries(n_images=64, layer=6, head=0):
    """Bare solver: 64 images, one query each (the CLS token), 197 tokens, d = 768."""
    from transformers import ViTConfig, ViTModel

    from hf_tdiag.measures.attention_svm import att_svm, attention_probs

    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=224,
        patch_size=16,
        hidden_size=768,
        num_hidden_layers=layer + 1,
        num_attention_heads=12,
        intermediate_size=3072,
    )
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
    q = X[:, 0] @ blk.q_proj.weight[head * p : (head + 1) * p].double().T
    k = X @ blk.k_proj.weight[head * p : (head + 1) * p].double().T
    sel = attention_probs(q[:, None], k)[:, 0].argmax(-1)
    t0, c0 = time.perf_counter(), time.process_time()
    res = att_svm(X, X[:, 0], sel)
    return {
        "time_s": time.perf_counter() - t0,
        "cpu_time_s": time.process_time() - c0,
        "queries": n_images,
        "tokens": 197,
        "d": 768,
        "num_constraints": res.num_constraints,
        "num_active": res.num_active,
        "duality_gap": res.duality_gap,
        "status": res.status,
        "solver": res.solver,
    }


def run_case(n, T, d, args) -> dict:
    X, z, sel = random_instance(n, T, d)
    label = f"n={n} T={T} d={d}"
    ours = ours_fro(X, z, sel, repeats=3 if n * T * d < 1e6 else 1)
    case = {"case": f"frobenius {label}", "ours": ours}
    print(
        f"[{label}] hf-tdiag: {ours['time_s']:.3f} s (cpu {ours['cpu_time_s']:.3f} s), objective {ours['objective']:.12g}, "
        f"gap {ours['duality_gap']:.1e}, {ours['num_constraints']} constraints, {ours['num_active']} active"
    )
    base = libsvm_fro(X, z, sel)
    rel = abs(base["objective"] - ours["objective"]) / ours["objective"]
    case.update(
        libsvm=base,
        objective_rel_diff=rel,
        speedup=base["time_s"] / ours["time_s"],
        speedup_fit_only=base["fit_time_s"] / ours["time_s"],
        speedup_cpu_time=base["cpu_time_s"] / ours["cpu_time_s"],
    )
    print(
        f"[{label}] libsvm: fit {base['fit_time_s']:.3f} s + kernel {base['kernel_time_s']:.3f} s ({base['kernel_gb']:.2f} GB), "
        f"objective {base['objective']:.12g}, {base['num_support']} support points, intercept {base['intercept']:.1e}"
    )
    print(
        f"[{label}] speedup vs libsvm: {case['speedup']:.1f}x (kernel + fit), {case['speedup_fit_only']:.1f}x (fit only); "
        f"objectives differ by {rel:.1e} relative"
    )
    if args.cvxpy and n * T * d < 1e6:
        cvx = cvxpy_fro(X, z, sel)
        case.update(
            cvxpy=cvx,
            speedup_cvxpy=cvx["time_s"] / ours["time_s"],
            objective_rel_diff_cvxpy=abs(cvx["objective"] - ours["objective"]) / ours["objective"],
        )
        print(f"[{label}] cvxpy ({cvx['solver']}): {cvx['time_s']:.1f} s; speedup {case['speedup_cvxpy']:.0f}x")
    return case


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch and BLAS threads for both solvers (default 1)")
    p.add_argument("--skip-large", "--skip_large", action="store_true", help="only the n=32, T=50, d=64 case")
    p.add_argument("--cvxpy", action="store_true", help="also time cvxpy's default solver at the small case (~13 min)")
    p.add_argument("--vit", action="store_true", help="also time the end-to-end diagnostic on a ViT-B/16-sized head")
    p.add_argument(
        "--output",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "bench_attention_svm_cpu.json"),
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)
    except ImportError:
        pass
    run = {"machine": machine_info(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "cases": []}
    for n, T, d in CASES[:1] if args.skip_large else CASES:
        run["cases"].append(run_case(n, T, d, args))
    if args.vit:
        for label, kwargs in (
            ("vit-b head, 64 queries over 8 images (diagnostic end to end)", {}),
            ("vit-b head, 64 queries of one image (diagnostic end to end)", {"one_image": True}),
        ):
            r = vit_head(**kwargs)
            run["cases"].append({"case": label, "ours": r})
            print(
                f"[{label}] {r['time_s']:.2f} s total, SVM {r['svm_time_s']:.2f} s, {r['num_constraints']} constraints"
            )
        r = vit_cls_queries()
        run["cases"].append({"case": "vit-b head, 64 images x CLS query x 197 tokens (solver only)", "ours": r})
        print(
            f"[64 images x CLS] SVM {r['time_s']:.2f} s, {r['num_constraints']} constraints, gap {r['duality_gap']:.1e}"
        )
    if hasattr(os, "getloadavg"):
        run["machine"]["load_average_end"] = list(os.getloadavg())
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
