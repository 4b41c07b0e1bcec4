"""Settings of SimDINO / DINO pretraining: one dataclass, its command-line flags derived from the fields (hyphenated,
help from each field's metadata), checked in ``__post_init__``."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import MISSING, asdict, dataclass, field, fields

from ..._validation import non_negative_int, positive_float, positive_int, real

OBJECTIVES = ("simdino", "dino")
BACKBONES = ("crate-digits", "vit-digits")


def _h(text: str, default=MISSING):
    return field(default=default, metadata={"help": text})


@dataclass
class PretrainSettings:
    output_dir: str = _h("Folder for checkpoints, the pretrained backbone (backbone/) and pretrain_results.json.")
    overwrite_output_dir: bool = _h(
        "Replace an earlier run's backbone, results and checkpoints in --output-dir (only files an hf-tdiag run "
        "recorded writing there; a user's files stay); default: refuse such a folder. Resuming from a checkpoint of "
        "the folder needs no flag.",
        False,
    )
    objective: str = _h("simdino (coding-rate loss) or dino (centring + sharpening + prototypes).", "simdino")
    backbone: str = _h(
        "crate-digits, vit-digits (ViT of matched size) or a local Transformers model folder.", "crate-digits"
    )
    max_train_steps: int = _h("Optimizer steps.", 300)
    batch_size: int = _h("Images per step (each gives n_global + n_local views).", 64)
    learning_rate: float = _h("Peak learning rate (after linear warmup, cosine to --min-lr).", 1e-3)
    min_lr: float = _h("Final learning rate.", 1e-6)
    warmup_steps: int = _h("Linear learning-rate warmup steps.", 30)
    weight_decay: float = _h("Initial weight decay (cosine schedule to --weight-decay-end, the authors').", 0.04)
    weight_decay_end: float = _h("Final weight decay.", 0.4)
    max_grad_norm: float = _h("Gradient clipping of the student (0 disables; the authors' 3.0).", 3.0)
    momentum_teacher: float = _h("Initial EMA momentum of the teacher (cosine schedule to 1).", 0.996)
    n_global: int = _h("Global crops (the teacher sees these).", 2)
    n_local: int = _h("Local crops (student only).", 4)
    global_scale: tuple = _h("Area fraction range of global crops.", (0.4, 1.0))
    local_scale: tuple = _h("Area fraction range of local crops.", (0.1, 0.4))
    hflip: float = _h("Horizontal flip probability of each view (0 for digits).", 0.0)
    hidden_dim: int = _h("Hidden width of the projection head MLP (the authors' 2048).", 256)
    bottleneck_dim: int = _h("Output width p of the projection head (the authors' 256).", 64)
    head_layers: int = _h("Linear layers of the projection head.", 3)
    eps: float = _h("SimDINO: epsilon of R_eps (the authors' --eps is epsilon squared: 0.5 -> 0.7071).", math.sqrt(0.5))
    gamma: float = _h("SimDINO: weight of the coding rate (default: the authors' (p+m)/(p*m)).", None)
    coeff: float = _h("SimDINO: weight of the cosine-similarity term.", 1.0)
    expansion: str = _h("SimDINO: coding rate of the student/teacher 'mean' per global view or the 'student's.", "mean")
    out_dim: int = _h("DINO: number of prototypes.", 256)
    teacher_temp: float = _h("DINO: teacher temperature (after warmup).", 0.04)
    warmup_teacher_temp: float = _h("DINO: initial teacher temperature.", 0.04)
    warmup_teacher_temp_steps: int = _h("DINO: linear teacher-temperature warmup steps.", 0)
    student_temp: float = _h("DINO: student temperature.", 0.1)
    center_momentum: float = _h("DINO: EMA momentum of the centre.", 0.9)
    freeze_last_layer_steps: int = _h("DINO: steps during which the prototypes get no update.", 0)
    seed: int = _h("Seed of the initialisation, data order and crops.", 0)
    track_every: int = _h("Record the teacher's held-out feature rate and rank every N steps (0: off).", 25)
    track_samples: int = _h("Held-out images used by --track-every.", 256)
    checkpointing_steps: int = _h("Save a resumable checkpoint every N steps (0: only none).", 0)
    checkpoints_total_limit: int = _h("Keep the last K checkpoints.", 2)
    resume_from_checkpoint: str = _h("A checkpoint folder or 'latest'.", None)
    probe: bool = _h("Fit a linear probe on the frozen teacher backbone's features at the end.", True)

    def __post_init__(self):
        if not self.output_dir or not isinstance(self.output_dir, (str, os.PathLike)):
            raise ValueError(f"output_dir: expected a folder path, got {self.output_dir!r}")
        if not isinstance(self.overwrite_output_dir, bool):
            raise TypeError(f"overwrite_output_dir: expected True or False, got {self.overwrite_output_dir!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective: expected one of {list(OBJECTIVES)}, got {self.objective!r}")
        if self.expansion not in ("mean", "student"):
            raise ValueError(f"expansion: expected 'mean' or 'student', got {self.expansion!r}")
        for name in ("max_train_steps", "batch_size", "n_global", "hidden_dim", "bottleneck_dim", "head_layers"):
            positive_int(getattr(self, name), name)
        for name in ("n_local", "warmup_steps", "warmup_teacher_temp_steps", "freeze_last_layer_steps", "track_every"):
            non_negative_int(getattr(self, name), name)
        for name in ("checkpointing_steps", "track_samples", "checkpoints_total_limit", "out_dim"):
            non_negative_int(getattr(self, name), name)
        if self.warmup_steps > self.max_train_steps:
            raise ValueError(f"warmup_steps: {self.warmup_steps} exceeds --max-train-steps {self.max_train_steps}")
        for name in ("learning_rate", "eps", "teacher_temp", "warmup_teacher_temp", "student_temp"):
            positive_float(getattr(self, name), name)
        for name in ("momentum_teacher", "center_momentum", "hflip"):
            real(getattr(self, name), name, low=0.0, high=1.0)
        self.global_scale, self.local_scale = tuple(self.global_scale), tuple(self.local_scale)

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """One hyphenated flag per :class:`PretrainSettings` field (``--output-dir`` required)."""
    from ..._cli_args import ArgumentParser  # underscore spellings of the flags accepted, as everywhere

    parser = ArgumentParser(prog=prog, description="SimDINO / DINO self-supervised pretraining (digits).")
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one hyphenated flag per :class:`PretrainSettings` field to ``parser``."""
    for f in fields(PretrainSettings):
        flag = "--" + f.name.replace("_", "-")
        kwargs = {"dest": f.name, "help": f.metadata["help"]}
        if f.default is MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = f.default
        if isinstance(f.default, tuple):
            kwargs.update(nargs=2, type=float, metavar=("LOW", "HIGH"))
        elif f.default is False:  # a switch, off unless given (--overwrite-output-dir)
            kwargs["action"] = "store_true"
        elif isinstance(f.default, bool):
            kwargs["type"] = _bool
        elif isinstance(f.default, int):
            kwargs["type"] = int
        elif isinstance(f.default, float) or f.name == "gamma":
            kwargs["type"] = float
        parser.add_argument(flag, **kwargs)


def parse_settings(argv=None) -> PretrainSettings:
    """:class:`PretrainSettings` from a command line."""
    return PretrainSettings(**vars(build_parser("python -m hf_tdiag.training.simdino").parse_args(argv)))


__all__ = ["PretrainSettings", "add_arguments", "build_parser", "parse_settings", "OBJECTIVES", "BACKBONES"]
