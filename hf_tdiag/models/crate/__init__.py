"""CRATE (Coding RAte reduction TransformEr) as a native Transformers model family."""

from __future__ import annotations

from .configuration_crate import CRATE_PRESETS, CRATE_VARIANTS, CrateConfig
from .image_processing_crate import CrateImageProcessor
from .modeling_crate import (
    CrateForImageClassification,
    CrateImageClassifierOutput,
    CrateModel,
    CrateModelOutput,
    CratePreTrainedModel,
)

_REGISTERED = False


def register_crate() -> None:
    """Register ``crate`` with AutoConfig/AutoModel/AutoModelForImageClassification/AutoImageProcessor.

    Also marks the classes for ``register_for_auto_class`` so that ``save_pretrained`` writes an ``auto_map`` and
    copies the model files, letting the folder load with ``trust_remote_code=True`` where hf_tdiag is absent.
    Idempotent.
    """
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import (
        AutoConfig,
        AutoImageProcessor,
        AutoModel,
        AutoModelForImageClassification,
    )

    AutoConfig.register(CrateConfig.model_type, CrateConfig, exist_ok=True)
    AutoModel.register(CrateConfig, CrateModel, exist_ok=True)
    AutoModelForImageClassification.register(CrateConfig, CrateForImageClassification, exist_ok=True)
    AutoImageProcessor.register(CrateConfig, image_processor_classes={"pil": CrateImageProcessor}, exist_ok=True)
    CrateConfig.register_for_auto_class()
    CrateModel.register_for_auto_class("AutoModel")
    CrateForImageClassification.register_for_auto_class("AutoModelForImageClassification")
    CrateImageProcessor.register_for_auto_class("AutoImageProcessor")
    _REGISTERED = True


def __getattr__(name: str):
    if name == "convert_official_crate":
        from .convert_official import convert_official_crate

        return convert_official_crate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CRATE_PRESETS",
    "CRATE_VARIANTS",
    "CrateConfig",
    "CrateModel",
    "CrateForImageClassification",
    "CrateImageProcessor",
    "CrateModelOutput",
    "CrateImageClassifierOutput",
    "CratePreTrainedModel",
    "register_crate",
    "convert_official_crate",
]
