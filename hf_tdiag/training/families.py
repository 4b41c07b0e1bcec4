"""The white-box families beyond CRATE in the trainer: CRATE-α, ToST and AoT image classifiers, chosen by their
preset names (``--preset crate-alpha-digits``, ``--preset tost-digits``, ``--preset aot-digits``, any size of
:data:`CRATE_ALPHA_PRESETS` / :data:`TOST_PRESETS` / :data:`AOT_PRESETS`) or by the ``model_type`` of a checkpoint given as ``--model-name-or-path``.

CRATE's own path stays in :mod:`hf_tdiag.training.model`; this module only builds the other families' configs,
models and image processors from the same arguments (the preset's sizes, the command line's overrides, the data's
channels and labels).
"""

from __future__ import annotations

#: model types the trainer builds or fine-tunes (CRATE's is handled by hf_tdiag.training.model)
TRAINABLE_MODEL_TYPES = ("crate", "crate-alpha", "tost", "aot")

# command-line overrides a family's config takes when it has the field
_OVERRIDES = ("image_size", "patch_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "pooling",
              "hidden_dropout_prob")  # fmt: skip


def _classes(family: str):
    """``(config class, model class, image-processor class)`` of ``family``."""
    if family == "aot":
        from ..models.aot import AotConfig, AotForImageClassification, AotImageProcessor

        return AotConfig, AotForImageClassification, AotImageProcessor
    if family == "crate-alpha":
        from ..models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification, CrateAlphaImageProcessor

        return CrateAlphaConfig, CrateAlphaForImageClassification, CrateAlphaImageProcessor
    from ..models.tost import TostConfig, TostForImageClassification, TostImageProcessor

    return TostConfig, TostForImageClassification, TostImageProcessor


def family_of_preset(preset: str | None) -> str | None:
    """``"crate-alpha"``, ``"tost"`` or ``"aot"`` when ``preset`` names one of their sizes, else ``None`` (CRATE or
    unknown)."""
    from ..models.aot.configuration_aot import AOT_PRESETS
    from ..models.crate_alpha.configuration_crate_alpha import CRATE_ALPHA_PRESETS
    from ..models.tost.configuration_tost import TOST_PRESETS

    if preset in CRATE_ALPHA_PRESETS:
        return "crate-alpha"
    if preset in TOST_PRESETS:
        return "tost"
    if preset in AOT_PRESETS:
        return "aot"
    return None


def architecture_name(config) -> str:
    """What the logs and results call the architecture: CRATE's variant (``crate``, ``crate-c``, ...), else the
    model type (``crate-alpha``, ``tost``)."""
    return str(getattr(config, "variant", None) or config.model_type)


def _no_variant(args, family: str) -> None:
    if getattr(args, "variant", None) is not None:
        raise ValueError(
            f"variant: --variant chooses CRATE's MSSA output matrix; a {family} model has no such variant "
            f"(got --variant {args.variant})"
        )


def build_family_model(family: str, preset: str, args, raw, id2label: dict, label2id: dict):
    """``(model, processor, preset)``: a new ``family`` classifier from ``preset`` plus the command line's
    overrides (those its config has; another one is refused, naming it)."""
    _no_variant(args, family)
    config_class, model_class, processor_class = _classes(family)
    fields = config_class().to_dict()
    overrides = {k: getattr(args, k) for k in _OVERRIDES if getattr(args, k, None) is not None}
    unknown = sorted(k for k in overrides if k not in fields)
    if unknown:
        flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
        raise ValueError(f"preset: {flags} cannot be set for a {family} model (its config has no such field)")
    config = config_class.from_preset(preset, num_channels=raw.num_channels, num_labels=len(raw.labels), **overrides)
    config.id2label, config.label2id = id2label, label2id
    return model_class(config), processor_class.for_config(config), preset


def family_processor(config):
    """The image processor matching a loaded checkpoint's ``config`` (CRATE-α, ToST)."""
    return _classes(config.model_type)[2].for_config(config)


def check_trainable(config, flag: str = "model_name_or_path") -> None:
    """A ValueError naming ``flag`` unless ``config`` is of a model type the trainer trains."""
    model_type = getattr(config, "model_type", None)
    if model_type not in TRAINABLE_MODEL_TYPES:
        raise ValueError(
            f"{flag}: expected a CRATE, CRATE-α, ToST or AoT checkpoint (model_type one of {list(TRAINABLE_MODEL_TYPES)}), "
            f"got {model_type!r}"
        )


__all__ = [
    "TRAINABLE_MODEL_TYPES",
    "architecture_name",
    "build_family_model",
    "check_trainable",
    "family_of_preset",
    "family_processor",
]
