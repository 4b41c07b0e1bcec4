"""``hf-tdiag pretrain ...``: SimDINO or DINO self-supervised pretraining of a ViT-like backbone."""

from __future__ import annotations

import json


def register(subparsers) -> None:
    from .._cli_args import plain
    from ..training.simdino.args import add_arguments

    p = subparsers.add_parser(
        "pretrain",
        help="pretrain a ViT-like backbone by self-distillation: SimDINO's coding-rate loss or DINO's (digits)",
        description=plain(
            "Self-distillation of a student backbone and its EMA teacher on multi-crop views: --objective simdino "
            "(the authors' coding-rate loss, computed by hf_tdiag.measures.coding_rate) or dino (centring, "
            "sharpening and a prototype head). Resumable (--resume-from-checkpoint); the teacher backbone is saved "
            "with save_pretrained and scored by a linear probe on held-out digits at the end. Same flags as "
            "`python -m hf_tdiag.training.simdino`."
        ),
    )
    add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..training.simdino.args import PretrainSettings
    from ..training.simdino.pretrain import pretrain

    names = PretrainSettings.__dataclass_fields__
    results = pretrain(PretrainSettings(**{k: v for k, v in vars(args).items() if k in names}))
    print(json.dumps({k: results[k] for k in ("steps", "probe_accuracy", "runtime_s", "resumed_from") if k in results}))
    return 0
