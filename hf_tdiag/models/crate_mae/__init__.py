"""CRATE-MAE (Pai et al., ICLR 2024) as a native Transformers model family.

Classes are imported on first access; ``hf_tdiag`` registers them with the Auto classes when transformers loads
those (see ``hf_tdiag._autoregister``).
"""

from __future__ import annotations

from ..._lazy import lazy_exports

_LAZY = {
    "CRATE_MAE_PRESETS": "hf_tdiag.models.crate_mae.configuration_crate_mae:CRATE_MAE_PRESETS",
    "CrateMAEConfig": "hf_tdiag.models.crate_mae.configuration_crate_mae:CrateMAEConfig",
    "CrateMAEImageProcessor": "hf_tdiag.models.crate_mae.image_processing_crate_mae:CrateMAEImageProcessor",
    "CrateMAEModel": "hf_tdiag.models.crate_mae.modeling_crate_mae:CrateMAEModel",
    "CrateMAEForPreTraining": "hf_tdiag.models.crate_mae.modeling_crate_mae:CrateMAEForPreTraining",
    "CrateMAEForImageClassification": "hf_tdiag.models.crate_mae.modeling_crate_mae:CrateMAEForImageClassification",
    "CrateMAEPreTrainedModel": "hf_tdiag.models.crate_mae.modeling_crate_mae:CrateMAEPreTrainedModel",
    "convert_official_crate_mae": "hf_tdiag.models.crate_mae.convert_official:convert_official_crate_mae",
}


def register_config() -> None:
    """Register ``crate-mae`` with ``AutoConfig`` and mark the config for remote code. Idempotent."""
    from transformers.models.auto.configuration_auto import AutoConfig

    from .configuration_crate_mae import CrateMAEConfig

    AutoConfig.register(CrateMAEConfig.model_type, CrateMAEConfig, exist_ok=True)
    CrateMAEConfig.register_for_auto_class()


def register_image_processor() -> None:
    """Register ``CrateMAEImageProcessor`` with ``AutoImageProcessor``. Idempotent."""
    from transformers.models.auto.image_processing_auto import AutoImageProcessor

    from .configuration_crate_mae import CrateMAEConfig
    from .image_processing_crate_mae import CrateMAEImageProcessor

    AutoImageProcessor.register(CrateMAEConfig, image_processor_classes={"pil": CrateMAEImageProcessor}, exist_ok=True)
    CrateMAEImageProcessor.register_for_auto_class("AutoImageProcessor")


def register_models() -> None:
    """Register with ``AutoModel`` / ``AutoModelForPreTraining`` / ``AutoModelForImageClassification``. Idempotent."""
    from transformers.models.auto.modeling_auto import (
        AutoModel,
        AutoModelForImageClassification,
        AutoModelForPreTraining,
    )

    from .configuration_crate_mae import CrateMAEConfig
    from .modeling_crate_mae import CrateMAEForImageClassification, CrateMAEForPreTraining, CrateMAEModel

    for auto, cls in ((AutoModel, CrateMAEModel), (AutoModelForPreTraining, CrateMAEForPreTraining),
                      (AutoModelForImageClassification, CrateMAEForImageClassification)):  # fmt: skip
        auto.register(CrateMAEConfig, cls, exist_ok=True)
        cls.register_for_auto_class(auto.__name__)


__getattr__ = lazy_exports(__name__, _LAZY, globals())

__all__ = [*_LAZY, "register_config", "register_image_processor", "register_models"]
