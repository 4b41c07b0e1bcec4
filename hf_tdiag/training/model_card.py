"""Model cards for trained CRATE models, rendered from ``model_cards/crate_model_card.jinja``.

The card's YAML front matter is a ``huggingface_hub.ModelCardData`` with the
evaluation results as ``model-index`` entries (and ``base_model`` for a
fine-tune of a Hub model); the body describes the variant (what its MSSA
output matrix is), the size, the data and recipe, the results, the per-layer
SRR table and figure, limitations and citations. A card is published: it
never carries a local absolute path (a data folder appears by its name; the
model's own folder by the path it was given when relative, see
:func:`folder_display`). The size is named by a preset only when the config
has that preset's sizes (:func:`matching_preset`). The other families (and a
CRATE with no training record) get :func:`build_family_card`, rendered from
``model_cards/family_model_card.jinja``.
"""

from __future__ import annotations

import os
import re
import shlex

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..models.crate.configuration_crate import size_pair
from .data import IN_MEMORY

TEMPLATE_NAME = "crate_model_card.jinja"
FAMILY_TEMPLATE_NAME = "family_model_card.jinja"
PROJECT_TAG = "hf-tdiag"  # every card hf-tdiag writes carries it: the cards hf-tdiag may replace

VARIANT_DESCRIPTIONS = {
    "crate": "the MSSA output matrix is a learned matrix W (with bias), as in the original CRATE (Yu et al., 2023).",
    "crate-c": "the MSSA output matrix is the subspaces themselves, U = [U_1 … U_K] (CRATE-C, Hu, Zou & Xu, 2024).",
    "crate-n": "the MSSA output matrix is −U = −[U_1 … U_K] (CRATE-N, Hu, Zou & Xu, 2024).",
    "crate-t": "the MSSA output matrix is Uᵀ (CRATE-T, Hu, Zou & Xu, 2024; needs K·p = d).",
    "crate-fix": "the MSSA output matrix is a fixed random matrix, not trained and saved with the weights (ablation).",
    "crate-identity": "the MSSA output matrix is the identity I (ablation; needs K·p = d).",
}
VARIANT_NAMES = {
    "crate": "CRATE",
    "crate-c": "CRATE-C",
    "crate-n": "CRATE-N",
    "crate-t": "CRATE-T",
    "crate-fix": "CRATE-Fix",
    "crate-identity": "CRATE-Identity",
}


def template_path(name: str = TEMPLATE_NAME) -> str:
    """The card template: ``hf_tdiag/model_cards/`` in an installed wheel (setup.py copies it there), else the
    checkout's top-level ``model_cards/`` beside ``hf_tdiag/``."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for folder in (os.path.join(package, "model_cards"), os.path.join(os.path.dirname(package), "model_cards")):
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    raise FileNotFoundError(
        f"model card template {name!r}: not in {package}/model_cards nor in the checkout's model_cards/"
    )


def _is_local(value) -> bool:
    return isinstance(value, str) and bool(value) and (os.path.isabs(value) or os.path.exists(value))


def _public(value):
    """``value`` as a published card may show it: a local path becomes its last component, anything else is kept."""
    if _is_local(value):
        return os.path.basename(os.path.normpath(value)) or value
    return value


def _is_hub_id(value) -> bool:
    return (
        isinstance(value, str) and bool(value) and value not in ("sklearn-digits", IN_MEMORY) and not _is_local(value)
    )


def folder_display(path) -> str:
    """How a card names the model's own folder in ``from_pretrained(...)`` and the reproduce command: the path as
    given when relative (``runs/main``), relative to the working directory when an absolute path lies under it, else
    ``path/to/<name>`` (a published card never carries a local absolute path)."""
    path = os.path.normpath(str(path))
    if not os.path.isabs(path):
        return path
    relative = os.path.relpath(path, os.getcwd())
    if relative != os.curdir and not relative.startswith(os.pardir):
        return relative
    return f"path/to/{os.path.basename(path) or 'model'}"


def _preset_table(model_type: str) -> dict:
    """The family's preset name -> fields table (empty for a model type hf-tdiag does not define)."""
    from importlib import import_module

    where = {
        "crate": ("crate.configuration_crate", "CRATE_PRESETS"),
        "crate-alpha": ("crate_alpha.configuration_crate_alpha", "CRATE_ALPHA_PRESETS"),
        "crate-mae": ("crate_mae.configuration_crate_mae", "CRATE_MAE_PRESETS"),
        "tost": ("tost.configuration_tost", "TOST_PRESETS"),
        "crate_text": ("crate_text.configuration_crate_text", "CRATE_TEXT_PRESETS"),
    }.get(model_type)
    if where is None:
        return {}
    return getattr(import_module(f"hf_tdiag.models.{where[0]}"), where[1])


def _same_value(a, b) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):  # a square size may be 8 or [8, 8]
        pair = lambda v: tuple(v) if isinstance(v, (list, tuple)) else (v, v)  # noqa: E731
        return pair(a) == pair(b)
    return a == b


def matching_preset(config, prefer: str | None = None) -> str | None:
    """The name of the preset whose sizes ``config`` has (every field the preset sets, and the head width it
    derives), else ``None``: a config built from a preset with other sizes is no longer that preset. ``prefer``
    is returned when it is among several matches."""
    table = _preset_table(getattr(config, "model_type", ""))
    matches = []
    for name, fields in table.items():
        reference = type(config).from_preset(name)
        keys = set(fields) | ({"head_dim"} & set(vars(reference)))
        if all(_same_value(getattr(config, k, None), getattr(reference, k, None)) for k in sorted(keys)):
            matches.append(name)
    if prefer in matches:
        return prefer
    return matches[0] if matches else None


_SNIPPET = re.compile(r'from_pretrained\("[^"\n]*"')


def retarget_card(text: str, repo_id: str) -> str:
    """``text`` (a card hf-tdiag wrote) with every ``from_pretrained("...")`` naming ``repo_id``."""
    return _SNIPPET.sub(lambda _: f'from_pretrained("{repo_id}"', text)


def is_project_card(text: str | None) -> bool:
    """Whether ``text`` is a card hf-tdiag wrote (its YAML tags carry ``hf-tdiag``)."""
    from huggingface_hub import RepoCard

    if not text or not text.lstrip().startswith("---"):
        return False
    try:
        tags = RepoCard(text).data.to_dict().get("tags") or []
    except Exception:  # a README whose front matter is not YAML: not ours
        return False
    return PROJECT_TAG in tags


def is_placeholder_card(text: str | None) -> bool:
    """Whether ``text`` is empty or the generic card ``transformers``' ``push_to_hub`` writes for a repo that has
    none ("This is the model card of a 🤗 transformers model that has been pushed on the Hub...")."""
    return not (text or "").strip() or "transformers model that has been pushed on the Hub" in text


def _dataset_type(args, raw) -> str:
    """The card's dataset type: the Hub id, ``sklearn-digits``, ``imagefolder`` or ``in-memory``; else the name."""
    if _is_hub_id(raw.dataset_id) or raw.dataset_id == IN_MEMORY or raw.is_digits:
        return raw.dataset_id
    return "imagefolder" if getattr(args, "train_dir", None) else _public(raw.dataset_id)


def _command(args) -> str:
    from .args import flag_defaults

    defaults = flag_defaults()
    parts = ["python", "recipes/train_crate.py"]
    for key, value in sorted(vars(args).items()):
        if key in (
            "func",
            "command",
            "hub_token",
            "push_to_hub",
            "hub_model_id",
            "resume_from_checkpoint",
            "overwrite_output_dir",  # a copied command must never delete someone's model
        ):
            continue
        if key not in defaults or value == defaults[key] or value is None:
            continue
        if key == "output_dir":
            parts += ["--output_dir", folder_display(value)]
        elif value is True:
            parts.append(f"--{key}")
        elif value is not False:
            parts += [f"--{key}", str(_public(value))]
    return " ".join(shlex.quote(p) for p in parts)


def _card_data(variant: str, model_name: str, results: dict, args, raw) -> ModelCardData:
    """The YAML front matter: tags, dataset, ``base_model`` (Hub fine-tunes) and ``model-index`` eval results."""
    common = dict(
        task_type="image-classification",
        task_name="Image Classification",
        dataset_type=_dataset_type(args, raw),
        dataset_name=_public(raw.name),
        dataset_split=raw.eval_split,
    )
    eval_results = [
        EvalResult(
            metric_type="accuracy", metric_name="Accuracy", metric_value=float(results["eval_accuracy"]), **common
        ),
        EvalResult(
            metric_type="loss", metric_name="Cross-entropy loss", metric_value=float(results["eval_loss"]), **common
        ),
        EvalResult(
            metric_type="generalization_gap",
            metric_name="Generalization gap (val loss - train loss)",
            metric_value=float(results["generalization_gap"]),
            **common,
        ),
    ]
    return ModelCardData(
        model_name=model_name,
        library_name="transformers",
        license="apache-2.0",
        pipeline_tag="image-classification",
        tags=["crate", "white-box-transformer", "sparse-rate-reduction", PROJECT_TAG, variant],
        datasets=[raw.dataset_id] if _is_hub_id(raw.dataset_id) else None,
        base_model=_base_model(args),
        metrics=["accuracy"],
        eval_results=eval_results,
    )


def _base_model(args) -> str | None:
    """The Hub id a fine-tune started from (None when trained from scratch or from a local folder)."""
    return args.model_name_or_path if _is_hub_id(args.model_name_or_path) else None


def _size_text(value) -> str:
    """``"32"`` for a square size, ``"32×48"`` (height×width) otherwise."""
    height, width = size_pair(value)
    return str(height) if height == width else f"{height}×{width}"


def _model_fields(config, preset: str | None) -> dict:
    """The template's architecture fields: variant, sizes, widths, ISTA settings, labels."""
    variant = getattr(config, "variant", "crate")
    labels = [config.id2label[i] for i in sorted(config.id2label)]
    return dict(
        variant=variant,
        variant_name=VARIANT_NAMES.get(variant, variant),
        variant_description=VARIANT_DESCRIPTIONS.get(variant, "unknown variant"),
        preset=preset,
        image_size=_size_text(config.image_size),
        patch_size=_size_text(config.patch_size),
        num_channels=config.num_channels,
        hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        head_dim=config.head_dim,
        ista_step_size=config.ista_step_size,
        ista_lambda=config.ista_lambda,
        pooling=config.pooling,
        num_labels=len(labels),
        labels=", ".join(labels[:20]) + (" …" if len(labels) > 20 else ""),
    )


def _data_fields(args, raw) -> dict:
    """The template's data fields: dataset, fine-tuning origin, evaluation split, limitations."""
    limitations_data = (
        "Trained on the 8×8 scikit-learn digits: tiny grayscale images of handwritten digits. It is a demonstration "
        "and a research object for white-box diagnostics, not a general-purpose digit or image classifier."
        if raw.is_digits
        else f"Trained only on {_public(raw.name)}; expect degraded accuracy on images from other distributions."
    )
    return dict(
        dataset_name=_public(raw.name),
        dataset_id=_public(raw.dataset_id),
        base_model=_base_model(args),
        fine_tuned_from=_public(args.model_name_or_path),
        eval_split=raw.eval_split,
        limitations_data=limitations_data,
    )


def _training_fields(args, results: dict) -> dict:
    """The template's training fields: optimiser, schedule, batch, SRR regulariser, the command that reproduces it."""
    warmup = args.num_warmup_steps if args.num_warmup_steps is not None else f"{args.warmup_ratio:g} of the steps"
    return dict(
        augmentation=results.get("augmentation", "none"),
        optimizer=args.optimizer,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        lr_scheduler_type=args.lr_scheduler_type,
        warmup=warmup,
        batch_size=args.per_device_train_batch_size,
        num_processes=results.get("num_processes", 1),
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        label_smoothing=args.label_smoothing,
        mixed_precision=results.get("mixed_precision", "no"),
        seed=args.seed,
        srr_weight=args.srr_weight,
        srr_layer=args.srr_layer,
        srr_eps=args.srr_eps,
        srr_lambda=args.srr_lambda,
        stop_at_train_loss=args.stop_at_train_loss,
        command=_command(args),
    )


def _result_fields(results: dict) -> dict:
    """The template's result fields: sample and step counts, accuracy, losses, gap, per-layer SRR."""
    return dict(
        num_parameters=f"{results.get('num_parameters', 0):,}",
        eval_samples=results.get("eval_samples"),
        train_samples=results.get("train_samples"),
        steps=results.get("steps"),
        epochs=results.get("epochs"),
        reached_train_loss_target=results.get("reached_train_loss_target", False),
        eval_accuracy=results["eval_accuracy"],
        eval_loss=results["eval_loss"],
        train_loss=results["train_loss"],
        train_accuracy=results["train_accuracy"],
        generalization_gap=results["generalization_gap"],
        srr_mean=results.get("srr_mean_over_layers"),
        layer_srr=results.get("layer_srr"),
        layer_srr_embeddings=results.get("layer_srr_embeddings"),
        layer_srr_samples=results.get("layer_srr_samples"),
    )


def build_model_card(
    config,
    results: dict,
    args,
    raw,
    preset: str | None = None,
    output_dir: str | None = None,
    repo_id: str | None = None,
) -> ModelCard:
    """Render the card for a model trained by :func:`hf_tdiag.training.train` from its results dict; the usage
    snippet names ``repo_id``, else the output folder (:func:`folder_display`). ``preset`` (what the run started
    from) is shown only when the config still has its sizes, else the preset it matches, else none."""
    variant = getattr(config, "variant", "crate")
    repo_id = repo_id or folder_display(args.output_dir)
    preset = matching_preset(config, prefer=preset)
    model_name = (
        f"{VARIANT_NAMES.get(variant, variant)} {('(' + preset + ') ') if preset else ''}on {_public(raw.dataset_id)}"
    )
    figure = None
    if output_dir and os.path.isfile(os.path.join(output_dir, "layer_srr.png")):
        figure = "layer_srr.png"
    return ModelCard.from_template(
        _card_data(variant, model_name, results, args, raw),
        template_path=template_path(),
        model_name=model_name,
        repo_id=repo_id,
        srr_figure=figure,
        **_model_fields(config, preset),
        **_data_fields(args, raw),
        **_training_fields(args, results),
        **_result_fields(results),
    )


FAMILIES = {  # model_type -> (name, what it is, the paper, its tag)
    "crate": (
        "CRATE",
        "a white-box transformer whose blocks are derived as steps on the sparse rate reduction objective: "
        "multi-head subspace self-attention (MSSA) then one ISTA sparse-coding step.",
        "Yu et al., *White-Box Transformers via Sparse Rate Reduction*, NeurIPS 2023.",
        "crate",
    ),
    "crate-alpha": (
        "CRATE-α",
        "the scaled CRATE: MSSA then an overcomplete sparse-coding block with a residual (Yang et al., 2024).",
        "Yang et al., *Scaling White-Box Transformers for Vision*, 2024.",
        "crate-alpha",
    ),
    "crate-mae": (
        "CRATE-MAE",
        "a CRATE masked autoencoder: a CRATE encoder and a decoder of the inverted blocks (Pai et al., 2024).",
        "Pai et al., *Masked Completion via Structured Diffusion with White-Box Transformers*, ICLR 2024.",
        "crate-mae",
    ),
    "tost": (
        "ToST",
        "the Token Statistics Transformer: token statistics self-attention (TSSA), linear in the number of tokens "
        "(Wu et al., 2025).",
        "Wu et al., *Token Statistics Transformer: Linear-Time Attention via Variational Rate Reduction*, ICLR 2025.",
        "tost",
    ),
    "crate_text": (
        "text CRATE",
        "a CRATE for text: MSSA and ISTA blocks over token embeddings (CRATE-LM, Bai & Ma 2024, and the "
        "RoBERTa-shaped CRATE encoder).",
        "Yu et al., *White-Box Transformers via Sparse Rate Reduction*, NeurIPS 2023; CRATE-LM (Bai & Ma, 2024).",
        "crate-text",
    ),
}
PIPELINE_TAGS = {
    "AutoModelForImageClassification": "image-classification",
    "AutoModelForCausalLM": "text-generation",
    "AutoModelForMaskedLM": "fill-mask",
    "AutoModelForSequenceClassification": "text-classification",
    "AutoModelForTokenClassification": "token-classification",
    "AutoModelForQuestionAnswering": "question-answering",
}
_SIZE_FIELDS = (
    "image_size",
    "patch_size",
    "num_channels",
    "vocab_size",
    "max_position_embeddings",
    "block",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "decoder_hidden_size",
    "decoder_num_hidden_layers",
    "decoder_num_attention_heads",
)


def _sizes_text(config) -> str:
    """``image_size 8, patch_size 2, ...``: the size fields the config has."""
    parts = []
    for name in _SIZE_FIELDS:
        value = getattr(config, name, None)
        if value is not None:
            parts.append(f"{name} {_size_text(value) if name in ('image_size', 'patch_size') else value}")
    return ", ".join(parts)


def build_family_card(
    config,
    repo_id: str,
    *,
    class_name: str,
    auto_class: str,
    num_parameters: int,
    base_model: str | None = None,
    derived_from: str | None = None,
    weights_changed: bool = False,
    results: dict | None = None,
    args=None,
    raw=None,
) -> ModelCard:
    """The card of any hf-tdiag family's model: the architecture, the preset it matches (or none), the usage
    snippet naming ``repo_id`` with ``auto_class``, ``base_model`` (a Hub id it derives from) or ``derived_from``
    (a local folder, by name, and whether the weights changed since they were loaded from it); with a trainer's ``results`` (and its ``args``, ``raw`` data), also the data, the
    reproduce command and the ``model-index`` metrics. Without them it says that no training record came with it."""
    model_type = getattr(config, "model_type", "")
    name, description, reference, tag = FAMILIES.get(model_type, (model_type, "a model.", "", model_type))
    preset = matching_preset(config)
    labels = _class_labels(config, auto_class)
    data, training = _family_card_record(name, preset, tag, auto_class, base_model, results, args, raw)
    return ModelCard.from_template(
        data,
        template_path=template_path(FAMILY_TEMPLATE_NAME),
        family_name=name,
        family_description=description,
        reference=reference,
        model_type=model_type,
        class_name=class_name,
        auto_class=auto_class,
        repo_id=repo_id,
        preset=preset,
        sizes=_sizes_text(config),
        num_parameters=f"{num_parameters:,}",
        labels=", ".join(str(label) for label in labels[:20]) + (" …" if len(labels) > 20 else ""),
        num_labels=len(labels),
        derived_from=None if training["base_model"] else derived_from,
        weights_changed=weights_changed,
        results=results,
        **training,
    )


def _class_labels(config, auto_class: str) -> list:
    """The class names a classifier's card lists: none for a base model, or when they are the default ``LABEL_i``."""
    labels = [config.id2label[i] for i in sorted(config.id2label)] if auto_class in PIPELINE_TAGS else []
    return labels if any(str(label) != f"LABEL_{i}" for i, label in enumerate(labels)) else []


def _family_card_record(name, preset, tag, auto_class, base_model, results, args, raw) -> tuple[ModelCardData, dict]:
    """The card's metadata and what its text says of the model's origin: with a trainer's ``results`` and ``args``,
    the data, the reproduce command and the metrics (the base model the training started from); without them, the
    given ``base_model`` and no training record."""
    if results is not None and args is not None:
        model_name = f"{name} {('(' + preset + ') ') if preset else ''}on {_public(raw.dataset_id)}"
        data = _card_data(tag, model_name, results, args, raw)
        data.tags = ["white-box-transformer", PROJECT_TAG, tag]
        data.pipeline_tag = PIPELINE_TAGS.get(auto_class)
        return data, {"model_name": model_name, "base_model": _base_model(args), "command": _command(args),
                      "dataset_name": _public(raw.name), "eval_split": raw.eval_split}  # fmt: skip
    model_name = f"{name}{(' (' + preset + ')') if preset else ''}"
    data = ModelCardData(
        model_name=model_name,
        library_name="transformers",
        license="apache-2.0",
        pipeline_tag=PIPELINE_TAGS.get(auto_class),
        tags=["white-box-transformer", PROJECT_TAG, tag],
        base_model=base_model,
    )
    return data, {"model_name": model_name, "base_model": base_model, "command": None, "dataset_name": None,
                  "eval_split": None}  # fmt: skip


def training_card(run, results: dict, repo_id: str | None = None) -> ModelCard:
    """The card of a trainer run (``hf_tdiag.training.loop.TrainingRun``): :func:`build_model_card` for CRATE,
    :func:`build_family_card` with the run's results for CRATE-α and ToST; the snippet names ``repo_id``, else the
    output folder."""
    args, config = run.args, run.config
    if config.model_type == "crate":
        return build_model_card(
            config, results, args, run.raw, preset=run.preset, output_dir=args.output_dir, repo_id=repo_id
        )
    from .._hub_card import auto_class_of

    return build_family_card(
        config,
        repo_id or folder_display(args.output_dir),
        class_name=type(run.unwrapped).__name__,
        auto_class=auto_class_of(run.unwrapped, args.output_dir),
        num_parameters=sum(p.numel() for p in run.unwrapped.parameters()),
        results=results,
        args=args,
        raw=run.raw,
    )


__all__ = [
    "training_card",
    "build_model_card",
    "build_family_card",
    "matching_preset",
    "folder_display",
    "retarget_card",
    "is_project_card",
    "is_placeholder_card",
    "template_path",
    "VARIANT_DESCRIPTIONS",
    "PROJECT_TAG",
]
