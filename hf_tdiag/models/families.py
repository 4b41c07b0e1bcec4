"""The model families hf-tdiag ships, declared once, and the one function that registers a family with transformers.

Each :class:`Family` names its classes as ``"module:Class"`` inside its folder ``hf_tdiag/models/<package>/``, so
this module imports neither torch nor transformers. :func:`register` reads an entry to register the family with
``AutoConfig``, its Auto model classes and ``AutoImageProcessor``, and marks each class with
``register_for_auto_class``: ``save_pretrained`` then writes the ``auto_map`` (``"modeling_crate.CrateModel"``, the
entry with a dot) and copies the model files, so a saved folder loads with ``trust_remote_code=True`` where hf-tdiag
is not installed. ``import hf_tdiag`` calls :func:`register_all`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Family:
    """One model family: its ``model_type``, folder, classes (``"module:Class"`` in that folder) and presets."""

    model_type: str
    package: str
    config: str
    models: dict[str, str] = field(default_factory=dict)  # Auto class name -> model class
    image_processor: str | None = None
    presets: str | None = None

    def load(self, target: str) -> Any:
        """The object a ``"module:Class"`` entry of this family names (imports its module)."""
        module, name = target.split(":")
        return getattr(importlib.import_module(f"hf_tdiag.models.{self.package}.{module}"), name)

    def exports(self) -> dict[str, str]:
        """Public name -> ``"hf_tdiag.models.<package>.module:Class"`` of the config, processor and model classes."""
        targets = [self.config, *self.models.values(), *([self.image_processor] if self.image_processor else [])]
        return {t.split(":")[1]: f"hf_tdiag.models.{self.package}.{t}" for t in targets}


FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        Family(
            model_type="crate",
            package="crate",
            config="configuration_crate:CrateConfig",
            models={
                "AutoModel": "modeling_crate:CrateModel",
                "AutoModelForImageClassification": "modeling_crate:CrateForImageClassification",
            },
            image_processor="image_processing_crate:CrateImageProcessor",
            presets="configuration_crate:CRATE_PRESETS",
        ),
        Family(
            model_type="crate-alpha",
            package="crate_alpha",
            config="configuration_crate_alpha:CrateAlphaConfig",
            models={
                "AutoModel": "modeling_crate_alpha:CrateAlphaModel",
                "AutoModelForImageClassification": "modeling_crate_alpha:CrateAlphaForImageClassification",
            },
            image_processor="image_processing_crate_alpha:CrateAlphaImageProcessor",
            presets="configuration_crate_alpha:CRATE_ALPHA_PRESETS",
        ),
        Family(
            model_type="tost",
            package="tost",
            config="configuration_tost:TostConfig",
            models={
                "AutoModel": "modeling_tost:TostModel",
                "AutoModelForImageClassification": "modeling_tost:TostForImageClassification",
            },
            image_processor="image_processing_tost:TostImageProcessor",
            presets="configuration_tost:TOST_PRESETS",
        ),
        Family(
            model_type="crate-mae",
            package="crate_mae",
            config="configuration_crate_mae:CrateMAEConfig",
            models={
                "AutoModel": "modeling_crate_mae:CrateMAEModel",
                "AutoModelForPreTraining": "modeling_crate_mae:CrateMAEForPreTraining",
                "AutoModelForImageClassification": "modeling_crate_mae:CrateMAEForImageClassification",
            },
            image_processor="image_processing_crate_mae:CrateMAEImageProcessor",
            presets="configuration_crate_mae:CRATE_MAE_PRESETS",
        ),
        Family(
            model_type="crate_text",
            package="crate_text",
            config="configuration_crate_text:CrateTextConfig",
            models={
                "AutoModel": "modeling_crate_text:CrateTextModel",
                "AutoModelForMaskedLM": "modeling_crate_text:CrateTextForMaskedLM",
                "AutoModelForCausalLM": "modeling_crate_text:CrateTextForCausalLM",
                "AutoModelForSequenceClassification": "modeling_crate_text:CrateTextForSequenceClassification",
                "AutoModelForTokenClassification": "modeling_crate_text:CrateTextForTokenClassification",
                "AutoModelForQuestionAnswering": "modeling_crate_text:CrateTextForQuestionAnswering",
                "AutoModelForMultipleChoice": "modeling_crate_text:CrateTextForMultipleChoice",
            },
            presets="configuration_crate_text:CRATE_TEXT_PRESETS",
        ),
        Family(
            model_type="aot",
            package="aot",
            config="configuration_aot:AotConfig",
            models={
                "AutoModel": "modeling_aot:AotModel",
                "AutoModelForImageClassification": "modeling_aot:AotForImageClassification",
            },
            image_processor="image_processing_aot:AotImageProcessor",
            presets="configuration_aot:AOT_PRESETS",
        ),
        Family(
            model_type="aot_text",
            package="aot",
            config="configuration_aot:AotTextConfig",
            models={
                "AutoModel": "modeling_aot_text:AotTextModel",
                "AutoModelForCausalLM": "modeling_aot_text:AotForCausalLM",
            },
            presets="configuration_aot:AOT_TEXT_PRESETS",
        ),
    )
}

_REGISTERED: set[str] = set()


def register(model_type: str) -> None:
    """Register one family with transformers' Auto classes and mark its classes for remote code. Idempotent.

    Registering a model type again replaces its classes (transformers refuses only its own model types: a family
    named like one of them fails here instead of replacing transformers' classes)."""
    if model_type in _REGISTERED:
        return
    family = FAMILIES.get(model_type)
    if family is None:
        raise ValueError(f"register: unknown model type {model_type!r}; hf-tdiag's families are {list(FAMILIES)}")
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import AutoConfig

    config = family.load(family.config)
    AutoConfig.register(model_type, config)
    config.register_for_auto_class()
    if family.image_processor is not None:
        from transformers.models.auto.image_processing_auto import AutoImageProcessor
        from transformers.models.auto.video_processing_auto import AutoVideoProcessor

        processor = family.load(family.image_processor)
        AutoImageProcessor.register(config, image_processor_classes={"pil": processor})
        processor.register_for_auto_class("AutoImageProcessor")
        # and as having no video processor: else pipeline() looks for one, guesses a class from the image
        # processor's auto_map and asks whether to run remote code, although the family is registered here
        AutoVideoProcessor.register(config, video_processor_classes={})
    for auto, target in family.models.items():
        model = family.load(target)
        getattr(modeling_auto, auto).register(config, model)
        model.register_for_auto_class(auto)
    _REGISTERED.add(model_type)


def register_all() -> None:
    """Register every family of :data:`FAMILIES`, and the image pipelines that read the image families' inputs as
    every other entry point does (:mod:`hf_tdiag.image_pipeline`). Idempotent."""
    for model_type in FAMILIES:
        register(model_type)
    from ..image_pipeline import register as register_image_pipelines

    register_image_pipelines()
