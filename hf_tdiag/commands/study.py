"""``hf-tdiag study``: does SRR predict generalization? Train a grid of CRATE variants and rank the measures."""

from __future__ import annotations

import argparse
import json
import sys

from .._cli_args import add_executor_flags, add_output_dir, executor_options, plain, positive_int


def _parse_assignment(text: str, what: str) -> tuple[str, str]:
    if "=" not in text:
        raise ValueError(f"{what}: expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    if not key:
        raise ValueError(f"{what}: expected KEY=VALUE with a non-empty key, got {text!r}")
    return key, value


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from hf_tdiag.study import GRIDS

    p.add_argument("--grid", default="digits", choices=sorted(GRIDS), help="which grid to run (default: digits)")
    add_output_dir(p, None, "study folder holding the run cache and tables (default: runs/study_<grid>)")
    p.add_argument(
        "--jobs", type=positive_int, default=1, help="trainings run at once, in separate processes (default 1)"
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="torch CPU threads per job (default: cpu_count // jobs)",
    )
    p.add_argument(
        "--axis",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="replace (or add) a grid axis, values JSON-parsed, e.g. --axis learning_rate=1e-3,3e-3",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a fixed trainer setting, value JSON-parsed, e.g. --set max_train_steps=500",
    )
    p.add_argument(
        "--max-runs",
        "--limit",
        type=positive_int,
        default=None,
        metavar="N",
        help="train at most this many new runs, then summarize",
    )
    p.add_argument(
        "--train-fn", default=None, help="alternative trainer as module:function (see hf_tdiag.study.run_study)"
    )
    p.add_argument("--keep-models", action="store_true", help="keep each run's trained model folder")
    p.add_argument("--no-figures", "--no-plot", action="store_true", help="skip the scatter plots")
    p.add_argument("--summarize-only", action="store_true", help="only rebuild the table from the cached runs")
    p.add_argument(
        "--max-samples",
        "--max-examples",
        type=positive_int,
        default=None,
        metavar="N",
        help="training examples used by the measures (default 512)",
    )
    add_executor_flags(p)
    return p


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "study",
        help="SRR-vs-generalization correlation study (Hu, Zou & Xu 2024): train a grid, rank measures by Kendall tau / Psi",
        description=plain(
            "Train every run of a hyperparameter grid over CRATE variants to the stop criterion, record the "
            "generalization gap, compute SRR and norm/margin/sharpness baselines on the training data, and write "
            "Kendall's tau and the granulated Psi per measure (table.json/.csv/.md) plus scatter plots. Each "
            "finished run is cached as JSON: a killed study continues where it stopped."
        ),
    )
    add_arguments(p)
    p.set_defaults(func=run)


def build_grid(args: argparse.Namespace):
    import copy

    from hf_tdiag.study import GRIDS, StudyGrid

    base = GRIDS[args.grid]
    axes = copy.deepcopy(base.axes)
    fixed = copy.deepcopy(base.fixed)
    for text in args.axis:
        key, values = _parse_assignment(text, "--axis")
        axes[key] = [_value(v) for v in values.split(",") if v != ""]
        fixed.pop(key, None)
    for text in args.set:
        key, value = _parse_assignment(text, "--set")
        if key in axes:
            raise ValueError(f"--set: {key!r} is a grid axis; change it with --axis")
        fixed[key] = _value(value)
    return StudyGrid(name=base.name, axes=axes, fixed=fixed, description=base.description)


# what a study writes into its folder besides the run cache (runs/, work/)
STUDY_OUTPUTS = ("study.json", "table.json", "table.csv", "table.md", "runs.csv", "scatter.png")


def claim_study_dir(args: argparse.Namespace) -> None:
    """Before any training or summarizing: no running study holds the folder (``StudyLockedError``), and it holds
    this grid's study (it continues), or no study and none of a study's tables, or ``--overwrite-output-dir`` was
    given (ValueError, one line, otherwise). ``--summarize-only`` is held to the same rule: it rewrites the tables."""
    import os

    from hf_tdiag._outputs import claim_output_dir
    from hf_tdiag.study.lock import check_unlocked
    from hf_tdiag.study.runner import check_study_dir

    out = args.output_dir or f"runs/study_{args.grid}"
    overwrite = getattr(args, "overwrite_output_dir", False)
    check_unlocked(out)  # a running study's folder: say so first, whatever its grid
    if os.path.exists(os.path.join(out, "study.json")):
        check_study_dir(out, build_grid(args), overwrite)
    else:  # tables of unknown origin, another command's results: the rule of every command
        claim_output_dir(out, STUDY_OUTPUTS, overwrite=overwrite, remove=False)


def run(args: argparse.Namespace) -> int:
    from hf_tdiag.study import MeasureSettings, load_records, run_key, run_study, summarize
    from hf_tdiag.study.lock import StudyLockedError

    grid = build_grid(args)
    out = args.output_dir or f"runs/study_{args.grid}"
    claim_study_dir(args)
    settings = MeasureSettings()
    if args.max_samples is not None:
        settings.max_examples = args.max_samples
    if args.summarize_only:
        keys = {run_key(hp, grid.fixed, settings) for hp in grid.runs()}
        cached_all = load_records(out)
        records = [r for r in cached_all if r["key"] in keys]
        if len(cached_all) > len(records):
            print(
                f"note: {len(cached_all) - len(records)} cached run(s) in {out} were trained or measured with other "
                "settings than these (grid axes, --set values or --max-samples) and are not counted; pass the "
                "settings they used, or run without --summarize-only to measure with these",
                file=sys.stderr,
            )
        summary = summarize(grid, records, out, settings=settings, plot=not args.no_figures, cached=len(records))
    else:
        try:
            summary = run_study(
                grid,
                out,
                jobs=args.jobs,
                settings=settings,
                train_fn=args.train_fn,
                limit=args.max_runs,
                keep_models=args.keep_models,
                plot=not args.no_figures,
                threads=args.threads,
                executor=args.executor,
                executor_options=executor_options(args),
                overwrite=getattr(args, "overwrite_output_dir", False),
            )
        except (StudyLockedError, ImportError) as err:  # a running study in the folder; the Ray extra missing
            print(f"error: {err}", file=sys.stderr)
            return 1
    print(
        f"study {grid.name}: {summary['n_runs']}/{summary['n_expected']} runs finished "
        f"({summary['cached']} from the cache), {summary['reached_stop']} reached the target training loss"
    )
    for f in summary["failures"]:
        print(f"  failed: {f['hparams']}: {f['error']}", file=sys.stderr)
    if summary["markdown"]:
        print(summary["markdown"])
    for kind, path in summary.get("paths", {}).items():
        print(f"{kind}: {path}")
    return 0 if not summary["failures"] else 1
