"""Does SRR predict generalization? (Hu, Zou & Xu 2024) — one command.

    python recipes/srr_generalization.py --jobs 2              # default grid: 32 twelve-layer CRATE runs on digits
    python recipes/srr_generalization.py --grid tiny           # 2x2 smoke grid (seconds)
    python recipes/srr_generalization.py --grid cifar10 --jobs 8   # the paper's setting, on GPUs (also cifar100)

Same as ``hf-tdiag study ...``: trains every run of the grid to the stop criterion, caches each finished run as
JSON under ``--output-dir/runs`` (a killed study continues where it stopped), and writes Kendall's tau and the
granulated Psi of every measure against both generalization gaps (cross-entropy and 0-1 error;
table.json/.csv/.md) plus scatter plots.
"""

import sys

from hf_tdiag._cli_args import ArgumentParser, plain
from hf_tdiag.commands.study import add_arguments, run


def main(argv=None) -> int:
    parser = add_arguments(ArgumentParser(description=plain(__doc__)))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
