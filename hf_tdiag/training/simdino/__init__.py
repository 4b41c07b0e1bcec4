"""SimDINO (coding-rate self-distillation, Wu et al. 2025) and DINO pretraining of Transformers ViT-like backbones.

Names load on first use (the command line reads :mod:`.args` to build ``hf-tdiag pretrain --help`` without torch).
"""

from __future__ import annotations

from ..._lazy import lazy_exports as _lazy_exports

_LAZY = {
    "PretrainSettings": "hf_tdiag.training.simdino.args:PretrainSettings",
    "add_arguments": "hf_tdiag.training.simdino.args:add_arguments",
    "build_parser": "hf_tdiag.training.simdino.args:build_parser",
    "parse_settings": "hf_tdiag.training.simdino.args:parse_settings",
    "ProjectionHead": "hf_tdiag.training.simdino.heads:ProjectionHead",
    "PrototypeHead": "hf_tdiag.training.simdino.heads:PrototypeHead",
    "DINOLoss": "hf_tdiag.training.simdino.loss:DINOLoss",
    "SimDINOLoss": "hf_tdiag.training.simdino.loss:SimDINOLoss",
    "SelfDistillation": "hf_tdiag.training.simdino.model:SelfDistillation",
    "backbone_features": "hf_tdiag.training.simdino.model:backbone_features",
    "cosine_schedule": "hf_tdiag.training.simdino.model:cosine_schedule",
    "ema_update": "hf_tdiag.training.simdino.model:ema_update",
    "pretrain": "hf_tdiag.training.simdino.pretrain:pretrain",
    "MultiCrop": "hf_tdiag.training.simdino.views:MultiCrop",
}

__getattr__ = _lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
