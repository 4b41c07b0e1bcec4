"""``hf-tdiag convert-official`` for the white-box families beyond CRATE (CRATE-α, CRATE-MAE) and for SimDINO's
ViT / Dinov2 backbones, chosen by ``--preset``."""

from __future__ import annotations

import argparse


def family_presets() -> dict[str, str]:
    """Preset name -> family, for the families converted here."""
    from hf_tdiag.models.crate_alpha.configuration_crate_alpha import CRATE_ALPHA_PRESETS
    from hf_tdiag.models.crate_mae.configuration_crate_mae import CRATE_MAE_PRESETS

    return {**dict.fromkeys(CRATE_ALPHA_PRESETS, "crate-alpha"), **dict.fromkeys(CRATE_MAE_PRESETS, "crate-mae")}


def family_of_preset(preset: str) -> str | None:
    """``"crate-alpha"`` or ``"crate-mae"`` when ``preset`` names one of their sizes, else ``None``."""
    return family_presets().get(preset)


def _pixels(config):
    import torch

    size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
    return torch.randn(2, config.num_channels, size, size, generator=torch.Generator().manual_seed(0))


def _convert_alpha(args, sd, config_overrides):
    """(model, its processor, max |logit| difference against the official forward) for a CRATE-α checkpoint."""
    import torch

    from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaImageProcessor
    from hf_tdiag.models.crate_alpha.convert_official import convert_official_crate_alpha, official_forward

    if "mlp_head.1.weight" not in sd:
        raise ValueError(f"checkpoint: {args.checkpoint!r} has no 'mlp_head.1.weight' (CRATE-α's classifier weight)")
    if args.variant != "crate":
        raise ValueError(f"--variant: CRATE-α has one output matrix (no variants); got {args.variant!r}")
    overrides = dict(config_overrides, pooling=args.pooling, num_labels=int(sd["mlp_head.1.weight"].shape[0]))
    config = CrateAlphaConfig.from_preset(args.preset, **overrides)
    model = convert_official_crate_alpha(sd, config)
    with torch.no_grad():
        ours = model(_pixels(config)).logits
        diff = float((ours - official_forward(sd, _pixels(config), config)).abs().max())
    return model, CrateAlphaImageProcessor.for_config(config), diff


def _convert_mae(args, sd, config_overrides):
    """(model, its processor, None) for a CRATE-MAE checkpoint."""
    from hf_tdiag.models.crate_mae import CrateMAEConfig, CrateMAEImageProcessor
    from hf_tdiag.models.crate_mae.convert_official import convert_official_crate_mae

    if args.variant != "crate" or args.labels is not None:
        raise ValueError("--variant / --labels: a CRATE-MAE checkpoint has neither output variants nor classes")
    model = convert_official_crate_mae(sd, CrateMAEConfig.from_preset(args.preset, **config_overrides))
    return model, CrateMAEImageProcessor.for_config(model.config), None


def run_family(args: argparse.Namespace, sd: dict, labels_reader) -> int:
    """Convert ``sd`` (an unwrapped official state_dict) to the family of ``args.preset``; print the logit checks."""
    import torch
    from transformers import AutoModelForImageClassification, AutoModelForPreTraining

    family = family_of_preset(args.preset)
    overrides = {} if args.image_size is None else {"image_size": args.image_size}
    convert = _convert_alpha if family == "crate-alpha" else _convert_mae
    model, processor, official = convert(args, sd, overrides)
    config = model.config
    labels = labels_reader(args.labels, config.num_labels) if family == "crate-alpha" else None
    if labels is not None:
        config.id2label, config.label2id = labels, {v: k for k, v in labels.items()}
    from hf_tdiag._atomic import staged_folder

    with staged_folder(args.output_dir) as stage:  # a full disk leaves no config without weights
        model.save_pretrained(stage)
        processor.save_pretrained(stage)
    auto = AutoModelForImageClassification if family == "crate-alpha" else AutoModelForPreTraining
    reloaded = auto.from_pretrained(args.output_dir).eval()
    noise = (
        {}
        if family == "crate-alpha"
        else {"noise": torch.rand(2, config.num_patches, generator=torch.Generator().manual_seed(1))}
    )
    with torch.no_grad():
        saved = float((model(_pixels(config), **noise).logits - reloaded(_pixels(config), **noise).logits).abs().max())
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"converted {args.checkpoint} -> {args.output_dir}: {args.preset} ({family}, {config.num_hidden_layers} layers, "
        f"d={config.hidden_size}, {n_params / 1e6:.2f}M parameters)"
    )
    against = f"{official:.3g} against the official forward, " if official is not None else ""
    print(f"max logit difference: {against}{saved:.3g} after reloading")
    return 0


SIMDINO_HEAD_FILE = "simdino_head.safetensors"


def is_simdino_preset(preset: str) -> bool:
    from hf_tdiag.models.simdino.convert_official import SIMDINO_LAYOUTS

    return preset in SIMDINO_LAYOUTS


def check_simdino_flags(args: argparse.Namespace) -> None:
    """--student / --num-heads only with a SimDINO preset; the CRATE flags never with one."""
    if is_simdino_preset(args.preset):
        given = [
            flag
            for flag, value, default in (
                ("--variant", args.variant, "crate"),
                ("--pooling", args.pooling, "cls"),
                ("--image-size", args.image_size, None),
                ("--labels", args.labels, None),
            )
            if value != default
        ]
        if given:
            raise ValueError(
                f"{given[0]}: a {args.preset} checkpoint is a self-supervised backbone whose shapes set its "
                "architecture; drop the flag"
            )
    elif args.student or args.num_heads is not None:
        flag = "--student" if args.student else "--num-heads"
        raise ValueError(f"{flag}: only for --preset simdino or simdinov2, got --preset {args.preset!r}")


def run_simdino(args: argparse.Namespace, load_checkpoint) -> int:
    """Convert a SimDINO / SimDINOv2 checkpoint; write the model, a ViT image processor and the heads apart."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModel, ViTImageProcessor

    from hf_tdiag._atomic import staged_folder
    from hf_tdiag._outputs import TRAIN_PATTERNS, claim_args
    from hf_tdiag.models.simdino.convert_official import convert_simdino, split_simdino_checkpoint

    from .convert_official import MODEL_WRITES

    claim_args(
        args, (*MODEL_WRITES, SIMDINO_HEAD_FILE), inputs=[args.checkpoint], stale=TRAIN_PATTERNS, model_output=True
    )
    with torch.serialization.safe_globals([argparse.Namespace]):  # main_dino.py saves its argparse args
        checkpoint = load_checkpoint(args.checkpoint)
    try:
        backbone, heads = split_simdino_checkpoint(checkpoint, student=args.student)
    except TypeError as err:
        raise ValueError(f"checkpoint: {args.checkpoint!r}: {err}") from None
    model = convert_simdino(backbone, args.preset, num_heads=args.num_heads)
    config = model.config
    processor = ViTImageProcessor(  # the authors' evaluation transform: ImageNet mean and std
        size={"height": config.image_size, "width": config.image_size},
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )
    with staged_folder(args.output_dir) as stage:  # a full disk leaves no config without weights
        model.save_pretrained(stage)
        processor.save_pretrained(stage)
        if heads:
            save_file({k: v.contiguous() for k, v in heads.items()}, f"{stage}/{SIMDINO_HEAD_FILE}")
    no_pooler = {"add_pooling_layer": False} if config.model_type == "vit" else {}  # DINO's ViT has none
    reloaded = AutoModel.from_pretrained(args.output_dir, **no_pooler).eval()
    pixels = torch.randn(2, config.num_channels, config.image_size, config.image_size)
    with torch.no_grad():
        saved = float((model(pixels).last_hidden_state - reloaded(pixels).last_hidden_state).abs().max())
    which = "student" if args.student else "teacher"
    print(
        f"converted {args.checkpoint} ({which}) -> {args.output_dir}: {type(model).__name__}, "
        f"{config.num_hidden_layers} layers, d={config.hidden_size}, {config.num_attention_heads} heads, "
        f"patch {config.patch_size}, {config.image_size} px, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M "
        f"parameters; heads: {f'{len(heads)} tensors in {SIMDINO_HEAD_FILE}' if heads else 'none'}"
    )
    print(f"max hidden-state difference after reloading: {saved:.3g}")
    return 0
