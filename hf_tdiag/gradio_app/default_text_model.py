"""The Space's default text model: a small causal CRATE language model (``crate_text``, CRATE-LM's overcomplete
block) trained on CPython's documentation topics (:mod:`hf_tdiag.text_corpus`, no download) on first use, cached
on disk beside the default digits CRATE (``$HF_TDIAG_CACHE``, one file lock, the finished folder appears atomically).

The recipe is short on purpose (a few hundred AdamW steps of a 2-block, width-48 model with a 1,024-token BPE
vocabulary): enough for attention maps and per-layer diagnostics of a trained model, not a good language model.
``recipes/train_crate_lm.py`` is the full recipe with baselines.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

from .default_model import _file_lock, cache_root

RECIPE_VERSION = 1
DEFAULT_TEXT_TRAIN = dict(steps=300, hidden_size=48, layers=2, heads=4, vocab_size=1024, block_size=64, batch_size=16,
                          lr=2e-3, seed=0)  # fmt: skip


def default_text_model_dir(cache: str | os.PathLike | None = None) -> Path:
    """Folder the default text model is (or will be) saved in."""
    root = Path(cache) if cache is not None else cache_root()
    return root / f"default-pydoc-crate-clm-r{RECIPE_VERSION}"


def is_complete(folder: Path) -> bool:
    """True when ``folder`` holds a finished model (config, weights and tokenizer)."""
    return all((folder / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))


def train_text_model(folder: str | os.PathLike, *, steps, hidden_size, layers, heads, vocab_size, block_size,
                     batch_size, lr, seed) -> None:  # fmt: skip
    """Train the default text CRATE into ``folder`` (``save_pretrained`` with its tokenizer): every documentation
    topic, ``steps`` AdamW steps on random blocks, cosine learning rate."""
    import torch

    from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM
    from hf_tdiag.text_corpus import corpus, token_blocks, train_tokenizer

    train, val = corpus(val_every=10)
    texts = list(train.values()) + list(val.values())
    tokenizer = train_tokenizer(texts, vocab_size)
    data = token_blocks(tokenizer, texts, block_size)
    config = CrateTextConfig.from_preset(
        "crate-lm-12l", vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=layers,
        num_attention_heads=heads, max_position_embeddings=block_size, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = CrateTextForCausalLM(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / max(steps, 1)))
        batch = data[torch.randint(0, len(data), (batch_size,), generator=generator)]
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def ensure_default_text_model(
    *, cache: str | os.PathLike | None = None, force: bool = False, threads: int | None = 1, **train_overrides
) -> Path:
    """Folder of the default text CRATE; trains and caches it on first use (``train_overrides`` change
    :data:`DEFAULT_TEXT_TRAIN`, e.g. ``steps`` for a quicker model in tests). ``threads``: torch intra-op threads
    while training (restored afterwards); ``None`` leaves the setting alone."""
    unknown = sorted(set(train_overrides) - set(DEFAULT_TEXT_TRAIN))
    if unknown:
        raise TypeError(f"ensure_default_text_model: unknown setting(s) {unknown}; expected {list(DEFAULT_TEXT_TRAIN)}")
    target = default_text_model_dir(cache)
    if is_complete(target) and not force:
        return target
    with _file_lock(target.parent / f".{target.name}.lock"):
        if is_complete(target) and not force:  # another process finished it while we waited
            return target
        from hf_tdiag._threads import torch_threads

        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            with torch_threads(None if threads is None else int(threads)):
                train_text_model(work, **{**DEFAULT_TEXT_TRAIN, **train_overrides})
            if not is_complete(work):
                raise RuntimeError(f"default text model: training finished but {work} has no complete model")
            if target.exists():
                shutil.rmtree(target)
            os.replace(work, target)  # atomic on one filesystem: a reader sees all or nothing
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    return target


__all__ = [
    "DEFAULT_TEXT_TRAIN",
    "default_text_model_dir",
    "ensure_default_text_model",
    "is_complete",
    "train_text_model",
]
