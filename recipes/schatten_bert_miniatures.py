"""Spectrum-adaptive Schatten vs Edelman bound proxies on the 24 Google BERT miniatures.

Models: ``google/bert_uncased_L-{2,4,6,8,10,12}_H-{128,256,512,768}_A-{H/64}`` by Hub id, or
local copies from ``--local_dir`` (a folder holding ``bert_uncased_L-.._H-.._A-..`` folders, or
``google/bert_uncased_...``). Writes into ``--output_dir``:

* ``miniatures.csv`` / ``miniatures.json``: one row per model (B_ours, B_Edelman, each normalised per
  curve as the paper plots them — ``*_norm_width``: divided by the same depth's model at N = 128,
  ``*_norm_depth``: by the same width's model at L = 2, or the curve's smallest model when that one is
  missing —, mean optimal p per matrix type, seconds); the JSON also holds every model's report
  without per-matrix spectra, ``reports/<name>.json`` the full report.
* ``proxies_vs_width.png``, ``proxies_vs_depth.png``: both proxies normalised per curve, log scale.
* ``norm_scaling.png``: (2,1), (1,1) and spectral norms of every matrix vs N at L = 2 (the smallest
  depth analysed when L = 2 is not).
* ``spectral_decay.png``, ``optimal_p.png``, ``optimal_p_histogram.png``, ``contribution_vs_p.png`` for
  ``--detail_model`` (default: the largest model analysed).

    python recipes/schatten_bert_miniatures.py --output_dir runs/schatten_miniatures
    python recipes/schatten_bert_miniatures.py --local_dir ~/bert-miniatures --layers 2 4 --hidden 128 256
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time

from hf_tdiag.viz.schatten import PAPER_NORMALIZE_AT

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
    """``{ours,edelman}_norm_width`` / ``_norm_depth``: each row's proxy over its curve's value at N = 128 / L = 2."""
    from hf_tdiag.viz.schatten import scaling_curves

    for x_key, suffix in (("hidden_size", "width"), ("num_layers", "depth")):
        group_key = "num_layers" if x_key == "hidden_size" else "hidden_size"
        for (g, key), c in scaling_curves(rows, x_key).items():
            for r in rows:
                if r[group_key] == g:
                    r[f"{key}_norm_{suffix}"] = float(c["y"][c["x"].index(r[x_key])])


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output_dir", required=True)
    ap.add_argument("--local_dir", default=None, help="folder with local copies (skips models not found there)")
    ap.add_argument("--layers", type=int, nargs="+", default=list(LAYERS))
    ap.add_argument("--hidden", type=int, nargs="+", default=list(HIDDEN))
    ap.add_argument("--L_phi", type=float, default=1.13)
    ap.add_argument("--p_grid_m", type=int, default=None)
    ap.add_argument("--rank_tol", type=float, default=1e-10)
    ap.add_argument("--detail_model", default=None, help="miniature name for the per-matrix figures (default: largest)")
    args = ap.parse_args(argv)
    for h in args.hidden:
        if h % 64:
            ap.error(f"--hidden: miniature widths are multiples of 64 (heads of width 64), got {h}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import hf_tdiag
    from hf_tdiag.viz.schatten import (
        plot_norm_scaling,
        plot_proxies_vs_depth,
        plot_proxies_vs_width,
        save_report_figures,
    )

    os.makedirs(os.path.join(args.output_dir, "reports"), exist_ok=True)
    jobs, missing = [], []
    for num_layers in args.layers:
        for hidden in args.hidden:
            name = miniature_name(num_layers, hidden)
            where = miniature_source(name, args.local_dir)
            (jobs if where else missing).append((name, where))
    if missing:
        print(f"not found under {args.local_dir}: {', '.join(n for n, _ in missing)}", file=sys.stderr)
    if not jobs:
        raise SystemExit(f"no miniature found under --local_dir {args.local_dir!r}")

    rows, reports = [], {}
    for i, (name, where) in enumerate(jobs, 1):
        t0 = time.perf_counter()
        rep = hf_tdiag.spectrum_bounds(where, L_phi=args.L_phi, p_grid_m=args.p_grid_m, rank_tol=args.rank_tol)
        seconds = time.perf_counter() - t0
        rep.to_json(os.path.join(args.output_dir, "reports", f"{name}.json"))
        reports[name] = rep
        rows.append({"name": name, **rep.summary(), "seconds": seconds})
        print(f"[{i}/{len(jobs)}] {name}: B_ours {rep.ours:.6g}  B_Edelman {rep.edelman:.6g}  ({seconds:.1f}s)", flush=True)

    add_normalized_columns(rows)
    fields = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    with open(os.path.join(args.output_dir, "miniatures.csv"), "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(args.output_dir, "miniatures.json"), "w", encoding="utf-8") as fh:
        json.dump(
            {
                "normalized_at": PAPER_NORMALIZE_AT,
                "rows": rows,
                "reports": {n: r.to_dict(include_spectra=False) for n, r in reports.items()},
            },
            fh,
            indent=1,
        )

    plot_proxies_vs_width(rows).savefig(os.path.join(args.output_dir, "proxies_vs_width.png"), dpi=120)
    plot_proxies_vs_depth(rows).savefig(os.path.join(args.output_dir, "proxies_vs_depth.png"), dpi=120)
    norm_L = 2 if any(r.num_layers == 2 for r in reports.values()) else min(r.num_layers for r in reports.values())
    plot_norm_scaling(list(reports.values()), norm_L).savefig(os.path.join(args.output_dir, "norm_scaling.png"), dpi=120)
    detail = args.detail_model or max(rows, key=lambda r: (r["hidden_size"], r["num_layers"]))["name"]
    if detail not in reports:
        raise SystemExit(f"--detail_model {detail!r} was not analysed; analysed: {sorted(reports)}")
    save_report_figures(reports[detail], args.output_dir)
    print(f"wrote {args.output_dir}/miniatures.csv, miniatures.json and figures (detail: {detail})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
