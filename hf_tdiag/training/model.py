"""Build the CRATE classifier and its image processor from the trainer arguments and the data."""

from __future__ import annotations

from .._model_limits import check_training_size
from ..models.crate import CRATE_PRESETS, CrateConfig, CrateForImageClassification, CrateImageProcessor, size_pair

_OVERRIDES = (
    "image_size",
    "patch_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "pooling",
    "hidden_dropout_prob",
)


def default_preset(raw) -> str:
    """``crate-digits`` for the digits data, ``crate-32`` for images up to 32 px, else ``crate-tiny``."""
    if raw.is_digits:
        return "crate-digits"
    if max(raw.image_size) <= 32:
        return "crate-32"
    return "crate-tiny"


def build_model_and_processor(args, raw):
    """``(model, processor, preset)``: a new CRATE from ``--preset`` (+ overrides) or ``--model_name_or_path``."""
    id2label = {i: name for i, name in enumerate(raw.labels)}
    label2id = {name: i for i, name in id2label.items()}
    if args.model_name_or_path:
        from transformers import AutoModelForImageClassification

        from ..loading import load_config, load_image_processor, load_pretrained

        overrides = {k: getattr(args, k) for k in ("pooling", "hidden_dropout_prob") if getattr(args, k) is not None}
        if args.variant is not None:
            overrides["variant"] = args.variant
        trust, flag = bool(args.trust_remote_code), "model_name_or_path"
        config = load_config(args.model_name_or_path, trust_remote_code=trust, name=flag)
        config.update({"num_labels": len(raw.labels), "id2label": id2label, "label2id": label2id, **overrides})
        if getattr(config, "model_type", None) != "crate":
            raise ValueError(
                f"model_name_or_path: expected a CRATE checkpoint (model_type 'crate'), got {config.model_type!r}"
            )
        model = load_pretrained(
            args.model_name_or_path,
            AutoModelForImageClassification,
            config=config,
            trust_remote_code=trust,
            name=flag,
            ignore_mismatched_sizes=args.ignore_mismatched_sizes,
        )
        processor = load_image_processor(args.model_name_or_path, trust_remote_code=trust)
        processor = processor or CrateImageProcessor.for_config(model.config)
        return model, processor, None
    preset = args.preset or default_preset(raw)
    if preset not in CRATE_PRESETS:
        raise ValueError(f"preset: expected one of {list(CRATE_PRESETS)}, got {preset!r}")
    overrides = {k: getattr(args, k) for k in _OVERRIDES if getattr(args, k) is not None}
    if "hidden_size" in overrides or "num_attention_heads" in overrides:
        hidden = overrides.get("hidden_size", CRATE_PRESETS[preset]["hidden_size"])
        heads = overrides.get("num_attention_heads", CRATE_PRESETS[preset]["num_attention_heads"])
        if hidden % heads:
            raise ValueError(f"hidden_size: {hidden} must be divisible by num_attention_heads={heads}")
    config = CrateConfig.from_preset(
        preset,
        num_channels=raw.num_channels,
        variant=args.variant or "crate",
        num_labels=len(raw.labels),
        id2label=id2label,
        label2id=label2id,
        **overrides,
    )
    check_training_size(CrateForImageClassification, config, args.per_device_train_batch_size)  # before allocating
    model = CrateForImageClassification(config)
    processor = CrateImageProcessor.for_config(config)
    return model, processor, preset


def image_size_of(config) -> tuple[int, int]:
    """``(height, width)`` of the model's input images."""
    return size_pair(config.image_size, "image_size")


__all__ = ["default_preset", "build_model_and_processor", "image_size_of"]
