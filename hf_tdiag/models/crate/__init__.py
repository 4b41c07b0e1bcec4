"""CRATE (Coding RAte reduction TransformEr) as a native Transformers model family.

The classes are imported on first access (``from hf_tdiag.models.crate import CrateConfig``), so that importing
the package stays cheap; ``hf_tdiag`` registers them with the Auto classes when transformers loads those
(see ``hf_tdiag._autoregister``).
"""

from __future__ import annotations

from ..._lazy import lazy_exports

_LAZY = {
    "CRATE_PRESETS": "hf_tdiag.models.crate.configuration_crate:CRATE_PRESETS",
    "CRATE_VARIANTS": "hf_tdiag.models.crate.configuration_crate:CRATE_VARIANTS",
    "CrateConfig": "hf_tdiag.models.crate.configuration_crate:CrateConfig",
    "size_pair": "hf_tdiag.models.crate.configuration_crate:size_pair",
    "CrateImageProcessor": "hf_tdiag.models.crate.image_processing_crate:CrateImageProcessor",
    "CrateModel": "hf_tdiag.models.crate.modeling_crate:CrateModel",
    "CrateForImageClassification": "hf_tdiag.models.crate.modeling_crate:CrateForImageClassification",
    "CrateModelOutput": "hf_tdiag.models.crate.modeling_crate:CrateModelOutput",
    "CrateImageClassifierOutput": "hf_tdiag.models.crate.modeling_crate:CrateImageClassifierOutput",
    "CratePreTrainedModel": "hf_tdiag.models.crate.modeling_crate:CratePreTrainedModel",
    "convert_official_crate": "hf_tdiag.models.crate.convert_official:convert_official_crate",
}

_DONE: set[str] = set()


def register_crate_config() -> None:
    """Register ``crate`` with ``AutoConfig`` (and mark the config for ``register_for_auto_class``). Idempotent."""
    if "config" in _DONE:
        return
    from transformers.models.auto.configuration_auto import AutoConfig

    from .configuration_crate import CrateConfig

    AutoConfig.register(CrateConfig.model_type, CrateConfig, exist_ok=True)
    CrateConfig.register_for_auto_class()
    _DONE.add("config")


def register_crate_image_processor() -> None:
    """Register ``CrateImageProcessor`` with ``AutoImageProcessor``. Idempotent."""
    if "image_processor" in _DONE:
        return
    from transformers.models.auto.image_processing_auto import AutoImageProcessor

    from .configuration_crate import CrateConfig
    from .image_processing_crate import CrateImageProcessor

    AutoImageProcessor.register(CrateConfig, image_processor_classes={"pil": CrateImageProcessor}, exist_ok=True)
    CrateImageProcessor.register_for_auto_class("AutoImageProcessor")
    _DONE.add("image_processor")


def register_crate_no_video_processor() -> None:
    """Tell ``AutoVideoProcessor`` that CRATE has no video processor (an empty backend table). Idempotent.

    Without it, ``pipeline()`` probes for a video processor, guesses ``CrateVideoProcessor`` from the image
    processor's ``auto_map`` and asks whether to run remote code, although the model type is registered natively.
    """
    if "video_processor" in _DONE:
        return
    from transformers.models.auto.video_processing_auto import AutoVideoProcessor

    from .configuration_crate import CrateConfig

    AutoVideoProcessor.register(CrateConfig, video_processor_classes={}, exist_ok=True)
    _DONE.add("video_processor")


def register_crate_models() -> None:
    """Register the CRATE models with ``AutoModel`` and ``AutoModelForImageClassification``. Idempotent."""
    if "models" in _DONE:
        return
    from transformers.models.auto.modeling_auto import AutoModel, AutoModelForImageClassification

    from .configuration_crate import CrateConfig
    from .modeling_crate import CrateForImageClassification, CrateModel

    AutoModel.register(CrateConfig, CrateModel, exist_ok=True)
    AutoModelForImageClassification.register(CrateConfig, CrateForImageClassification, exist_ok=True)
    CrateModel.register_for_auto_class("AutoModel")
    CrateForImageClassification.register_for_auto_class("AutoModelForImageClassification")
    _DONE.add("models")


def register_crate() -> None:
    """Register ``crate`` with AutoConfig/AutoModel/AutoModelForImageClassification/AutoImageProcessor.

    Also marks the classes for ``register_for_auto_class`` so that ``save_pretrained`` writes an ``auto_map`` and
    copies the model files, letting the folder load with ``trust_remote_code=True`` where hf_tdiag is absent.
    Idempotent.
    """
    register_crate_config()
    register_crate_image_processor()
    register_crate_no_video_processor()
    register_crate_models()


__getattr__ = lazy_exports(__name__, _LAZY, globals())

__all__ = [*_LAZY, "register_crate"]
