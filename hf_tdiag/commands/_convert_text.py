"""``hf-tdiag convert-official`` for the text CRATE (``crate_text``): CRATE-LM checkpoints (``--preset crate-lm-12l``
or ``crate-gpt-12l``) and Transformers-PR-#27759 checkpoints (``--preset crate-bert-base``); sizes are read from the
tensors, the preset only names the layout."""

from __future__ import annotations

import argparse

TEXT_LAYOUTS = {"crate-lm-12l": "crate-lm", "crate-gpt-12l": "crate-lm", "crate-bert-base": "pr-27759"}


def is_text_preset(preset: str) -> bool:
    return preset in TEXT_LAYOUTS


def check_text_flags(args: argparse.Namespace) -> None:
    """The image-only flags are refused for a text checkpoint (before the folder is claimed)."""
    if args.variant != "crate" or args.image_size is not None or args.pooling != "cls" or args.labels is not None:
        raise ValueError("--variant / --image-size / --pooling / --labels: not options of a text CRATE checkpoint")


def run_text(args: argparse.Namespace, checkpoint) -> int:
    """Convert ``checkpoint`` (a loaded state_dict or nanoGPT-style dict) and write a folder; print the reload check."""
    import torch

    from hf_tdiag._atomic import staged_folder
    from hf_tdiag.models.crate_text.convert_official import convert_crate_lm, convert_pr_crate

    check_text_flags(args)
    try:
        if TEXT_LAYOUTS[args.preset] == "crate-lm":
            model = convert_crate_lm(checkpoint, num_attention_heads=12 if "model_args" not in checkpoint else None)
        else:
            model = convert_pr_crate(checkpoint)
    except TypeError as err:
        raise ValueError(f"checkpoint: {args.checkpoint!r}: {err}") from None
    with staged_folder(args.output_dir) as stage:  # a full disk leaves no config without weights
        model.save_pretrained(stage)
    reloaded = type(model).from_pretrained(args.output_dir).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before, after = model(input_ids=ids), reloaded(input_ids=ids)
    key = "logits" if hasattr(before, "logits") and before.logits is not None else "last_hidden_state"
    diff = float((getattr(before, key) - getattr(after, key)).abs().max())
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"converted {args.checkpoint} -> {args.output_dir}: {type(model).__name__} (block {cfg.block!r}, "
        f"{cfg.num_hidden_layers} layers, d={cfg.hidden_size}, {cfg.num_attention_heads} heads, vocabulary "
        f"{cfg.vocab_size}, {n_params / 1e6:.2f}M parameters); max |{key}| difference after reload {diff:.2e}"
    )
    return 0
