"""What a model can take, checked before any work, with errors that name the input and the limit.

* :func:`position_limit`: the most tokens a text model's learned absolute position embeddings hold (BERT's
  ``position_embeddings``, GPT-2's ``wpe``; RoBERTa's offset by its padding index, OPT's by its ``offset``); None
  for models without such a table (rotary positions, image models).
* :func:`check_token_count` / :func:`check_texts_fit`: a sequence longer than that is refused in one line
  (``texts: text 3 has 40 tokens, but 'bert' reads at most 16 token positions (position_embeddings); pass
  --max-length 16 or shorter texts``) instead of a tensor-size mismatch deep inside the model.
* :func:`check_batch_ids`: a batch's ``input_ids`` checked for both, its length and every id against the model's
  vocabulary (an id outside it is an index error inside the embedding, a device-side assert on a GPU).
* :func:`check_finite_weights`: a NaN or infinite weight is named (``model: weight
  'encoder.layer.0.attention.self.query.weight' of 'runs/x' has 3 NaN/inf entries of 256``) before a measurement
  would report it as NaN states.
* :func:`check_allocation` / :func:`check_batch_states`: a size whose tensors would not fit in memory is refused
  with the size, the bytes and the flag to change, before it is allocated.
"""

from __future__ import annotations

import os

import torch
from torch import nn

_POSITION_TABLES = ("position_embeddings", "wpe", "embed_positions")


def position_limit(model: nn.Module) -> tuple[int, str] | None:
    """``(limit, table name)`` of the model's learned absolute position embeddings, or None without one."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and name.rsplit(".", 1)[-1] in _POSITION_TABLES:
            offset = getattr(module, "offset", 0)  # OPT's learned positions start at 2
            if module.padding_idx is not None:  # RoBERTa: positions count from padding_idx + 1
                offset += module.padding_idx + 1
            return module.num_embeddings - int(offset), name
    return None


def _source(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return repr(getattr(config, "_name_or_path", "") or type(model).__name__)


def check_token_count(
    model: nn.Module,
    count: int,
    name: str = "inputs",
    hint: str = "pass max_length={limit} to the tokenizer, or shorter texts",
) -> None:
    """ValueError when ``count`` tokens exceed what the model's position embeddings hold (``hint``: what to pass
    instead, ``{limit}`` filled in)."""
    found = position_limit(model)
    if found is not None and count > found[0]:
        limit, table = found
        raise ValueError(
            f"{name}: {count} tokens, but {_source(model)} reads at most {limit} token positions ({table}); "
            f"{hint.format(limit=limit)}"
        )


def vocabulary_size(model: nn.Module) -> int | None:
    """Rows of the model's input embedding (``config.vocab_size`` where it has no ``nn.Embedding`` input)."""
    get = getattr(model, "get_input_embeddings", None)
    try:
        embedding = get() if callable(get) else None
    except (NotImplementedError, AttributeError):
        embedding = None
    if isinstance(embedding, nn.Embedding):
        return int(embedding.num_embeddings)
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    return vocab if isinstance(vocab, int) else None


def check_batch_ids(model: nn.Module, batch, name: str = "inputs: input_ids",
                    hint: str = "pass max_length={limit} to the tokenizer, or shorter texts",
                    count_name: str | None = None) -> None:  # fmt: skip
    """A batch's ``input_ids`` ``(B, N)``, where it has them: ``N`` within the model's positions
    (:func:`check_token_count`, its error naming ``count_name`` or ``name``) and every id within its vocabulary
    (:func:`vocabulary_size`)."""
    from ._validation import check_token_ids

    ids = batch.get("input_ids") if hasattr(batch, "get") else None
    if not (isinstance(ids, torch.Tensor) and ids.ndim == 2):
        return
    check_token_count(model, ids.shape[1], count_name or name, hint)
    vocab = vocabulary_size(model)
    if vocab is not None:
        check_token_ids(ids, vocab, name)


def check_texts_fit(
    model: nn.Module,
    tokenizer,
    texts,
    max_length: int | None,
    name: str = "texts",
    hint: str = "pass --max-length {limit}, or shorter texts",
) -> None:
    """Before any work: every text, tokenized as the measurement will (truncated to ``max_length``), fits the
    model's positions; else a ValueError naming the longest text, its token count, the limit and ``hint``."""
    found = position_limit(model)
    if found is None or (max_length is not None and max_length <= found[0]):
        return
    kwargs = {"truncation": True, "max_length": max_length} if max_length is not None else {}
    lengths = [len(ids) for ids in tokenizer(list(texts), **kwargs)["input_ids"]]
    longest = max(range(len(lengths)), key=lengths.__getitem__, default=None)
    if longest is not None and lengths[longest] > found[0]:
        check_token_count(model, lengths[longest], f"{name}: text {longest + 1} ({_preview(texts[longest])})", hint)


def _preview(text: str, limit: int = 30) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def check_finite_weights(model: nn.Module, source: str | None = None) -> None:
    """ValueError naming the first parameter or buffer with NaN/inf entries (meta tensors, i.e. offloaded weights,
    are skipped: they are checked where they are read)."""
    for kind, items in (("weight", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, tensor in items:
            if tensor.device.type == "meta" or not tensor.is_floating_point():
                continue
            if bool(torch.isfinite(tensor.detach().sum())):  # one reduction, no mask: a NaN/inf makes the sum one
                continue
            finite = torch.isfinite(tensor.detach())  # or the finite entries' sum overflowed: count exactly
            if not bool(finite.all()):
                bad = int((~finite).sum())
                where = source if source is not None else _source(model)
                raise ValueError(
                    f"model: {kind} {name!r} of {where} has {bad} NaN/inf entries of {tensor.numel()}; the "
                    "checkpoint is damaged or its training diverged"
                )


def available_memory() -> int | None:
    """Bytes of memory this process could still use (physical memory available), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_allocation(count: int, bytes_per_item: int, what: str, fix: str) -> None:
    """ValueError when ``count`` items of ``bytes_per_item`` bytes exceed the memory available."""
    need = int(count) * int(bytes_per_item)
    free = available_memory()
    if free is not None and need > free:
        raise ValueError(f"{what} would need {_bytes(need)}, more than the {_bytes(free)} of memory available; {fix}")


def check_batch_states(model: nn.Module, batch, arch) -> None:
    """Before a batch runs: refuse one whose token states (each block's input and output, kept for the measurement)
    and one layer's attention probabilities would not fit in memory, naming the batch size and ``--batch-size``."""
    if isinstance(batch, torch.Tensor):
        main, key = batch, "pixel_values" if batch.ndim == 4 else "input_ids"
    elif hasattr(batch, "get"):
        key = "input_ids" if batch.get("input_ids") is not None else "pixel_values"
        main = batch.get(key)
    else:
        return
    if not isinstance(main, torch.Tensor) or main.ndim < 2:
        return
    tokens = main.shape[1] if key == "input_ids" else _image_tokens(model, main)
    if tokens is None:
        return
    count = main.shape[0] * tokens * (arch.hidden_size * (2 * arch.num_layers + 2) + arch.num_heads * tokens)
    itemsize = next((p.element_size() for p in model.parameters()), 4)
    check_allocation(
        count,
        itemsize,
        f"inputs: a batch of {main.shape[0]:,} inputs of {tokens:,} tokens",
        "pass a smaller batch_size (--batch-size)",
    )


def _image_tokens(model: nn.Module, pixels: torch.Tensor) -> int | None:
    patch = getattr(getattr(model, "config", None), "patch_size", None)
    if pixels.ndim != 4 or patch is None:
        return None
    ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)[:2]
    return (pixels.shape[-2] // ph) * (pixels.shape[-1] // pw) + 1


def check_training_size(model_class, config, batch_size: int | None) -> None:
    """Before a weight is allocated: refuse a model whose training would not fit in memory. Counted exactly: the
    parameters (built on the meta device, no memory) with their gradient and Adam's two moments (16 bytes each in
    float32), and one attention-probability matrix per layer and head for a batch (kept for the backward pass); the
    other activations come on top."""
    with torch.device("meta"):
        params = sum(p.numel() for p in model_class(config).parameters())
    size = getattr(config, "image_size", None)
    patch = getattr(config, "patch_size", None)
    if size is None or patch is None:
        tokens = int(getattr(config, "max_position_embeddings", 1))
    else:
        (height, width), (ph, pw) = (_pair(size), _pair(patch))
        tokens = (height // ph) * (width // pw) + 1
    batch = int(batch_size or 1)
    attention = batch * config.num_hidden_layers * config.num_attention_heads * tokens * tokens
    check_allocation(
        16 * params + 4 * attention,
        1,
        f"training this model ({params:,} parameters; {tokens:,} tokens an input, batches of {batch})",
        "choose a smaller --hidden-size, --num-hidden-layers, --image-size (or larger --patch-size) or "
        "--per-device-train-batch-size",
    )


def _pair(value) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _bytes(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


__all__ = [
    "available_memory",
    "check_allocation",
    "check_batch_states",
    "check_finite_weights",
    "check_texts_fit",
    "check_training_size",
    "check_token_count",
    "position_limit",
]
