"""Inputs -> batches, once for every diagnostic, command, evaluate module and report section.

Two levels:

* model inputs already prepared — a tensor (pixel values, input ids), a dict batch (a processor's output), a
  ``DataLoader`` or any iterable of such batches: :func:`iter_batches` cuts a tensor or dict batch into chunks of
  ``batch_size`` (or, with an ``accelerate.Accelerator``, shards it across processes), prepares a DataLoader for the
  accelerator, and passes other iterables through; :func:`split` and :func:`concat` cut and join one batch;
* raw inputs — PIL images or strings — for a loaded model: :func:`encoded_batches` streams them through the model's
  image processor or tokenizer chunk by chunk (texts: padded on the right, truncated to ``max_length``, checked to
  fit the model's positions before any work);
* a ``datasets`` ``Dataset`` or ``IterableDataset`` whose columns are model inputs (a processor mapped over it):
  :func:`dataset_batches` reads its model-input columns as a DataLoader of dict batches.

:func:`model_and_inputs` is what every diagnostic's entry calls on its ``(model, inputs)``: a model path (local folder
or Hub id) is loaded, raw images or strings are encoded by the model's processor, a dataset is read as batches;
model objects and prepared batches pass through as given.
"""

from __future__ import annotations

import os
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


#: the columns of a ``datasets`` object that are passed to the model (others, such as labels or raw images, are not)
MODEL_INPUT_COLUMNS = ("pixel_values", "input_ids", "attention_mask", "token_type_ids", "position_ids", "concept_mask")


def is_dataset(obj) -> bool:
    """``obj`` is a ``datasets`` ``Dataset`` or ``IterableDataset`` (checked without importing ``datasets``)."""
    return type(obj).__module__.partition(".")[0] == "datasets" and hasattr(obj, "with_format")


def _stack_rows(rows: list) -> dict:
    try:
        return torch.utils.data.default_collate(rows)
    except RuntimeError as err:
        raise ValueError(
            "inputs: the dataset's rows differ in shape and cannot form one batch; pad the texts to one length "
            "(tokenizer(..., padding='max_length', max_length=N)) or resize the images to one size"
        ) from err


def dataset_batches(dataset, batch_size: int) -> torch.utils.data.DataLoader:
    """The model-input columns (:data:`MODEL_INPUT_COLUMNS`) of a ``datasets`` object as a DataLoader of dict
    batches of ``batch_size`` rows, in order; a dataset without ``pixel_values`` or ``input_ids`` is refused."""
    names = dataset.column_names
    columns = None if names is None else [c for c in names if c in MODEL_INPUT_COLUMNS]
    if columns is not None and not {"pixel_values", "input_ids"} & set(columns):
        raise ValueError(
            f"inputs: the dataset's columns {list(names)} hold no model inputs (pixel_values or input_ids); map the "
            "model's processor over it first, e.g. dataset.map(lambda b: processor(b['image']), batched=True)"
        )
    rows = (dataset if columns is None else dataset.select_columns(columns)).with_format("torch")
    return torch.utils.data.DataLoader(rows, batch_size=batch_size, shuffle=False, collate_fn=_stack_rows)


def raw_items(inputs) -> list | None:
    """``inputs`` as a list when it is a list or tuple of PIL images or of strings (what a processor takes), else
    None (tensors, dict batches, loaders and datasets are model inputs already)."""
    if not isinstance(inputs, (list, tuple)) or not inputs:
        return None
    first = inputs[0]
    if isinstance(first, str) or type(first).__module__.partition(".")[0] == "PIL":
        return list(inputs)
    return None


def model_and_inputs(model, inputs, batch_size: int, *, tokenizer=None, trust_remote_code: bool = False,
                     encode_texts: bool = True, max_length: int = 128, name: str = "inputs",
                     hint: str = "pass --max-length {limit}, or shorter texts"):  # fmt: skip
    """``(model, inputs, tokenizer)`` ready for a diagnostic: a model path (str or PathLike: a local folder or a Hub
    id) loaded (:func:`hf_tdiag.loading.load_model`; its own code only with ``trust_remote_code=True``); raw PIL
    images, or strings when ``encode_texts``, encoded ``batch_size`` at a time by the model's processor (strings by
    ``tokenizer`` when given, to ``max_length`` tokens; ``name`` and ``hint`` as in :func:`encoded_batches`); a
    ``datasets`` object read by :func:`dataset_batches`. The tokenizer returned is ``tokenizer``, else the loaded
    model's where one was loaded (strings left as they are without ``tokenizer``: the model's own, found from its
    ``name_or_path`` for a model object). Model objects and model inputs pass through."""
    if is_dataset(inputs):
        inputs = dataset_batches(inputs, batch_size)
    items = raw_items(inputs)
    kept_texts = items is not None and isinstance(items[0], str) and not encode_texts
    if kept_texts:
        items = None
    is_path = isinstance(model, (str, os.PathLike))
    if not is_path and items is None and not (kept_texts and tokenizer is None):
        return model, inputs, tokenizer
    from .loading import load_model

    loaded = load_model(
        os.fspath(model) if is_path else model, eager_attention=False, trust_remote_code=trust_remote_code
    )
    if items is not None:
        inputs = encoded_batches(loaded, items, batch_size, tokenizer=tokenizer, max_length=max_length, name=name,
                                 hint=hint)  # fmt: skip
    if tokenizer is None and loaded.modality == "text":
        tokenizer = loaded.processor
    return loaded.model, inputs, tokenizer


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


__all__ = [
    "MODEL_INPUT_COLUMNS",
    "concat",
    "dataset_batches",
    "encoded_batches",
    "is_dataset",
    "iter_batches",
    "model_and_inputs",
    "raw_items",
    "rows",
    "split",
]
