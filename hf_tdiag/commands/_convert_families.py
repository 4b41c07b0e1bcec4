"""``hf-tdiag convert-official`` for the white-box families beyond CRATE (CRATE-α so far), chosen by ``--preset``."""

from __future__ import annotations

import argparse
import os


def family_of_preset(preset: str) -> str | None:
    """``"crate-alpha"`` when ``preset`` names a CRATE-α size, else ``None`` (a CRATE preset or unknown)."""
    from hf_tdiag.models.crate_alpha.configuration_crate_alpha import CRATE_ALPHA_PRESETS

    return "crate-alpha" if preset in CRATE_ALPHA_PRESETS else None


def _max_logit_difference(model, sd, config, reloaded) -> tuple[float, float]:
    """Max |logit| difference of the converted model against the official forward and against its saved folder."""
    import torch

    from hf_tdiag.models.crate_alpha.convert_official import official_forward

    height, width = (config.image_size, config.image_size) if isinstance(config.image_size, int) else config.image_size
    pixels = torch.randn(2, config.num_channels, height, width, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(pixels).logits
        official = official_forward(sd, pixels.to(ours.dtype), config)
        again = reloaded(pixels).logits
    return float((ours - official).abs().max()), float((ours - again).abs().max())


def run_family(args: argparse.Namespace, sd: dict, labels_reader) -> int:
    """Convert ``sd`` (an unwrapped official state_dict) to the family of ``args.preset``; print the logit checks."""
    from transformers import AutoModelForImageClassification

    from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaImageProcessor
    from hf_tdiag.models.crate_alpha.convert_official import convert_official_crate_alpha

    if args.variant != "crate":
        raise ValueError(f"--variant: CRATE-α has one output matrix (no variants); got {args.variant!r}")
    overrides = dict(pooling=args.pooling, num_labels=int(sd["mlp_head.1.weight"].shape[0]))
    if args.image_size is not None:
        overrides["image_size"] = args.image_size
    config = CrateAlphaConfig.from_preset(args.preset, **overrides)
    labels = labels_reader(args.labels, config.num_labels)
    if labels is not None:
        config.id2label, config.label2id = labels, {v: k for k, v in labels.items()}
    model = convert_official_crate_alpha(sd, config)
    os.makedirs(args.output_dir, exist_ok=True)
    model.save_pretrained(args.output_dir)
    CrateAlphaImageProcessor.for_config(config).save_pretrained(args.output_dir)
    reloaded = AutoModelForImageClassification.from_pretrained(args.output_dir).eval()
    official, saved = _max_logit_difference(model, sd, config, reloaded)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"converted {args.checkpoint} -> {args.output_dir}: {args.preset} (CRATE-α, {config.num_hidden_layers} layers, "
        f"d={config.hidden_size}, {config.num_labels} classes, {n_params / 1e6:.2f}M parameters)"
    )
    print(f"max logit difference: {official:.3g} against the official forward, {saved:.3g} after reloading")
    return 0
