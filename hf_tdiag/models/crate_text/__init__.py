"""Text CRATE (model type ``crate_text``): masked and causal CRATE language models and the Transformers task heads.

The classes are imported on first access; ``hf_tdiag`` registers them with the Auto classes when transformers loads
those (see ``hf_tdiag._autoregister``).
"""

from __future__ import annotations

from ..._lazy import lazy_exports

_CONFIG = "hf_tdiag.models.crate_text.configuration_crate_text"
_BLOCKS = "hf_tdiag.models.crate_text.modeling_crate_text_blocks"
_MODELING = "hf_tdiag.models.crate_text.modeling_crate_text"
_CONVERT = "hf_tdiag.models.crate_text.convert_official"

# Auto class -> model class name, for registration and for ``register_for_auto_class``
AUTO_CLASSES = {
    "AutoModel": "CrateTextModel",
    "AutoModelForMaskedLM": "CrateTextForMaskedLM",
    "AutoModelForCausalLM": "CrateTextForCausalLM",
    "AutoModelForSequenceClassification": "CrateTextForSequenceClassification",
    "AutoModelForTokenClassification": "CrateTextForTokenClassification",
    "AutoModelForQuestionAnswering": "CrateTextForQuestionAnswering",
    "AutoModelForMultipleChoice": "CrateTextForMultipleChoice",
}

_LAZY = {
    "CrateTextConfig": f"{_CONFIG}:CrateTextConfig",
    "CRATE_TEXT_PRESETS": f"{_CONFIG}:CRATE_TEXT_PRESETS",
    "CRATE_TEXT_BLOCKS": f"{_CONFIG}:CRATE_TEXT_BLOCKS",
    "CrateTextModelOutput": f"{_BLOCKS}:CrateTextModelOutput",
    "CrateTextPreTrainedModel": f"{_BLOCKS}:CrateTextPreTrainedModel",
    **{name: f"{_MODELING}:{name}" for name in AUTO_CLASSES.values()},
    "convert_pr_crate": f"{_CONVERT}:convert_pr_crate",
    "convert_crate_lm": f"{_CONVERT}:convert_crate_lm",
}

_DONE: set[str] = set()


def register_crate_text_config() -> None:
    """Register ``crate_text`` with ``AutoConfig`` and mark the config for ``register_for_auto_class``. Idempotent."""
    if "config" in _DONE:
        return
    from transformers.models.auto.configuration_auto import AutoConfig

    from .configuration_crate_text import CrateTextConfig

    AutoConfig.register(CrateTextConfig.model_type, CrateTextConfig, exist_ok=True)
    CrateTextConfig.register_for_auto_class()
    _DONE.add("config")


def mark_crate_text_models() -> None:
    """``register_for_auto_class`` on every text CRATE class, so ``save_pretrained`` writes an ``auto_map``."""
    from . import modeling_crate_text

    for auto, name in AUTO_CLASSES.items():
        getattr(modeling_crate_text, name).register_for_auto_class(auto)


def register_crate_text_models() -> None:
    """Register the text CRATE classes with their seven Auto classes. Idempotent."""
    if "models" in _DONE:
        return
    import sys

    for name, last in ((_BLOCKS, "CrateTextPreTrainedModel"), (_MODELING, "CrateTextForMultipleChoice")):
        if name in sys.modules and not hasattr(sys.modules[name], last):
            return  # mid-import (its transformers imports loaded the Auto classes): the hook on the modeling module
            # registers once that module has loaded (hf_tdiag._autoregister)
    from transformers.models.auto import modeling_auto

    from . import modeling_crate_text
    from .configuration_crate_text import CrateTextConfig

    for auto, name in AUTO_CLASSES.items():
        getattr(modeling_auto, auto).register(CrateTextConfig, getattr(modeling_crate_text, name), exist_ok=True)
    mark_crate_text_models()
    _DONE.add("models")


def register_crate_text() -> None:
    """Register ``crate_text`` with AutoConfig and the seven Auto model classes. Idempotent."""
    register_crate_text_config()
    register_crate_text_models()


def register_image_processor() -> None:
    """Text models have no image processor (the family interface of ``hf_tdiag._autoregister``)."""


# the family interface of hf_tdiag._autoregister: register_config / register_image_processor / register_models
register_config = register_crate_text_config
register_models = register_crate_text_models

__getattr__ = lazy_exports(__name__, _LAZY, globals())

__all__ = [*_LAZY, "AUTO_CLASSES", "register_crate_text"]
