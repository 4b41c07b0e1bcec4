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

import sys

from hf_tdiag._cli_args import ArgumentParser, plain
from hf_tdiag.commands.study import add_arguments, claim_study_dir, run


def main(argv=None) -> int:
    parser = add_arguments(ArgumentParser(description=plain(__doc__)))
    args = parser.parse_args(argv)
    from hf_tdiag.study.lock import StudyLockedError

    try:
        claim_study_dir(args)
    except (
        ValueError,
        StudyLockedError,
    ) as err:  # another study or run in the folder (OutputExistsError too): one line, nothing written
        print(f"srr_generalization: {err}", file=sys.stderr)
        return 1
    return run(args)  # the study runner checks the folder again and passes --overwrite-output-dir on


if __name__ == "__main__":
    sys.exit(main())
