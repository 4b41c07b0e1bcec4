"""Does SRR predict generalization? (Hu, Zou & Xu 2024) — one command.

    python recipes/srr_generalization.py --jobs 2              # default grid: 32 twelve-layer CRATE runs on digits
    python recipes/srr_generalization.py --grid tiny           # 2x2 smoke grid (seconds)
    python recipes/srr_generalization.py --grid cifar10 --jobs 8   # the paper's setting, on GPUs (also cifar100)

Same as ``hf-tdiag study ...``: trains every run of the grid to the stop criterion, caches each finished run as
JSON under ``--output-dir/runs`` (a killed study continues where it stopped), and writes Kendall's tau and the
granulated Psi of every measure against both generalization gaps (cross-entropy and 0-1 error;
table.json/.csv/.md) plus scatter plots.

A rerun into the same folder continues the same study; a folder holding a study of another grid (its study.json),
tables without a study.json or another run's results is refused before any training, also with
``--summarize-only`` (one line, exit status 1), unless ``--overwrite-output-dir`` is given, which replaces the
study.json and tables (the cached runs are kept: their keys tell them apart).
"""

import os
import sys

from hf_tdiag._cli_args import ArgumentParser, plain
from hf_tdiag.commands.study import add_arguments, build_grid, run

# what the study writes into its folder besides the run cache (runs/, work/)
OUTPUTS = ("study.json", "table.json", "table.csv", "table.md", "runs.csv", "scatter.png")


def claim(args) -> None:
    """Before any training: the study folder holds this grid's study (it continues), or no study and none of its
    tables, or ``--overwrite-output-dir`` was given. ``--summarize-only`` is held to the same rule."""
    from hf_tdiag._outputs import claim_output_dir
    from hf_tdiag.study.runner import _check_study_file

    out = args.output_dir or f"runs/study_{args.grid}"
    if os.path.exists(os.path.join(out, "study.json")):
        _check_study_file(out, build_grid(args), args.overwrite_output_dir)
    else:  # tables of unknown origin, another command's results: the same rule as every command
        claim_output_dir(out, OUTPUTS, overwrite=args.overwrite_output_dir, remove=False)


def main(argv=None) -> int:
    parser = add_arguments(ArgumentParser(description=plain(__doc__)))
    args = parser.parse_args(argv)
    try:
        claim(args)
    except ValueError as err:  # another study or run in the folder (OutputExistsError too): one line, nothing written
        print(f"srr_generalization: {err}", file=sys.stderr)
        return 1
    return run(args)  # the study runner checks the folder again and passes --overwrite-output-dir on


if __name__ == "__main__":
    sys.exit(main())
