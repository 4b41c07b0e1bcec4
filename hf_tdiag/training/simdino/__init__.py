"""SimDINO (coding-rate self-distillation, Wu et al. 2025) and DINO pretraining of Transformers ViT-like backbones."""

from .args import PretrainSettings, build_parser, parse_settings
from .heads import ProjectionHead, PrototypeHead
from .loss import DINOLoss, SimDINOLoss
from .model import SelfDistillation, backbone_features, cosine_schedule, ema_update
from .pretrain import pretrain
from .views import MultiCrop

__all__ = [
    "PretrainSettings",
    "build_parser",
    "parse_settings",
    "ProjectionHead",
    "PrototypeHead",
    "DINOLoss",
    "SimDINOLoss",
    "SelfDistillation",
    "backbone_features",
    "cosine_schedule",
    "ema_update",
    "pretrain",
    "MultiCrop",
]
