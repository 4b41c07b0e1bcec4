#!/usr/bin/env python
"""Train a CRATE image classifier with Accelerate.

    python recipes/train_crate.py --output_dir runs/digits            # scikit-learn digits, offline
    accelerate launch recipes/train_crate.py --dataset_name cifar10 --preset crate-32 --output_dir runs/c10
    ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 recipes/train_crate.py --output_dir runs/ddp

Flags follow Transformers' ``run_image_classification_no_trainer.py``; see ``--help``.
The logic lives in :mod:`hf_tdiag.training`.
"""

import sys

from hf_tdiag.training.args import build_parser
from hf_tdiag.training.loop import train


def main(argv=None) -> int:
    args = build_parser(prog="train_crate.py").parse_args(argv)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
