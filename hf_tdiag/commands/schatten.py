"""``hf-tdiag schatten MODEL...``: spectrum-adaptive Schatten and Edelman bound proxies of encoders."""

from __future__ import annotations

import argparse
import os

from .._cli_args import (
    add_output_dir,
    add_settings_flags,
    add_threads_flag,
    add_trust_remote_code_flag,
    default_output_dir,
    plain,
    settings_from_args,
)
from ..diagnostics.settings import SchattenSettings


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "schatten",
        help="spectrum-adaptive Schatten vs Edelman generalization-bound proxies of encoder weights",
        description=plain(
            "Compute B_Schatten = sum_W min_p c(W,p) + sqrt(L) (Sakai & Imaizumi 2026) and B_Edelman (Edelman et al. 2022) "
            "from the weights of BERT-like encoders (BERT, RoBERTa, ELECTRA, DistilBERT), ViT/DeiT or CRATE. "
            "MODEL is a local folder or a Hub id."
        ),
    )
    p.add_argument("models", nargs="+", metavar="MODEL", help="local folders or Hub ids")
    add_settings_flags(p, SchattenSettings, overrides={"num_workers": {"metavar": "N"}})
    add_threads_flag(p)
    add_output_dir(
        p,
        default_output_dir("schatten"),
        "where schatten.json (full reports with spectra), schatten.csv (one row per "
        f"model), matrices.csv (one row per matrix) and the figures go (default {default_output_dir('schatten')})",
    )
    p.add_argument(
        "--no-figures", action="store_true", help="skip the spectral-decay, optimal-p and contribution figures"
    )
    # per-file destinations, kept for scripts written before --output-dir
    p.add_argument("--json", default=None, metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--csv", default=None, metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--matrices-csv", default=None, metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--plots", default=None, metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="print per-type contributions at p in {0, 1/2, 1, 2} and the per-layer alpha for every model "
        "(always printed for a model whose p_opt is 0 for every matrix)",
    )
    add_trust_remote_code_flag(p)
    p.set_defaults(func=run)


def _destinations(args: argparse.Namespace) -> dict[str, str | None]:
    """Where each output goes: the old per-file flags, when any is given, choose exactly what is written;
    otherwise everything goes into ``--output-dir``."""
    if any((args.json, args.csv, args.matrices_csv, args.plots)):
        return {"json": args.json, "csv": args.csv, "matrices_csv": args.matrices_csv, "plots": args.plots}
    out = args.output_dir
    return {
        "json": os.path.join(out, "schatten.json"),
        "csv": os.path.join(out, "schatten.csv"),
        "matrices_csv": os.path.join(out, "matrices.csv"),
        "plots": None if args.no_figures else out,
    }


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
    from hf_tdiag._atomic import write_csv, write_json
    from hf_tdiag._outputs import claim_args
    from hf_tdiag.diagnostics.schatten import schatten_bounds
    from hf_tdiag.viz.schatten import model_label

    dest = _destinations(args)
    if dest["json"] == os.path.join(args.output_dir, "schatten.json"):
        written = ["schatten.json", "schatten.csv", "matrices.csv"]
        claim_args(args, written, inputs=[args.models], stale=["[0-9][0-9]_*.png"])  # figures: 00_<model>_<kind>.png
    else:  # the old per-file flags: each file's folder
        for key in ("json", "csv", "matrices_csv"):
            if dest[key]:
                folder = os.path.dirname(dest[key]) or "."
                claim_args(args, [os.path.basename(dest[key])], inputs=[args.models], folder=folder)
    from hf_tdiag._threads import torch_threads

    settings = settings_from_args(SchattenSettings, args)
    reports = []
    with torch_threads(args.threads):
        for model in args.models:
            reports.append(
                schatten_bounds(
                    model,
                    settings=settings,
                    progress=True,
                    trust_remote_code=args.trust_remote_code,
                )
            )
    header = f"{'model':<44} {'L':>3} {'N':>5} {'H':>3} {'B_Schatten':>12} {'B_Edelman':>12} {'ratio':>9}"
    print(header)
    print("-" * len(header))
    for r in reports:
        print(
            f"{model_label(r.model)[-44:]:<44} {r.num_layers:>3} {r.hidden_size:>5} {r.num_heads:>3} "
            f"{r.schatten_bound:>12.6g} {r.edelman_bound:>12.6g} {r.edelman_bound / r.schatten_bound:>9.3g}"
        )
    for r in reports:
        if args.breakdown or r.degenerate:
            print_breakdown(r)
    if dest["json"]:
        print(f"wrote {write_json(dest['json'], [r.to_dict() for r in reports], indent=None)}")
    if dest["csv"]:
        print(f"wrote {write_csv(dest['csv'], [r.summary() for r in reports])}")
    if dest["matrices_csv"]:
        rows = [{"model": r.model, **m.to_dict(include_spectra=False)} for r in reports for m in r.matrices]
        for row in rows:
            row["shape"] = "x".join(map(str, row["shape"]))
        print(f"wrote {write_csv(dest['matrices_csv'], rows)}")
    if dest["plots"]:
        from hf_tdiag.viz.schatten import save_report_figures

        for i, r in enumerate(reports):
            prefix = f"{i:02d}_{os.path.basename(r.model.rstrip('/')) or 'model'}_"
            for path in save_report_figures(r, dest["plots"], prefix=prefix).values():
                print(f"wrote {path}")
    return 0
