"""``hf-tdiag schatten MODEL...``: spectrum-adaptive Schatten and Edelman bound proxies of encoders."""

from __future__ import annotations

import argparse
import csv
import json
import os


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "schatten",
        help="spectrum-adaptive Schatten vs Edelman generalization-bound proxies of encoder weights",
        description=(
            "Compute B_ours = sum_W min_p c(W,p) + sqrt(L) (Sakai & Imaizumi 2026) and B_Edelman (Edelman et al. 2022) "
            "from the weights of BERT-like encoders (BERT, RoBERTa, ELECTRA, DistilBERT), ViT/DeiT or CRATE. "
            "MODEL is a local folder or a Hub id."
        ),
    )
    p.add_argument("models", nargs="+", metavar="MODEL", help="local folders or Hub ids")
    p.add_argument("--l-phi", type=float, default=1.13, help="FFN activation Lipschitz constant L_phi (default 1.13, GELU)")
    p.add_argument("--p-grid-m", type=int, default=None, help="p grid {0, 1/m, ..., 2}; default m = ceil(L + ln N)")
    p.add_argument("--rank-tol", type=float, default=1e-10, help="rank threshold factor (default 1e-10)")
    p.add_argument("--workers", type=int, default=None, help="threads for the spectra (default: torch's thread count)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the full reports (with spectra) as JSON")
    p.add_argument("--csv", default=None, metavar="PATH", help="write one summary row per model as CSV")
    p.add_argument("--matrices-csv", default=None, metavar="PATH", help="write one row per analysed matrix as CSV")
    p.add_argument("--plots", default=None, metavar="DIR", help="write spectral-decay, optimal-p and contribution figures")
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="print per-type contributions at p in {0, 1/2, 1, 2} and the per-layer alpha for every model "
        "(always printed for a model whose p_opt is 0 for every matrix)",
    )
    p.set_defaults(func=run)


def _write_csv(path: str, rows: list[dict]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _print_table(headers: list[str], rows: list[list]) -> None:
    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    table = [headers] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[j]) for r in table) for j in range(len(headers))]
    for i, r in enumerate(table):
        print("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))


def print_breakdown(report) -> None:
    """The degenerate-case note (if any), per-type Σ c(W, p) at p ∈ {0, ½, 1, 2}, and α_ℓ per layer."""
    from hf_tdiag.viz.schatten import model_label

    print(f"\n{model_label(report.model)}:")
    note = report.degenerate_note()
    if note:
        print(f"  NOTE: {note}")
    for headers, rows in report.breakdown_tables().values():
        _print_table(headers, rows)
        print()


def run(args: argparse.Namespace) -> int:
    from hf_tdiag.probes.spectrum import spectrum_bounds
    from hf_tdiag.viz.schatten import model_label

    reports = []
    for model in args.models:
        reports.append(
            spectrum_bounds(
                model, L_phi=args.l_phi, p_grid_m=args.p_grid_m, rank_tol=args.rank_tol, num_workers=args.workers, progress=True
            )
        )
    header = f"{'model':<44} {'L':>3} {'N':>5} {'H':>3} {'B_ours':>12} {'B_Edelman':>12} {'ratio':>9}"
    print(header)
    print("-" * len(header))
    for r in reports:
        print(
            f"{model_label(r.model)[-44:]:<44} {r.num_layers:>3} {r.hidden_size:>5} {r.num_heads:>3} {r.ours:>12.6g} "
            f"{r.edelman:>12.6g} {r.edelman / r.ours:>9.3g}"
        )
    for r in reports:
        if args.breakdown or r.degenerate:
            print_breakdown(r)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([r.to_dict() for r in reports], fh)
        print(f"wrote {args.json}")
    if args.csv:
        _write_csv(args.csv, [r.summary() for r in reports])
        print(f"wrote {args.csv}")
    if args.matrices_csv:
        rows = [{"model": r.model, **m.to_dict(include_spectra=False)} for r in reports for m in r.matrices]
        for row in rows:
            row["shape"] = "x".join(map(str, row["shape"]))
        _write_csv(args.matrices_csv, rows)
        print(f"wrote {args.matrices_csv}")
    if args.plots:
        from hf_tdiag.viz.schatten import save_report_figures

        for i, r in enumerate(reports):
            prefix = f"{i:02d}_{os.path.basename(r.model.rstrip('/')) or 'model'}_"
            for path in save_report_figures(r, args.plots, prefix=prefix).values():
                print(f"wrote {path}")
    return 0
