#!/usr/bin/env python
"""Train a CRATE image classifier with Accelerate, then report its per-layer SRR.

    python recipes/train_crate.py --output-dir runs/digits            # scikit-learn digits, offline
    accelerate launch recipes/train_crate.py --dataset-name cifar10 --preset crate-32 --output-dir runs/c10
    ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 recipes/train_crate.py --output-dir runs/ddp

Flags follow Transformers' ``run_image_classification_no_trainer.py`` (hyphenated; the underscore spellings
those examples use work too); see ``--help``.
The trainer's phases live in :mod:`hf_tdiag.training.loop`; the per-layer SRR report of the trained
model (``--layer-srr-samples`` evaluation images: layer_srr.json, layer_srr.png, a console table, the
model card's SRR table) is :func:`hf_tdiag.training.srr_tracking.layer_srr_step`, run after training.
"""

import sys

from hf_tdiag.training.args import build_parser
from hf_tdiag.training.loop import train
from hf_tdiag.training.srr_tracking import layer_srr_step


def main(argv=None) -> int:
    args = build_parser(prog="train_crate.py").parse_args(argv)
    train(args, after_fit=[layer_srr_step])
    return 0


if __name__ == "__main__":
    sys.exit(main())
