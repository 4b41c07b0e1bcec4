"""``hf-tdiag convert-official`` for the text CRATE (``crate_text``): CRATE-LM checkpoints (``--preset crate-lm-12l``
or ``crate-gpt-12l``) and Transformers-PR-#27759 checkpoints (``--preset crate-bert-base``); sizes are read from the
tensors, the preset only names the layout."""

from __future__ import annotations

import argparse
import os

TEXT_LAYOUTS = {"crate-lm-12l": "crate-lm", "crate-gpt-12l": "crate-lm", "crate-bert-base": "pr-27759"}


def is_text_preset(preset: str) -> bool:
    return preset in TEXT_LAYOUTS


def run_text(args: argparse.Namespace, checkpoint) -> int:
    """Convert ``checkpoint`` (a loaded state_dict or nanoGPT-style dict) and write a folder; print the reload check."""
    import torch

    from hf_tdiag._outputs import TRAIN_PATTERNS, claim_args
    from hf_tdiag.models.crate_text.convert_official import convert_crate_lm, convert_pr_crate

    if args.variant != "crate" or args.image_size is not None or args.pooling != "cls" or args.labels is not None:
        raise ValueError("--variant / --image-size / --pooling / --labels: not options of a text CRATE checkpoint")
    claim_args(args, [], inputs=[args.checkpoint, args.labels], stale=TRAIN_PATTERNS, model_output=True)
    try:
        if TEXT_LAYOUTS[args.preset] == "crate-lm":
            model = convert_crate_lm(checkpoint, num_attention_heads=12 if "model_args" not in checkpoint else None)
        else:
            model = convert_pr_crate(checkpoint)
    except TypeError as err:
        raise ValueError(f"checkpoint: {args.checkpoint!r}: {err}") from None
    os.makedirs(args.output_dir, exist_ok=True)
    model.save_pretrained(args.output_dir)
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
