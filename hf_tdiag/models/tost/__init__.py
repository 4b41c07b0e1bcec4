"""ToST (Token Statistics Transformer, Wu et al. 2025) as a native Transformers model family.

Classes are imported on first access; ``hf_tdiag`` registers them with the Auto classes when transformers loads
those (see ``hf_tdiag._autoregister``).
"""

from __future__ import annotations

from ..._lazy import lazy_exports

_LAZY = {
    "TOST_PRESETS": "hf_tdiag.models.tost.configuration_tost:TOST_PRESETS",
    "TostConfig": "hf_tdiag.models.tost.configuration_tost:TostConfig",
    "TostImageProcessor": "hf_tdiag.models.tost.image_processing_tost:TostImageProcessor",
    "TostModel": "hf_tdiag.models.tost.modeling_tost:TostModel",
    "TostForImageClassification": "hf_tdiag.models.tost.modeling_tost:TostForImageClassification",
    "TostPreTrainedModel": "hf_tdiag.models.tost.modeling_tost:TostPreTrainedModel",
    "token_statistics_attention": "hf_tdiag.models.tost.modeling_tost:token_statistics_attention",
}


def register_config() -> None:
    """Register ``tost`` with ``AutoConfig`` and mark the config for remote code. Idempotent."""
    from transformers.models.auto.configuration_auto import AutoConfig

    from .configuration_tost import TostConfig

    AutoConfig.register(TostConfig.model_type, TostConfig, exist_ok=True)
    TostConfig.register_for_auto_class()


def register_image_processor() -> None:
    """Register ``TostImageProcessor`` with ``AutoImageProcessor``. Idempotent."""
    from transformers.models.auto.image_processing_auto import AutoImageProcessor

    from .configuration_tost import TostConfig
    from .image_processing_tost import TostImageProcessor

    AutoImageProcessor.register(TostConfig, image_processor_classes={"pil": TostImageProcessor}, exist_ok=True)
    TostImageProcessor.register_for_auto_class("AutoImageProcessor")


def register_models() -> None:
    """Register the models with ``AutoModel`` / ``AutoModelForImageClassification`` and mark them. Idempotent."""
    from transformers.models.auto.modeling_auto import AutoModel, AutoModelForImageClassification

    from .configuration_tost import TostConfig
    from .modeling_tost import TostForImageClassification, TostModel

    AutoModel.register(TostConfig, TostModel, exist_ok=True)
    AutoModelForImageClassification.register(TostConfig, TostForImageClassification, exist_ok=True)
    TostModel.register_for_auto_class("AutoModel")
    TostForImageClassification.register_for_auto_class("AutoModelForImageClassification")


__getattr__ = lazy_exports(__name__, _LAZY, globals())

__all__ = [*_LAZY, "register_config", "register_image_processor", "register_models"]
