"""Full Schatten / Edelman analysis of a BERT-base-shaped model: hf_tdiag vs the dense per-matrix SVD reference.

The reference (``tests/test_schatten_reference.py::dense_reference``) forms all 288 per-head
768×768 products and 24 FFN matrices explicitly and takes one float64 numpy SVD
(values only) of each. Ours uses the d_h×d_h QR core for the per-head products and a
conditioning-guarded Gram eigensolve (else SVD) for the FFN matrices.

    .venv/bin/python benchmarks/bench_schatten.py [--layers 12 --hidden 768 --heads 12 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time


def _threads_from_argv() -> None:
    """--threads N must take effect before numpy/torch start their BLAS thread pools."""
    if "--threads" in sys.argv:
        n = sys.argv[sys.argv.index("--threads") + 1]
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = n


_threads_from_argv()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import BertConfig, BertModel  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import hf_tdiag  # noqa: E402
from test_schatten_reference import dense_reference  # noqa: E402


def dense_torch_spectra(model, num_layers: int, num_heads: int) -> float:
    """Seconds to form every explicit matrix in float64 and take torch.linalg.svdvals of each."""
    t0 = time.perf_counter()
    for layer in model.encoder.layer[:num_layers]:
        q = layer.attention.self.query.weight.double()
        k = layer.attention.self.key.weight.double()
        v = layer.attention.self.value.weight.double()
        o = layer.attention.output.dense.weight.double()
        dh = q.shape[0] // num_heads
        for h in range(num_heads):
            rows = slice(h * dh, (h + 1) * dh)
            torch.linalg.svdvals(q[rows].T @ k[rows])
            torch.linalg.svdvals(v[rows].T @ o.T[rows])
        torch.linalg.svdvals(layer.intermediate.dense.weight.double().T)
        torch.linalg.svdvals(layer.output.dense.weight.double().T)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--uv-reference", action="store_true", help="also time the dense reference with full SVDs (U, S, Vᵀ)")
    ap.add_argument("--threads", type=int, default=None, help="BLAS/torch threads for both sides (default: library default)")
    ap.add_argument("--output", default=os.path.join(HERE, "results", "bench_schatten_cpu.json"))
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=512,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=64,
    )
    model = BertModel(cfg).eval()

    timings = {}
    reports = {}
    for method in ("auto", "svd"):
        hf_tdiag.spectrum_bounds(model, svd_method=method)  # warm-up
        ts = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            reports[method] = hf_tdiag.spectrum_bounds(model, svd_method=method)
            ts.append(time.perf_counter() - t0)
        timings[method] = ts

    t0 = time.perf_counter()
    ref = dense_reference(model.state_dict(), args.layers, args.heads)
    t_ref = time.perf_counter() - t0

    # numpy's default full SVD (U, S, Vᵀ) per matrix, as a plain reference would call it
    t_uv = None
    if args.uv_reference:
        t0 = time.perf_counter()
        ref_uv = dense_reference(model.state_dict(), args.layers, args.heads, compute_uv=True)
        t_uv = time.perf_counter() - t0
        assert abs(ref_uv["ours"] - ref["ours"]) <= 1e-9 * abs(ref["ours"])

    # a second dense baseline: the same explicit matrices, one torch (MKL) float64 svdvals each
    t_torch = dense_torch_spectra(model, args.layers, args.heads)

    ours = reports["auto"]
    rel = {
        "ours": abs(ours.ours - ref["ours"]) / abs(ref["ours"]),
        "edelman": abs(ours.edelman - ref["edelman"]) / abs(ref["edelman"]),
        "max_per_matrix_min_contribution": float(
            np.max(np.abs(np.array([m.min_contribution for m in ours.matrices]) - ref["mins"]) / np.abs(ref["mins"]))
        ),
        "ours_svd_method": abs(reports["svd"].ours - ref["ours"]) / abs(ref["ours"]),
        "edelman_svd_method": abs(reports["svd"].edelman - ref["edelman"]) / abs(ref["edelman"]),
    }
    best = {k: min(v) for k, v in timings.items()}
    result = {
        "benchmark": "schatten_bound_full_analysis",
        "model_shape": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "intermediate": 4 * args.hidden},
        "num_matrices": len(ours.matrices),
        "ours_auto_s": best["auto"],
        "ours_svd_s": best["svd"],
        "ours_auto_all_s": timings["auto"],
        "ours_svd_all_s": timings["svd"],
        "dense_reference_s": t_ref,
        "dense_torch_svdvals_s": t_torch,
        "dense_reference_full_svd_s": t_uv,
        "speedup_auto_vs_full_svd_reference": None if t_uv is None else t_uv / best["auto"],
        "speedup_auto": t_ref / best["auto"],
        "speedup_svd": t_ref / best["svd"],
        "speedup_auto_vs_torch_dense": t_torch / best["auto"],
        "relative_error": rel,
        "values": {"ours": ours.ours, "edelman": ours.edelman, "ref_ours": ref["ours"], "ref_edelman": ref["edelman"]},
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "numpy": np.__version__,
            "threads_arg": args.threads,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
    }
    print(
        f"full analysis L={args.layers} N={args.hidden} H={args.heads}: ours(auto) {best['auto']:.2f}s, "
        f"ours(svd) {best['svd']:.2f}s, dense reference {t_ref:.2f}s -> speedup {result['speedup_auto']:.1f}x "
        f"(svd-only {result['speedup_svd']:.1f}x); torch dense svdvals {t_torch:.2f}s "
        f"({result['speedup_auto_vs_torch_dense']:.1f}x); "
        + (f"full-SVD reference {t_uv:.2f}s ({t_uv / best['auto']:.1f}x); " if t_uv is not None else "")
        + f"rel. error ours {rel['ours']:.1e}, edelman {rel['edelman']:.1e}, "
        f"per-matrix max {rel['max_per_matrix_min_contribution']:.1e}"
    )
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
