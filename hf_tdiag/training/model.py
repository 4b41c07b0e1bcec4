"""Build the CRATE classifier (or, from their presets or checkpoints, a CRATE-α or ToST one:
:mod:`hf_tdiag.training.families`) and its image processor from the trainer arguments and the data."""

from __future__ import annotations

from .._model_limits import check_training_size
from ..models.crate import CRATE_PRESETS, CrateConfig, CrateForImageClassification, CrateImageProcessor, size_pair
from .families import build_family_model, check_trainable, family_of_preset, family_processor

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
    from .._validation import check_unique_labels

    id2label = dict(enumerate(check_unique_labels(raw.labels, "labels (the dataset's class names)")))
    label2id = {name: i for i, name in id2label.items()}
    if args.model_name_or_path:
        return (*_load_pretrained(args, raw, id2label, label2id), None)
    preset = args.preset or default_preset(raw)
    family = family_of_preset(preset)  # CRATE-α, ToST and AoT presets build those families (training/families.py)
    if family is not None:
        return build_family_model(family, preset, args, raw, id2label, label2id)
    return (*_new_crate(preset, args, raw, id2label, label2id), preset)


def _load_pretrained(args, raw, id2label: dict, label2id: dict):
    """``(model, processor)``: the trainable checkpoint of ``--model_name_or_path`` with a classifier for the data's
    labels (the flags that apply override its config), and its saved image processor or its family's."""
    from transformers import AutoModelForImageClassification

    from ..loading import load_config, load_image_processor, load_pretrained

    trust, flag = bool(args.trust_remote_code), "model_name_or_path"
    config = load_config(args.model_name_or_path, trust_remote_code=trust, name=flag)
    check_trainable(config, flag)  # CRATE, CRATE-α, ToST or AoT
    names = ("pooling", "hidden_dropout_prob")
    overrides = {k: getattr(args, k) for k in names if getattr(args, k) is not None and hasattr(config, k)}
    if args.variant is not None:
        if config.model_type != "crate":
            raise ValueError(f"variant: --variant chooses CRATE's MSSA output matrix; {config.model_type!r} has none")
        overrides["variant"] = args.variant
    config.update({"num_labels": len(raw.labels), "id2label": id2label, "label2id": label2id, **overrides})
    model = load_pretrained(
        args.model_name_or_path,
        AutoModelForImageClassification,
        config=config,
        trust_remote_code=trust,
        name=flag,
        ignore_mismatched_sizes=args.ignore_mismatched_sizes,
    )
    processor = load_image_processor(args.model_name_or_path, trust_remote_code=trust)
    if processor is None:
        crate = model.config.model_type == "crate"
        processor = CrateImageProcessor.for_config(model.config) if crate else family_processor(model.config)
    return model, processor


def _new_crate(preset: str, args, raw, id2label: dict, label2id: dict):
    """``(model, processor)``: a new CRATE classifier of the CRATE ``preset`` with the size flags given, its size
    checked against the memory before it is allocated."""
    if preset not in CRATE_PRESETS:
        raise ValueError(
            f"preset: expected one of {list(CRATE_PRESETS)} or a CRATE-α / ToST / AoT preset, got {preset!r}"
        )
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
    return CrateForImageClassification(config), CrateImageProcessor.for_config(config)


def image_size_of(config) -> tuple[int, int]:
    """``(height, width)`` of the model's input images."""
    return size_pair(config.image_size, "image_size")


__all__ = ["default_preset", "build_model_and_processor", "image_size_of"]
