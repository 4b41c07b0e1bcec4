"""``hf-tdiag train ...``: the CRATE Accelerate trainer (same flags and entry point as ``recipes/train_crate.py``)."""

from __future__ import annotations

import json


def register(subparsers) -> None:
    from .._cli_args import plain
    from ..training.args import add_arguments

    p = subparsers.add_parser(
        "train",
        help="train a CRATE image classifier with Accelerate (default data: scikit-learn's 8x8 digits)",
        description=plain(
            "Train a CRATE classifier with Accelerate: evaluation every epoch, atomic checkpoints, optional SRR "
            "regularisation and stop-at-train-loss with the generalization gap, model card and Hub upload. "
            "Without a dataset flag it trains on scikit-learn's digits. Multi-process: "
            "`accelerate launch -m hf_tdiag.cli train ...` or torchrun on recipes/train_crate.py."
        ),
    )
    add_arguments(p)
    p.add_argument("--print-results", action="store_true", help="print all_results as JSON at the end")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..training.loop import train
    from ..training.srr_tracking import layer_srr_step

    show = getattr(args, "print_results", False)
    from ..training.args import flag_defaults

    trainer_flags = flag_defaults()  # the global flags (--quiet, ...) are the command line's, not the trainer's
    values = {k: v for k, v in vars(args).items() if k in trainer_flags}
    results = train(values, after_fit=[layer_srr_step])  # as recipes/train_crate.py
    if show:
        print(json.dumps({k: v for k, v in results.items() if k != "history"}, indent=2))
    return 0
