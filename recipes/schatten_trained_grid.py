"""Spectrum-adaptive Schatten vs Edelman proxies on a grid of encoders trained here (the paper's Figure 1).

Trains ViT-style encoders (BERT-like blocks) on scikit-learn's 8×8 digits over depths L and widths N
(``--grid cpu``: L ∈ {2, 4, 6, 8}, N ∈ {64, 128, 256}, heads N/32, 4×4 patches, 200 AdamW steps of 32 images;
``--grid gpu``: the BERT miniatures' shapes, heads N/64, 3000 steps of 128) and computes both proxies at
initialisation and after training (:mod:`hf_tdiag.study.schatten_grid`). Resumable: every finished cell is
cached under ``--output-dir``/runs; a rerun trains only the missing cells. Writes into ``--output-dir``:

* ``grid.csv`` / ``grid.json``: one row per cell and stage (init / trained): both proxies, each normalised
  per curve as the paper plots them (``*_norm_width`` at N = 128, ``*_norm_depth`` at L = 2), optimal p
  and stable rank per matrix type, the fixed-p bounds, test accuracy.
* ``proxies_vs_depth.png``, ``proxies_vs_width.png``: both proxies, init and trained side by side.
* ``p_opt.png``: the share of matrices with p_opt = 0 and the mean p_opt per type, init vs trained.
* ``spectra.png``: singular-value decay of one cell (``--detail-cell L N``) at init and after training.

    python recipes/schatten_trained_grid.py --output-dir runs/schatten_grid --jobs 2
    python recipes/schatten_trained_grid.py --output-dir runs/schatten_grid_gpu --grid gpu
    python recipes/schatten_trained_grid.py --output-dir runs/schatten_grid_gpu --grid gpu --executor ray --ray-address auto

``--executor ray`` trains each cell as a Ray task (``pip install "hf-tdiag[ray]"``), the same executors as
``hf-tdiag study`` (:mod:`hf_tdiag.study.executors`); the cache under ``--output-dir``/runs decides what is left.

A rerun resumes (and rewrites the tables and figures) when every cell of the folder's ``grid.json`` is in the new
grid; a folder whose tables hold cells the new grid drops (or tables without a readable ``grid.json``, or another
run's results) is refused before any training (exit status 1) unless ``--overwrite-output-dir`` is given, which
replaces the tables and figures; the cache (``runs/``, ``reports/``: keyed by every setting of a cell) is kept.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time

from hf_tdiag._cli_args import ArgumentParser, add_executor_flags, executor_options, plain, positive_int
from hf_tdiag._outputs import OutputExistsError, add_overwrite_flag, claim_output_dir

# what a run writes into --output-dir besides the cache (runs/, reports/)
OUTPUTS = ("grid.csv", "grid.json", "proxies_vs_depth.png", "proxies_vs_width.png", "p_opt.png", "spectra.png")


def parse_args(argv=None) -> argparse.Namespace:
    ap = ArgumentParser(description=plain(__doc__))
    ap.add_argument("--output-dir", "--output_dir", dest="output_dir", required=True)
    ap.add_argument("--grid", default="cpu", choices=["cpu", "gpu", "tiny"], help="cell shapes and training budget")
    ap.add_argument("--layers", type=int, nargs="+", default=None, help="depths (default: the grid's)")
    ap.add_argument("--hidden", type=int, nargs="+", default=None, help="widths (default: the grid's)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per cell (default: the grid's)")
    ap.add_argument(
        "--head-dim",
        "--head_dim",
        dest="head_dim",
        type=int,
        default=None,
        help="head width; heads = N / head-dim (default: the grid's, 32 on cpu)",
    )
    ap.add_argument(
        "--patch-size",
        "--patch_size",
        dest="patch_size",
        type=int,
        default=None,
        help="patch side on the 8x8 digits: 4 (default, 4 tokens + CLS) or 2 (16 + CLS, ~3x the cost)",
    )
    ap.add_argument("--jobs", type=positive_int, default=1, help="cells trained at once (processes)")
    ap.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="torch CPU threads per cell (default: cpu_count // jobs)",
    )
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument(
        "--detail-cell",
        "--detail_cell",
        dest="detail_cell",
        type=int,
        nargs=2,
        default=None,
        metavar=("L", "N"),
        help="cell whose spectra are plotted (default: the deepest, widest)",
    )
    add_executor_flags(ap)
    add_overwrite_flag(ap)
    args = ap.parse_args(argv)
    try:
        args.executor_options = executor_options(args)
    except ValueError as err:
        ap.error(str(err))
    return args


def write_tables(records: list[dict], out_dir: str) -> list[dict]:
    from hf_tdiag.study.schatten_grid import grid_rows
    from hf_tdiag.viz.schatten import scaling_curves

    rows = []
    for stage in ("init", "trained"):
        stage_rows = grid_rows(records, stage)
        for x_key, suffix in (("hidden_size", "width"), ("num_layers", "depth")):
            group_key = "num_layers" if x_key == "hidden_size" else "hidden_size"
            for (g, key), c in scaling_curves(stage_rows, x_key).items():
                for r in stage_rows:
                    if r[group_key] == g:
                        r[f"{key}_norm_{suffix}"] = float(c["y"][c["x"].index(r[x_key])])
        rows += [{"stage": stage, **r} for r in stage_rows]
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(os.path.join(out_dir, "grid.csv"), "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out_dir, "grid.json"), "w", encoding="utf-8") as fh:
        json.dump({"rows": rows, "records": records}, fh, indent=1)
    return rows


def write_figures(records: list[dict], out_dir: str, detail) -> None:
    from hf_tdiag.study.schatten_grid import grid_rows, load_report_pair
    from hf_tdiag.viz import schatten as VS

    init, trained = grid_rows(records, "init"), grid_rows(records, "trained")
    VS.plot_init_vs_trained(init, trained, "num_layers").savefig(os.path.join(out_dir, "proxies_vs_depth.png"), dpi=110)
    VS.plot_init_vs_trained(init, trained, "hidden_size").savefig(
        os.path.join(out_dir, "proxies_vs_width.png"), dpi=110
    )
    VS.plot_p_opt_init_vs_trained(init, trained).savefig(os.path.join(out_dir, "p_opt.png"), dpi=110)
    cells = [r["cell"] for r in records]
    L, N = detail or max(((c["num_layers"], c["hidden_size"]) for c in cells), key=lambda x: (x[1], x[0]))
    match = [r for r in records if (r["cell"]["num_layers"], r["cell"]["hidden_size"]) == (L, N)]
    if not match:
        raise SystemExit(
            f"--detail-cell {L} {N} is not in the grid; cells: {sorted((c['num_layers'], c['hidden_size']) for c in cells)}"
        )
    rep_init, rep_trained = load_report_pair(match[0], out_dir)
    VS.plot_spectra_init_vs_trained(rep_init, rep_trained).savefig(os.path.join(out_dir, "spectra.png"), dpi=110)


def _table_clash(out_dir: str, cells) -> bool:
    """True when this run's tables would replace ones it does not reproduce: a ``grid.json`` holding a cell not in
    ``cells`` (or unreadable), or tables and figures without a ``grid.json``."""
    try:
        with open(os.path.join(out_dir, "grid.json"), encoding="utf-8") as fh:
            earlier = {r["key"] for r in json.load(fh)["records"]}
    except FileNotFoundError:
        return any(os.path.exists(os.path.join(out_dir, name)) for name in OUTPUTS)
    except (OSError, ValueError, KeyError, TypeError):
        return True
    return not earlier <= {c.key() for c in cells}


def main(argv=None) -> int:
    args = parse_args(argv)
    from hf_tdiag.study.schatten_grid import grid_cells, run_grid

    cells = grid_cells(
        args.grid, args.layers, args.hidden, steps=args.steps, head_dim=args.head_dim, patch_size=args.patch_size
    )
    try:  # before any training: a resume rewrites the tables; another grid's are replaced only with the flag
        claim_output_dir(
            args.output_dir,
            OUTPUTS if _table_clash(args.output_dir, cells) else (),
            overwrite=args.overwrite_output_dir,
        )
    except OutputExistsError as err:  # one line, nothing written or removed
        print(f"schatten_trained_grid: {err}", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    try:
        records = run_grid(
            cells,
            args.output_dir,
            jobs=args.jobs,
            device=args.device,
            threads=args.threads,
            executor=args.executor,
            executor_options=args.executor_options,
            log=lambda s: print(s, flush=True),
        )
    except (RuntimeError, ImportError) as err:  # failed cells (logged with their tracebacks); the Ray extra missing
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(
        f"{len(cells)} cells in {time.perf_counter() - t0:.0f} s "
        f"({sum(not r.get('cached') for r in records)} trained now, jobs={args.jobs}, executor={args.executor})",
        flush=True,
    )
    write_tables(records, args.output_dir)
    write_figures(records, args.output_dir, args.detail_cell)
    print(f"wrote {args.output_dir}/grid.csv, grid.json and figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
