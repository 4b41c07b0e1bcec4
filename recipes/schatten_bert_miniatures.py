"""Spectrum-adaptive Schatten vs Edelman bound proxies on the 24 Google BERT miniatures.

Models: ``google/bert_uncased_L-{2,4,6,8,10,12}_H-{128,256,512,768}_A-{H/64}`` by Hub id, or
local copies from ``--local-dir`` (a folder holding ``bert_uncased_L-.._H-.._A-..`` folders, or
``google/bert_uncased_...``). Writes into ``--output-dir``:

* ``miniatures.csv`` / ``miniatures.json``: one row per model (B_Schatten, B_Edelman, each normalised per
  curve as the paper plots them — ``*_norm_width``: divided by the same depth's model at N = 128,
  ``*_norm_depth``: by the same width's model at L = 2, or the curve's smallest model when that one is
  missing —, mean optimal p per matrix type, seconds); the JSON also holds every model's report
  without per-matrix spectra, ``reports/<name>.json`` the full report.
* ``proxies_vs_width.png``, ``proxies_vs_depth.png``: both proxies normalised per curve, log scale.
* ``norm_scaling.png``: (2,1), (1,1) and spectral norms of every matrix vs N at L = 2 (the smallest
  depth analysed when L = 2 is not).
* ``spectral_decay.png``, ``optimal_p.png``, ``optimal_p_histogram.png``, ``contribution_vs_p.png`` for
  ``--detail-model`` (default: the largest model analysed).

A folder already holding any of these is refused before any model is read (exit status 1) unless
``--overwrite-output-dir`` is given, which replaces them (the earlier ``reports/`` folder included).

    python recipes/schatten_bert_miniatures.py --output-dir runs/schatten_miniatures
    python recipes/schatten_bert_miniatures.py --output-dir runs/m --local-dir ~/bert-miniatures --layers 2 4 --hidden 128 256
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from hf_tdiag._cli_args import ArgumentParser, add_output_dir, finite_float, plain, positive_int
from hf_tdiag._defaults import DEFAULT_L_PHI
from hf_tdiag.viz.schatten import PAPER_NORMALIZE_AT

# what a run writes into --output-dir besides reports/<name>.json
OUTPUTS = (
    "miniatures.csv",
    "miniatures.json",
    "proxies_vs_width.png",
    "proxies_vs_depth.png",
    "norm_scaling.png",
    "spectral_decay.png",
    "optimal_p.png",
    "optimal_p_histogram.png",
    "contribution_vs_p.png",
)
LAYERS = (2, 4, 6, 8, 10, 12)
HIDDEN = (128, 256, 512, 768)


def miniature_name(num_layers: int, hidden: int) -> str:
    return f"bert_uncased_L-{num_layers}_H-{hidden}_A-{hidden // 64}"


def miniature_source(name: str, local_dir: str | None) -> str | None:
    """Local folder for ``name`` under ``local_dir`` (None when absent), or the Hub id without ``local_dir``."""
    if local_dir is None:
        return f"google/{name}"
    for cand in (os.path.join(local_dir, name), os.path.join(local_dir, "google", name)):
        if os.path.isfile(os.path.join(cand, "config.json")):
            return cand
    return None


def add_normalized_columns(rows: list[dict]) -> None:
    """``{schatten_bound,edelman_bound}_norm_width`` / ``_norm_depth``: each row's proxy over its curve's value at N = 128 / L = 2."""
    from hf_tdiag.viz.schatten import scaling_curves

    for x_key, suffix in (("hidden_size", "width"), ("num_layers", "depth")):
        group_key = "num_layers" if x_key == "hidden_size" else "hidden_size"
        for (g, key), c in scaling_curves(rows, x_key).items():
            for r in rows:
                if r[group_key] == g:
                    r[f"{key}_norm_{suffix}"] = float(c["y"][c["x"].index(r[x_key])])


def parse_args(argv=None) -> argparse.Namespace:
    ap = ArgumentParser(description=plain(__doc__))
    add_output_dir(ap, None, "where the tables, reports and figures go", required=True)
    ap.add_argument("--local-dir", default=None, help="folder with local copies (skips models not found there)")
    ap.add_argument("--layers", type=positive_int, nargs="+", default=list(LAYERS), help="depths L (default: all six)")
    ap.add_argument("--hidden", type=positive_int, nargs="+", default=list(HIDDEN), help="widths H (default: all four)")
    ap.add_argument(
        "--l-phi",
        "--L-phi",
        type=finite_float,
        default=DEFAULT_L_PHI,
        help=f"FFN activation Lipschitz constant L_phi (default {DEFAULT_L_PHI}, GELU)",
    )
    ap.add_argument(
        "--p-grid-m", type=positive_int, default=None, help="p grid {0, 1/m, ..., 2}; default m = ceil(L + ln N)"
    )
    ap.add_argument("--rank-tol", type=finite_float, default=1e-10, help="rank threshold factor (default 1e-10)")
    ap.add_argument("--detail-model", default=None, help="miniature name for the per-matrix figures (default: largest)")
    args = ap.parse_args(argv)
    for h in args.hidden:
        if h % 64:
            ap.error(f"--hidden: miniature widths are multiples of 64 (heads of width 64), got {h}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import hf_tdiag
    from hf_tdiag._atomic import write_csv, write_json
    from hf_tdiag._outputs import OutputExistsError, claim_output_dir
    from hf_tdiag.viz import save_figure
    from hf_tdiag.viz.schatten import (
        plot_norm_scaling,
        plot_proxies_vs_depth,
        plot_proxies_vs_width,
        save_report_figures,
    )

    jobs, missing = [], []
    for num_layers in args.layers:
        for hidden in args.hidden:
            name = miniature_name(num_layers, hidden)
            where = miniature_source(name, args.local_dir)
            (jobs if where else missing).append((name, where))
    if not jobs:
        raise SystemExit(f"no miniature found under --local-dir {args.local_dir!r}")
    writes = [*OUTPUTS, *(os.path.join("reports", f"{name}.json") for name, _ in jobs)]
    try:  # before any model is read: never an earlier run's tables without --overwrite-output-dir
        claim_output_dir(
            args.output_dir,
            writes,
            overwrite=args.overwrite_output_dir,
            inputs=[args.local_dir, *(where for _, where in jobs if os.path.isdir(where))],
            stale=["reports"],
        )
    except OutputExistsError as err:  # one line, nothing written or removed
        print(f"schatten_bert_miniatures: {err}", file=sys.stderr)
        return 1
    os.makedirs(os.path.join(args.output_dir, "reports"), exist_ok=True)
    if missing:
        print(f"not found under {args.local_dir}: {', '.join(n for n, _ in missing)}", file=sys.stderr)

    rows, reports = [], {}
    for i, (name, where) in enumerate(jobs, 1):
        t0 = time.perf_counter()
        rep = hf_tdiag.schatten_bounds(where, L_phi=args.l_phi, p_grid_m=args.p_grid_m, rank_tol=args.rank_tol)
        seconds = time.perf_counter() - t0
        rep.to_json(os.path.join(args.output_dir, "reports", f"{name}.json"))
        reports[name] = rep
        rows.append({"name": name, **rep.summary(), "seconds": seconds})
        print(
            f"[{i}/{len(jobs)}] {name}: B_Schatten {rep.schatten_bound:.6g}  B_Edelman {rep.edelman_bound:.6g}  ({seconds:.1f}s)",
            flush=True,
        )

    add_normalized_columns(rows)
    write_csv(os.path.join(args.output_dir, "miniatures.csv"), rows)
    write_json(
        os.path.join(args.output_dir, "miniatures.json"),
        {
            "normalized_at": PAPER_NORMALIZE_AT,
            "rows": rows,
            "reports": {n: r.to_dict(include_spectra=False) for n, r in reports.items()},
        },
        indent=1,
    )

    save_figure(plot_proxies_vs_width(rows), os.path.join(args.output_dir, "proxies_vs_width.png"))
    save_figure(plot_proxies_vs_depth(rows), os.path.join(args.output_dir, "proxies_vs_depth.png"))
    norm_L = 2 if any(r.num_layers == 2 for r in reports.values()) else min(r.num_layers for r in reports.values())
    save_figure(plot_norm_scaling(list(reports.values()), norm_L), os.path.join(args.output_dir, "norm_scaling.png"))
    detail = args.detail_model or max(rows, key=lambda r: (r["hidden_size"], r["num_layers"]))["name"]
    if detail not in reports:
        raise SystemExit(f"--detail-model {detail!r} was not analysed; analysed: {sorted(reports)}")
    save_report_figures(reports[detail], args.output_dir)
    print(f"wrote {args.output_dir}/miniatures.csv, miniatures.json and figures (detail: {detail})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
