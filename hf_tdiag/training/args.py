"""Command-line arguments of the CRATE trainer, in the style of Transformers' ``*_no_trainer`` examples.

``build_parser()`` is shared by ``recipes/train_crate.py`` and ``hf-tdiag train``;
``make_args()`` turns an argv list, a namespace or keyword arguments into one
validated ``argparse.Namespace`` so the trainer can also be called in-process.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .._validation import non_negative_int, positive_int, real

OPTIMIZERS = ("adamw", "lion")
SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
)
AUGMENTATIONS = ("auto", "none", "pad_crop", "random_resized_crop")
MIXED_PRECISION = ("no", "fp16", "bf16")
DIGITS = "digits"


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add every trainer flag to ``parser`` (used by the recipe and by the ``hf-tdiag train`` sub-command)."""
    from .._cli_args import output_dir

    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset",
        "--dataset-name",
        dest="dataset_name",
        type=str,
        default=None,
        help="(--dataset-name as in Transformers' examples) Hub image-classification dataset (e.g. cifar10) or a local dataset folder/script for "
        "datasets.load_dataset. Without any dataset flag the trainer uses scikit-learn's 8x8 digits.",
    )
    data.add_argument("--dataset-config-name", type=str, default=None, help="Config name of --dataset-name.")
    data.add_argument("--dataset-path", type=str, default=None, help="A DatasetDict written with save_to_disk.")
    data.add_argument("--train-dir", type=str, default=None, help="Local image folder (class sub-folders) to train on.")
    data.add_argument("--validation-dir", type=str, default=None, help="Local image folder to evaluate on.")
    data.add_argument(
        "--train-val-split",
        type=float,
        default=0.15,
        help="Fraction of the training split held out for evaluation when the data has no validation/test split.",
    )
    data.add_argument("--image-column-name", type=str, default=None, help="Image column (default: image/img).")
    data.add_argument("--label-column-name", type=str, default=None, help="Label column (default: label/labels).")
    data.add_argument("--max-train-samples", type=int, default=None, help="Truncate the training set (debugging).")
    data.add_argument("--max-eval-samples", type=int, default=None, help="Truncate the evaluation set (debugging).")
    data.add_argument(
        "--augmentation",
        choices=AUGMENTATIONS,
        default="auto",
        help="Training augmentation: auto = none for digits, pad_crop for images <= 64 px, "
        "random_resized_crop otherwise.",
    )
    data.add_argument(
        "--hflip",
        type=float,
        default=None,
        help="Horizontal flip probability (default 0.5 for natural images, 0 for digits).",
    )
    data.add_argument("--dataloader-num-workers", type=int, default=0)
    data.add_argument(
        "--threads",
        "--num-threads",
        dest="num_threads",
        type=int,
        default=None,
        metavar="N",
        help="torch intra-op threads per process (default: 1 for models under 10M parameters on CPU, else torch's; "
        "OMP_NUM_THREADS in the environment is respected).",
    )

    model = parser.add_argument_group("model")
    model.add_argument(
        "--preset",
        type=str,
        default=None,
        help="CrateConfig preset (crate-tiny|small|base|large|32|digits), or a CRATE-α or ToST preset "
        "(crate-alpha-digits, crate-alpha-base-16, tost-digits, tost-small-12-p16, ...), which trains that family; "
        "default crate-digits for the digits data (upsampled to 16 px with 4 px patches and mean pooling unless "
        "overridden), crate-32 for images <= 32 px, crate-tiny otherwise.",
    )
    model.add_argument(
        "--variant",
        choices=("crate", "crate-c", "crate-n", "crate-t", "crate-fix", "crate-identity"),
        default=None,
        help="Output matrix of MSSA (default: the checkpoint's, or crate).",
    )
    model.add_argument(
        "--model-name-or-path", type=str, default=None, help="Fine-tune an existing CRATE, CRATE-α or ToST checkpoint."
    )
    model.add_argument("--trust-remote-code", action="store_true")
    model.add_argument(
        "--ignore-mismatched-sizes",
        action="store_true",
        help="Re-initialise the classifier when fine-tuning on a different number of labels.",
    )
    model.add_argument("--image-size", type=int, default=None, help="Override the preset's image size.")
    model.add_argument("--patch-size", type=int, default=None, help="Override the preset's patch size.")
    model.add_argument("--hidden-size", type=int, default=None, help="Override the preset's width d.")
    model.add_argument("--num-hidden-layers", type=int, default=None, help="Override the preset's depth L.")
    model.add_argument("--num-attention-heads", type=int, default=None, help="Override the preset's heads K.")
    model.add_argument("--pooling", choices=("cls", "mean"), default=None, help="Override the pooling.")
    model.add_argument("--hidden-dropout-prob", type=float, default=None)

    opt = parser.add_argument_group("optimisation")
    opt.add_argument(
        "--output-dir", type=output_dir, required=True, help="Where to save the model, results and checkpoints."
    )
    opt.add_argument(
        "--overwrite-output-dir",
        action="store_true",
        help="Replace another run's model, checkpoints and results in --output-dir (removed before training); "
        "default: refuse such a folder. Resuming from a checkpoint of the folder needs no flag.",
    )
    opt.add_argument("--num-train-epochs", type=int, default=None, help="Epochs (default 40 on digits, else 3).")
    opt.add_argument("--max-train-steps", type=int, default=None, help="Optimizer steps; overrides the epochs.")
    opt.add_argument("--per-device-train-batch-size", type=int, default=64)
    opt.add_argument("--per-device-eval-batch-size", type=int, default=256)
    opt.add_argument("--gradient-accumulation-steps", type=int, default=1)
    opt.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help="Peak learning rate (default AdamW 3e-3 on digits / 1e-3, Lion 3e-4 / 1e-4).",
    )
    opt.add_argument("--weight-decay", type=float, default=0.05)
    opt.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    opt.add_argument("--adam-beta1", type=float, default=0.9)
    opt.add_argument("--adam-beta2", type=float, default=0.999, help="beta2 (Lion: default 0.99 when left at 0.999).")
    opt.add_argument("--lr-scheduler-type", choices=SCHEDULERS, default="cosine")
    opt.add_argument("--num-warmup-steps", type=int, default=None, help="Warmup steps (default: --warmup-ratio).")
    opt.add_argument("--warmup-ratio", type=float, default=0.05)
    opt.add_argument("--max-grad-norm", type=float, default=1.0, help="Gradient clipping (0 disables).")
    opt.add_argument("--label-smoothing", type=float, default=0.0)
    opt.add_argument("--seed", type=int, default=42)
    opt.add_argument(
        "--mixed-precision", choices=MIXED_PRECISION, default=None, help="Default: from accelerate config."
    )

    reg = parser.add_argument_group("sparse rate reduction")
    reg.add_argument(
        "--srr-weight", type=float, default=0.0, help="beta: add beta * SRR(Z^l; U^l) of the batch to the loss."
    )
    reg.add_argument(
        "--srr-layer",
        type=str,
        default="last",
        help="Block output(s) Z^l the SRR regulariser acts on: 'last' (Z^L, default, as Hu et al.'s main result), "
        "a block number 1..L (negative from the end), 'random' (a new block every step) or 'all'.",
    )
    reg.add_argument("--srr-eps", type=float, default=0.1, help="epsilon of the coding rates.")
    reg.add_argument("--srr-lambda", type=float, default=1.0, help="lambda of the sparsity term.")
    reg.add_argument(
        "--stop-at-train-loss",
        type=float,
        default=None,
        help="Stop once an epoch's mean training cross-entropy reaches this value (or the step budget ends).",
    )
    reg.add_argument(
        "--track-srr-every",
        type=str,
        default=None,
        help="Record per-layer SRR terms of the block outputs every N optimizer steps or every 'epoch' (and before "
        "the first step) to the tracker and srr_history.json (Yu et al. 2023, Fig. 4 style). Default: off.",
    )
    reg.add_argument(
        "--track-srr-samples",
        type=int,
        default=128,
        help="Evaluation images measured by --track-srr-every (default 128).",
    )
    reg.add_argument(
        "--layer-srr-samples",
        type=int,
        default=256,
        help="Validation images used for the per-layer SRR report of the trained model (0 disables it).",
    )

    ckpt = parser.add_argument_group("checkpointing and logging")
    ckpt.add_argument(
        "--checkpointing-steps",
        type=str,
        default=None,
        help="Save the training state every N optimizer steps (and at each epoch end), or 'epoch'.",
    )
    ckpt.add_argument("--checkpoints-total-limit", type=int, default=2, help="Keep the last K checkpoints.")
    ckpt.add_argument("--resume-from-checkpoint", type=str, default=None, help="A checkpoint folder or 'latest'.")
    ckpt.add_argument("--with-tracking", action="store_true", help="Log metrics with Accelerate trackers.")
    ckpt.add_argument(
        "--report-to",
        type=str,
        default="jsonl",
        help="Tracker(s): jsonl (built in, offline), tensorboard, wandb, ..., or all.",
    )
    ckpt.add_argument("--logging-steps", type=int, default=10)
    ckpt.add_argument("--disable-tqdm", action="store_true")

    hub = parser.add_argument_group("hub")
    hub.add_argument("--push-to-hub", action="store_true")
    hub.add_argument("--hub-model-id", type=str, default=None, help="Repo id (default: the output folder's name).")
    hub.add_argument("--hub-token", type=str, default=None)
    hub.add_argument("--hub-private-repo", action="store_true")
    return parser


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """Parser with all trainer flags (hyphenated; the underscore spellings of Transformers' examples work too)."""
    from .._cli_args import ArgumentParser

    parser = ArgumentParser(
        prog=prog,
        description="Train a CRATE image classifier with Accelerate (default data: scikit-learn's 8x8 digits).",
    )
    return add_arguments(parser)


def flag_defaults() -> dict[str, Any]:
    """Every flag's default, from parsing a command line with only the required ``--output-dir``."""
    values = vars(build_parser().parse_args(["--output-dir", "-"]))
    values["output_dir"] = None
    return values


def is_digits(args: argparse.Namespace) -> bool:
    """True when no dataset flag was given (the embedded digits data is used)."""
    return not (args.dataset_name or args.dataset_path or args.train_dir)


def make_args(
    args_or_kwargs: argparse.Namespace | Mapping[str, Any] | Sequence[str] | None = None, **kwargs
) -> argparse.Namespace:
    """A validated namespace from an argv list, a namespace, a mapping and/or keyword arguments."""
    if isinstance(args_or_kwargs, argparse.Namespace):
        values = {**flag_defaults(), **vars(args_or_kwargs)}
    elif isinstance(args_or_kwargs, Mapping):
        values = {**flag_defaults(), **dict(args_or_kwargs)}
    elif isinstance(args_or_kwargs, (list, tuple)):
        values = vars(build_parser().parse_args(list(args_or_kwargs)))
    elif args_or_kwargs is None:
        values = flag_defaults()
    else:
        raise TypeError(
            "args_or_kwargs: expected an argparse.Namespace, a mapping of flag names to values or a list of "
            f"command-line strings, got {type(args_or_kwargs).__name__}"
        )
    unknown = sorted(set(kwargs) - set(flag_defaults()) - {"func", "command"})
    if unknown:
        raise TypeError(f"train: unknown argument(s) {unknown}; see `hf-tdiag train --help`")
    values.update(kwargs)
    unknown = sorted(set(values) - set(flag_defaults()) - {"func", "command"})
    if unknown:
        raise TypeError(f"train: unknown argument(s) {unknown}; see `hf-tdiag train --help`")
    args = argparse.Namespace(**values)
    validate_args(args)
    return args


# the float arguments and their bounds (low, high); None: unbounded on that side
_FLOAT_BOUNDS = {
    "learning_rate": (0.0, None),
    "weight_decay": (0.0, None),
    "label_smoothing": (0.0, 1.0),
    "warmup_ratio": (0.0, 1.0),
    "train_val_split": (0.0, 1.0),
    "max_grad_norm": (0.0, None),
    "srr_weight": (0.0, None),
    "srr_eps": (1e-12, None),
    "srr_lambda": (None, None),
    "stop_at_train_loss": (0.0, None),
    "hflip": (0.0, 1.0),
    "hidden_dropout_prob": (0.0, 0.999),
}


def parse_srr_layer(spec: str | int) -> str | int:
    """``'last'``, ``'random'``, ``'all'`` or an int block number 1…L (negative counts from the end)."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        return spec
    if isinstance(spec, str):
        if spec in ("last", "random", "all"):
            return spec
        try:
            return int(spec)
        except ValueError:
            pass
    raise ValueError(f"srr_layer: expected a block number, 'last', 'random' or 'all', got {spec!r}")


def validate_args(args: argparse.Namespace) -> None:
    """Raise ValueError/TypeError naming the argument for inconsistent or out-of-range values."""
    if not args.output_dir or not isinstance(args.output_dir, (str, os.PathLike)):
        raise ValueError(f"output_dir: expected a folder path, got {args.output_dir!r}")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise ValueError(f"output_dir: {os.fspath(args.output_dir)!r} is an existing file; expected a folder")
    sources = [n for n in ("dataset_name", "dataset_path", "train_dir") if getattr(args, n)]
    if len(sources) > 1:
        raise ValueError(f"dataset: pass only one of --dataset-name, --dataset-path, --train-dir, got {sources}")
    if args.validation_dir and not args.train_dir:
        raise ValueError("validation_dir: needs --train-dir")
    for name in (
        "num_train_epochs",
        "max_train_steps",
        "per_device_train_batch_size",
        "per_device_eval_batch_size",
        "gradient_accumulation_steps",
        "max_train_samples",
        "max_eval_samples",
        "checkpoints_total_limit",
        "logging_steps",
        "image_size",
        "patch_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_threads",
    ):
        positive_int(getattr(args, name), name, allow_none=True)
    for name, (low, high) in _FLOAT_BOUNDS.items():
        real(getattr(args, name), name, low=low, high=high, allow_none=True)
    non_negative_int(args.num_warmup_steps, "num_warmup_steps", allow_none=True)
    non_negative_int(args.layer_srr_samples, "layer_srr_samples")
    non_negative_int(args.dataloader_num_workers, "dataloader_num_workers")
    if args.optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer: expected one of {list(OPTIMIZERS)}, got {args.optimizer!r}")
    if args.lr_scheduler_type not in SCHEDULERS:
        raise ValueError(f"lr_scheduler_type: expected one of {list(SCHEDULERS)}, got {args.lr_scheduler_type!r}")
    if args.augmentation not in AUGMENTATIONS:
        raise ValueError(f"augmentation: expected one of {list(AUGMENTATIONS)}, got {args.augmentation!r}")
    if args.mixed_precision is not None and args.mixed_precision not in MIXED_PRECISION:
        raise ValueError(f"mixed_precision: expected one of {list(MIXED_PRECISION)}, got {args.mixed_precision!r}")
    args.srr_layer = parse_srr_layer(args.srr_layer)
    from .srr_tracking import parse_every

    args.track_srr_every = parse_every(args.track_srr_every)
    positive_int(args.track_srr_samples, "track_srr_samples")
    cs = args.checkpointing_steps
    if cs is not None:
        if isinstance(cs, int) and not isinstance(cs, bool):
            cs = str(cs)
        if not isinstance(cs, str) or not (cs == "epoch" or (cs.isdigit() and int(cs) > 0)):
            raise ValueError(
                f"checkpointing_steps: expected a positive integer or 'epoch', got {args.checkpointing_steps!r}"
            )
        args.checkpointing_steps = cs
    if args.preset is not None and args.model_name_or_path is not None:
        raise ValueError(
            "preset: pass either --preset (train from scratch) or --model-name-or-path (fine-tune), not both"
        )


__all__ = [
    "build_parser",
    "add_arguments",
    "flag_defaults",
    "make_args",
    "validate_args",
    "is_digits",
    "parse_srr_layer",
]
