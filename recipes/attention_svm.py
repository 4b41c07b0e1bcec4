#!/usr/bin/env python
"""Transformers as SVMs (Tarzanagh et al. 2023): the 1-layer experiments, at CPU size by default.

Four experiments on the paper's synthetic setting (unit tokens, unit head v and queries, labels ±1,
optimal token argmax_t Y_i vᵀx_it), model f(X) = vᵀXᵀ softmax(XWz) with the logistic loss:

1. ``correlation`` — normalized GD on W and on (K, Q): correlation of W_t (resp. K_tQ_tᵀ) with the
   Frobenius (resp. nuclear) Att-SVM solution per iteration, for several d; it passes 0.99 once
   d ≥ max(T−1, n).
2. ``global`` — share of runs (random data, GD from W = 0) that converge to the optimal tokens
   (global), to another locally-optimal selection (local), or neither, as d grows.
3. ``rank`` — numerical rank of the nuclear-norm W_mm and of the (K, Q) GD solution W = KQᵀ vs n
   (for several widths m): the nuclear SVM is low rank (≤ n), the Frobenius one is not.
4. ``gen_svm`` — a fixed random ReLU MLP head h(Xᵀ softmax(XWz)): GD selects several tokens per input;
   the Gen-SVM prediction W_fin + R·W_dir and its correlation with GD.

Writes ``results.json`` (every number), ``results.md`` (tables) and one PNG per experiment to
``--output_dir``. ``--paper-size`` uses the larger grids / more trials / more steps (slow on CPU).

    python recipes/attention_svm.py --output_dir runs/attention_svm [--paper-size] [--only correlation global]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

EXPERIMENTS = ("correlation", "global", "rank", "gen_svm")

DEFAULTS = {
    "cpu": dict(
        corr_n=5, corr_T=4, corr_d=[4, 8, 16], corr_steps_W=1000, corr_steps_KQ=2000,
        glob_n=5, glob_T=4, glob_d=[2, 3, 4, 5, 6, 8, 12], glob_trials=12, glob_steps=600,
        rank_d=10, rank_T=4, rank_n=[1, 2, 3, 4, 6, 8], rank_m=[2, 5, 10], rank_steps=1500,
        gen_n=6, gen_T=6, gen_d=10, gen_hidden=8, gen_seeds=4, gen_steps=2000,
    ),
    "paper": dict(
        corr_n=6, corr_T=8, corr_d=[4, 8, 16, 32], corr_steps_W=3000, corr_steps_KQ=6000,
        glob_n=6, glob_T=8, glob_d=[2, 4, 6, 8, 10, 12, 16, 20], glob_trials=100, glob_steps=2000,
        rank_d=20, rank_T=5, rank_n=[1, 2, 4, 6, 8, 10, 14], rank_m=[2, 5, 10, 20], rank_steps=4000,
        gen_n=10, gen_T=8, gen_d=16, gen_hidden=16, gen_seeds=10, gen_steps=5000,
    ),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output_dir", default="runs/attention_svm")
    p.add_argument("--paper-size", action="store_true", help="larger grids, more trials and steps (slow)")
    p.add_argument("--only", nargs="+", choices=EXPERIMENTS, default=list(EXPERIMENTS))
    p.add_argument("--lr", type=float, default=0.5, help="normalized-GD step for W (default 0.5)")
    p.add_argument("--lr-kq", type=float, default=0.05, help="normalized-GD step for (K, Q) (default 0.05)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0, help="multiply every step/trial count (e.g. 0.1 for a smoke run)")
    p.add_argument("--threads", type=int, default=None)
    return p.parse_args(argv)


def _scaled(cfg: dict, scale: float) -> dict:
    out = dict(cfg)
    for key in ("corr_steps_W", "corr_steps_KQ", "glob_trials", "glob_steps", "rank_steps", "gen_steps", "gen_seeds"):
        out[key] = max(2, int(round(cfg[key] * scale)))
    return out


def exp_correlation(cfg, args):
    import torch

    from hf_tdiag.measures.attention_gd import make_attention_data, train_attention
    from hf_tdiag.measures.attention_svm import att_svm

    rows, curves = [], {}
    n, T = cfg["corr_n"], cfg["corr_T"]
    for d in cfg["corr_d"]:
        data = make_attention_data(n, T, d, seed=args.seed)
        for param, norm, steps, lr in (("W", "fro", cfg["corr_steps_W"], args.lr), ("KQ", "nuc", cfg["corr_steps_KQ"], args.lr_kq)):
            svm = att_svm(data.X, data.z, data.optimal, norm=norm)
            row = {"d": d, "n": n, "T": T, "param": param, "norm": norm, "feasible": svm.feasible,
                   "overparameterized": d >= max(T - 1, n)}
            if not svm.feasible:
                rows.append(row | {"final_correlation": None})
                continue
            t0 = time.perf_counter()
            run = train_attention(data, param=param, steps=steps, lr=lr, references={"mm": svm.W},
                                  record_every=max(1, steps // 200), seed=args.seed)
            corr = run.correlation["mm"]
            reach = [int(s) for s, c in zip(run.steps.tolist(), corr.tolist()) if c >= 0.99]
            # GD's final direction scaled to be feasible: its norm over the SVM optimum (1 = as good as W_mm)
            margins = torch.einsum("ntd,de,ne->nt", data.X, run.W, data.z)
            gaps = margins[torch.arange(n), data.optimal][:, None] - margins
            gaps[torch.arange(n), data.optimal] = float("inf")
            smin = float(gaps.min())
            ratio = float(torch.linalg.matrix_norm(run.W, ord=norm)) / smin / svm.objective if smin > 0 else None
            row |= {"final_correlation": float(corr[-1]), "max_correlation": float(corr.max()),
                    "first_step_above_0.99": reach[0] if reach else None, "steps": steps, "lr": lr,
                    "svm_objective": svm.objective, "norm_ratio_at_unit_margin": ratio, "time_s": time.perf_counter() - t0}
            rows.append(row)
            curves[f"{param} (vs {norm} SVM), d={d}"] = (run.steps.tolist(), corr.tolist())
            print(f"  correlation: d={d:<3} {param:<2} final corr {corr[-1]:.4f}, ‖W_GD‖/‖W_mm‖ at unit margin {ratio}")
    return rows, curves


def exp_global(cfg, args):
    from hf_tdiag.measures.attention_gd import convergence_verdict, make_attention_data, train_attention

    rows = []
    n, T = cfg["glob_n"], cfg["glob_T"]
    for d in cfg["glob_d"]:
        counts = {"global": 0, "local": 0, "undetermined": 0}
        for trial in range(cfg["glob_trials"]):
            data = make_attention_data(n, T, d, seed=1000 * d + trial + args.seed)
            run = train_attention(data, param="W", steps=cfg["glob_steps"], lr=args.lr, record_every=cfg["glob_steps"])
            counts[convergence_verdict(data, run.W, threshold=0.95).kind] += 1
        k = cfg["glob_trials"]
        row = {"d": d, "n": n, "T": T, "trials": k, **{key: v / k for key, v in counts.items()}}
        rows.append(row)
        print(f"  global: d={d:<3} global {row['global']:.2f} local {row['local']:.2f} undetermined {row['undetermined']:.2f}")
    return rows


def _rank(W, rel: float = 1e-3) -> int:
    import torch

    s = torch.linalg.svdvals(W)
    return int((s > rel * s[0]).sum()) if s[0] > 0 else 0


def exp_rank(cfg, args):
    from hf_tdiag.measures.attention_gd import make_attention_data, train_attention
    from hf_tdiag.measures.attention_svm import att_svm

    rows = []
    d, T = cfg["rank_d"], cfg["rank_T"]
    for n in cfg["rank_n"]:
        data = make_attention_data(n, T, d, seed=args.seed + n)
        nuc = att_svm(data.X, data.z, data.optimal, norm="nuc")
        fro = att_svm(data.X, data.z, data.optimal, norm="fro")
        for m in cfg["rank_m"]:
            run = train_attention(data, param="KQ", m=m, steps=cfg["rank_steps"], lr=args.lr_kq,
                                  references={"nuc": nuc.W}, record_every=cfg["rank_steps"], seed=args.seed)
            row = {"n": n, "m": m, "d": d, "T": T, "rank": _rank(run.W), "rank_nuclear_svm": _rank(nuc.W),
                   "rank_frobenius_svm": _rank(fro.W), "correlation_with_nuclear": float(run.correlation["nuc"][-1])}
            rows.append(row)
        print(f"  rank: n={n:<3} nuclear W_mm rank {rows[-1]['rank_nuclear_svm']}, Frobenius {rows[-1]['rank_frobenius_svm']}, "
              f"KQ-GD ranks {[r['rank'] for r in rows[-len(cfg['rank_m']):]]} for m={cfg['rank_m']}")
    return rows


def exp_gen_svm(cfg, args):
    from hf_tdiag.measures.attention_gd import MLPHead, gen_svm_fit, make_attention_data, train_attention

    rows = []
    n, T, d = cfg["gen_n"], cfg["gen_T"], cfg["gen_d"]
    for seed in range(cfg["gen_seeds"]):
        data = make_attention_data(n, T, d, seed=args.seed + seed)
        head = MLPHead(d, cfg["gen_hidden"], seed=args.seed + seed)
        run = train_attention(data, param="W", steps=cfg["gen_steps"], lr=0.1, head=head, record_every=cfg["gen_steps"])
        try:
            fit = gen_svm_fit(data.X, data.z, run.W)
        except ValueError as err:  # every token selected: nothing to separate
            rows.append({"seed": seed, "error": str(err)})
            continue
        row = {"seed": seed, **fit.summary(), "final_loss": float(run.loss[-1])}
        rows.append(row)
        print(f"  gen_svm: seed={seed} corr {row['correlation']:.4f} mean |O_i| {row['mean_selected']:.2f}")
    return rows


def _md_table(rows, keys) -> str:
    if not rows:
        return "(none)\n"

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "—" if v is None else str(v)

    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from hf_tdiag.viz import save_figure
    from hf_tdiag.viz.attention_svm import plot_correlation_curves, plot_gen_svm, plot_global_frequency, plot_rank

    cfg = _scaled(DEFAULTS["paper" if args.paper_size else "cpu"], args.scale)
    os.makedirs(args.output_dir, exist_ok=True)
    results = {"settings": {"size": "paper" if args.paper_size else "cpu", **cfg, "lr": args.lr, "lr_kq": args.lr_kq,
                            "seed": args.seed}}
    md = ["# Transformers as SVMs: 1-layer experiments\n"]
    t_all = time.perf_counter()
    if "correlation" in args.only:
        print("experiment 1: correlation of GD with W_mm")
        rows, curves = exp_correlation(cfg, args)
        results["correlation"] = rows
        save_figure(plot_correlation_curves(curves), os.path.join(args.output_dir, "correlation.png"))
        md += ["## 1. Correlation of GD with the Att-SVM solution\n",
               _md_table(rows, ["d", "param", "norm", "overparameterized", "feasible", "final_correlation", "first_step_above_0.99",
                                "norm_ratio_at_unit_margin"])]
    if "global" in args.only:
        print("experiment 2: global vs local convergence")
        rows = exp_global(cfg, args)
        results["global"] = rows
        save_figure(plot_global_frequency(rows), os.path.join(args.output_dir, "global_frequency.png"))
        md += ["## 2. Global-convergence frequency vs d\n", _md_table(rows, ["d", "trials", "global", "local", "undetermined"])]
    if "rank" in args.only:
        print("experiment 3: rank of the nuclear-norm solution")
        rows = exp_rank(cfg, args)
        results["rank"] = rows
        save_figure(plot_rank(rows, x="n", series="m", value="rank", title="rank of the (K,Q) GD solution vs n"),
                    os.path.join(args.output_dir, "rank.png"))
        md += ["## 3. Rank vs n and m\n",
               _md_table(rows, ["n", "m", "rank", "rank_nuclear_svm", "rank_frobenius_svm", "correlation_with_nuclear"])]
    if "gen_svm" in args.only:
        print("experiment 4: Gen-SVM with a nonlinear head")
        rows = exp_gen_svm(cfg, args)
        results["gen_svm"] = rows
        ok = [r for r in rows if "correlation" in r]
        if ok:
            save_figure(plot_gen_svm(ok), os.path.join(args.output_dir, "gen_svm.png"))
        md += ["## 4. Gen-SVM with a nonlinear head\n",
               _md_table(rows, ["seed", "correlation", "direction_correlation", "R", "mean_selected", "max_selected"])]
    results["total_time_s"] = time.perf_counter() - t_all
    with open(os.path.join(args.output_dir, "results.json"), "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=2)
        fh.write("\n")
    with open(os.path.join(args.output_dir, "results.md"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(md))
    print(f"done in {results['total_time_s']:.1f} s; wrote results.json, results.md and figures to {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
