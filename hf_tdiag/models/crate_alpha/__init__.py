"""CRATE-α (Yang et al. 2024) as a native Transformers model family.

Classes are imported on first access; ``hf_tdiag`` registers them with the Auto classes when transformers loads
those (see ``hf_tdiag._autoregister``).
"""

from __future__ import annotations

from ..._lazy import lazy_exports

_LAZY = {
    "CRATE_ALPHA_PRESETS": "hf_tdiag.models.crate_alpha.configuration_crate_alpha:CRATE_ALPHA_PRESETS",
    "CrateAlphaConfig": "hf_tdiag.models.crate_alpha.configuration_crate_alpha:CrateAlphaConfig",
    "CrateAlphaImageProcessor": "hf_tdiag.models.crate_alpha.image_processing_crate_alpha:CrateAlphaImageProcessor",
    "CrateAlphaModel": "hf_tdiag.models.crate_alpha.modeling_crate_alpha:CrateAlphaModel",
    "CrateAlphaForImageClassification": (
        "hf_tdiag.models.crate_alpha.modeling_crate_alpha:CrateAlphaForImageClassification"
    ),
    "CrateAlphaPreTrainedModel": "hf_tdiag.models.crate_alpha.modeling_crate_alpha:CrateAlphaPreTrainedModel",
    "convert_official_crate_alpha": "hf_tdiag.models.crate_alpha.convert_official:convert_official_crate_alpha",
}


def register_config() -> None:
    """Register ``crate-alpha`` with ``AutoConfig`` and mark the config for remote code. Idempotent."""
    from transformers.models.auto.configuration_auto import AutoConfig

    from .configuration_crate_alpha import CrateAlphaConfig

    AutoConfig.register(CrateAlphaConfig.model_type, CrateAlphaConfig, exist_ok=True)
    CrateAlphaConfig.register_for_auto_class()


def register_image_processor() -> None:
    """Register ``CrateAlphaImageProcessor`` with ``AutoImageProcessor``. Idempotent."""
    from transformers.models.auto.image_processing_auto import AutoImageProcessor

    from .configuration_crate_alpha import CrateAlphaConfig
    from .image_processing_crate_alpha import CrateAlphaImageProcessor

    AutoImageProcessor.register(
        CrateAlphaConfig, image_processor_classes={"pil": CrateAlphaImageProcessor}, exist_ok=True
    )
    CrateAlphaImageProcessor.register_for_auto_class("AutoImageProcessor")


def register_models() -> None:
    """Register the models with ``AutoModel`` / ``AutoModelForImageClassification`` and mark them. Idempotent."""
    from transformers.models.auto.modeling_auto import AutoModel, AutoModelForImageClassification

    from .configuration_crate_alpha import CrateAlphaConfig
    from .modeling_crate_alpha import CrateAlphaForImageClassification, CrateAlphaModel

    AutoModel.register(CrateAlphaConfig, CrateAlphaModel, exist_ok=True)
    AutoModelForImageClassification.register(CrateAlphaConfig, CrateAlphaForImageClassification, exist_ok=True)
    CrateAlphaModel.register_for_auto_class("AutoModel")
    CrateAlphaForImageClassification.register_for_auto_class("AutoModelForImageClassification")


__getattr__ = lazy_exports(__name__, _LAZY, globals())

__all__ = [*_LAZY, "register_config", "register_image_processor", "register_models"]
