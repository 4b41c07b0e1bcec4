"""Inputs -> batches, once for every diagnostic, command, evaluate module and report section.

Two levels:

* model inputs already prepared — a tensor (pixel values, input ids), a dict batch (a processor's output), a
  ``DataLoader`` or any iterable of such batches: :func:`iter_batches` cuts a tensor or dict batch into chunks of
  ``batch_size`` (or, with an ``accelerate.Accelerator``, shards it across processes), prepares a DataLoader for the
  accelerator, and passes other iterables through; :func:`split` and :func:`concat` cut and join one batch;
* raw inputs — PIL images or strings — for a loaded model: :func:`encoded_batches` streams them through the model's
  image processor or tokenizer chunk by chunk (texts: padded on the right, truncated to ``max_length``, checked to
  fit the model's positions before any work).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from ._validation import check_model_inputs


def _is_batch(inputs) -> bool:
    return isinstance(inputs, (torch.Tensor, Mapping)) or (hasattr(inputs, "keys") and hasattr(inputs, "__getitem__"))


def rows(batch) -> int:
    """The number of samples of a tensor or dict batch (its first tensor's first dimension)."""
    if isinstance(batch, torch.Tensor):
        if batch.ndim == 0:
            raise ValueError("inputs: expected a batched tensor, got a scalar")
        return int(batch.shape[0])
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return int(value.shape[0])
    raise ValueError("inputs: a dict batch needs at least one tensor with a batch dimension")


def split(batch, size: int) -> list:
    """A tensor or dict batch cut into chunks of ``size`` samples along the first axis (a dict's tensors are cut,
    its other values repeated in every chunk)."""
    n = rows(batch)
    if isinstance(batch, torch.Tensor):
        return [batch[i : i + size] for i in range(0, n, size)]
    return [
        {k: (v[i : i + size] if isinstance(v, torch.Tensor) and v.ndim > 0 else v) for k, v in batch.items()}
        for i in range(0, n, size)
    ]


def concat(batches: Sequence):
    """Chunks of one batch joined again (tensors, or dicts of tensors with the same keys)."""
    if not batches:
        raise ValueError("inputs: expected at least one batch, got none")
    if isinstance(batches[0], torch.Tensor):
        return torch.cat(list(batches))
    return {k: torch.cat([b[k] for b in batches]) for k in batches[0] if isinstance(batches[0][k], torch.Tensor)}


class _Rows(torch.utils.data.Dataset):
    """The samples of a tensor or dict batch, for a DataLoader the accelerator shards."""

    def __init__(self, batch):
        self.batch, self.n = batch, rows(batch)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if isinstance(self.batch, torch.Tensor):
            return self.batch[i]
        return {k: v[i] for k, v in self.batch.items() if isinstance(v, torch.Tensor)}


def iter_batches(inputs, batch_size: int, accelerator=None) -> Iterable:
    """``inputs`` as an iterable of batches: a tensor or dict batch in chunks of ``batch_size`` (sharded across
    processes with ``accelerator``), a DataLoader (prepared for ``accelerator`` unless it already is), any other
    iterable of batches as given."""
    if _is_batch(inputs):
        rows(inputs)  # a scalar or a dict without a batched tensor is refused here
        check_model_inputs(inputs)  # NaN/inf or float32-overflowing values named before any work
        if accelerator is None:
            return split(inputs, batch_size)
        inputs = torch.utils.data.DataLoader(_Rows(inputs), batch_size=batch_size, shuffle=False)
    if accelerator is not None and isinstance(inputs, torch.utils.data.DataLoader):
        from accelerate.data_loader import DataLoaderDispatcher, DataLoaderShard

        if not isinstance(inputs, (DataLoaderShard, DataLoaderDispatcher)):
            inputs = accelerator.prepare_data_loader(inputs)
    if isinstance(inputs, (str, bytes)) or not hasattr(inputs, "__iter__"):
        raise TypeError(
            "inputs: expected model inputs (a tensor such as pixel values or input ids), a dict batch, a DataLoader "
            f"or an iterable of batches, got {type(inputs).__name__}"
        )
    return inputs


def encoded_batches(loaded, items: Sequence, batch_size: int, *, tokenizer=None, max_length: int = 128,
                    name: str = "inputs", hint: str = "pass --max-length {limit}, or shorter texts"):  # fmt: skip
    """Raw ``items`` (PIL images, or strings) for ``loaded`` (:class:`hf_tdiag.loading.LoadedModel`), converted one
    chunk of ``batch_size`` at a time when iterated (:class:`hf_tdiag.inputs.LazyBatches`): images by the model's
    image processor; strings by ``tokenizer`` or the model's own, padded on the right and truncated to
    ``max_length`` — every text is checked to fit the model's positions first (``name`` is how errors call them,
    ``hint`` what they suggest)."""
    from ._model_limits import check_texts_fit
    from .inputs import LazyBatches, check_texts
    from .loading import pixel_values_for

    items = list(items)
    if items and isinstance(items[0], str):
        tok = tokenizer if tokenizer is not None else (loaded.processor if loaded.modality == "text" else None)
        if tok is None:
            if loaded.modality == "image":
                raise ValueError(f"texts: {loaded.source!r} is an image model; pass images= or pixel_values=")
            raise ValueError(
                f"tokenizer: no tokenizer found for {loaded.source!r}; pass tokenizer=, or save one beside it"
            )
        check_texts(items)
        if tok.pad_token is None and tok.eos_token is not None and tokenizer is None:
            tok.pad_token = tok.eos_token  # decoder tokenizers (GPT-2, Llama) often have none; ours only
        check_texts_fit(loaded.model, tok, items, max_length, name=name, hint=hint)

        def encode(chunk):
            enc = tok(list(chunk), padding=True, truncation=True, max_length=max_length, return_tensors="pt",
                      padding_side="right")  # fmt: skip
            return {k: v for k, v in enc.items() if isinstance(v, torch.Tensor)}

        return LazyBatches(items, batch_size, encode)
    return LazyBatches(items, batch_size, lambda chunk: pixel_values_for(list(chunk), loaded))


__all__ = ["concat", "encoded_batches", "iter_batches", "rows", "split"]
