"""Input handling shared by hf-tdiag's `evaluate` modules that run a model on images or texts.

Such a module stores one column, ``inputs`` (PIL images or strings), through evaluate's usual
``add`` / ``add_batch`` / ``compute`` API, and also accepts a ready ``pixel_values`` tensor, which
skips evaluate's storage. Mix it in before ``evaluate.Measurement``, set ``metric_label``, and
``input_kinds = ("images",)`` for an image-only module. In ``_compute``, :meth:`_model_and_inputs`
loads the model and turns the stored column into what it takes.
"""

from __future__ import annotations

import torch

from ..batching import model_and_inputs
from ..inputs import check_texts
from .combining import ABSENT, called_by_combine, compute_options, kept_modes, route_options


class ModelInputsMixin:
    """``images=`` / ``texts=`` / ``pixel_values=`` handling for a model-running `evaluate` module."""

    metric_label = "metric"
    input_kinds: tuple[str, ...] = ("images", "texts")

    def _one_input(self, images, texts, pixel_values=None):
        given = [n for n, v in (("images", images), ("texts", texts), ("pixel_values", pixel_values)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"{self.metric_label}: give one of images, texts or pixel_values, got {given}")
        if texts is not None and "texts" not in self.input_kinds:
            raise ValueError(f"{self.metric_label}: takes images= or pixel_values=, not texts")
        if texts is not None:
            texts = texts if isinstance(texts, str) else list(texts)  # a generator is read once, here
            check_texts(texts)
        return texts if texts is not None else images

    def input_features(self):
        """evaluate's ``features`` for the stored ``inputs`` column: strings and/or images, per ``input_kinds``
        (with both, the first option that fits a batch is used)."""
        import datasets

        kinds = {"texts": datasets.Value("string"), "images": datasets.Image()}
        options = [datasets.Features({"inputs": kinds[k]}) for k in ("texts", "images") if k in self.input_kinds]
        return options if len(options) > 1 else options[0]

    def _model_and_inputs(self, model, inputs, pixel_values, *, batch_size=None, tokenizer=None, max_length=128,
                          encode_texts=True):  # fmt: skip
        """``(model, its inputs, tokenizer)`` by :func:`hf_tdiag.batching.model_and_inputs`: a folder or Hub id loaded;
        ``pixel_values`` as given; stored images through the model's image processor; stored strings through
        ``tokenizer`` or the model's own (left as strings without ``encode_texts``). ``batch_size=None`` gives one
        batch, an int a :class:`LazyBatches` that prepares each batch when it is reached."""
        if model is None:
            raise ValueError("model: expected a Transformers model, a local folder or a Hub id, got None")
        items = pixel_values if pixel_values is not None else (list(inputs) if inputs is not None else [])
        if pixel_values is None and not items:
            kinds = ", ".join(f"{k}=" for k in (*self.input_kinds, "pixel_values"))
            raise ValueError(f"{self.metric_label}: no inputs; pass {kinds}")
        if pixel_values is None and isinstance(items[0], str) and "texts" not in self.input_kinds:
            raise ValueError(f"{self.metric_label}: takes images, got strings")
        model, batches, tokenizer = model_and_inputs(
            model, items, batch_size or len(items), tokenizer=tokenizer, max_length=max_length,
            encode_texts=encode_texts, name="texts", hint="pass max_length={limit}, or shorter texts",
        )  # fmt: skip
        encoded = pixel_values is None and batches is not items
        return model, (next(iter(batches)) if encoded and batch_size is None else batches), tokenizer

    def add_batch(self, *, images=None, texts=None, inputs=None, **kwargs):
        """Store a batch of PIL images (``images=``) or strings (``texts=``)."""
        batch = self._one_input(images, texts)
        items = list(batch) if batch is not None else inputs
        if items is not None and len(items) == 0:
            raise ValueError(
                f"{'texts' if texts is not None else 'images'}: expected at least one input, got an empty list"
            )
        return super().add_batch(inputs=items, **kwargs)

    def add(self, *, image=None, text=None, inputs=None, **kwargs):
        """Store one PIL image (``image=``) or one string (``text=``)."""
        return self.add_batch(inputs=[text if text is not None else (image if image is not None else inputs)], **kwargs)

    def compute(self, *, images=None, texts=None, pixel_values=None, predictions=ABSENT, references=ABSENT, **kwargs):
        """Like `evaluate` compute; `pixel_values` (a tensor) skips `evaluate`'s storage and is measured directly.
        Options go plain or prefixed with the module's name; under `evaluate.combine` the other modules' are ignored
        (see :mod:`hf_tdiag.metrics.combining`). A model object is left in the train/eval mode it was found in."""
        if any(v is not None and v is not ABSENT for v in (predictions, references)):
            raise ValueError(
                f"{self.metric_label}: takes `images=`, `texts=` or `pixel_values=` plus `model=`, not predictions/references"
            )
        kwargs = route_options(
            self.metric_label,
            kwargs,
            in_combine=called_by_combine(predictions, references),
            options=compute_options(self),
        )
        batch = self._one_input(images, texts, pixel_values)
        with kept_modes(kwargs.get("model")):
            if pixel_values is not None:
                if not isinstance(pixel_values, torch.Tensor) or pixel_values.ndim != 4:
                    shape = (
                        tuple(pixel_values.shape)
                        if isinstance(pixel_values, torch.Tensor)
                        else type(pixel_values).__name__
                    )
                    raise ValueError(f"pixel_values: expected a tensor of shape (B, C, H, W), got {shape}")
                return self._compute(pixel_values=pixel_values, **kwargs)
            if batch is not None:
                items = list(batch)
                if not items:
                    raise ValueError(
                        f"{'texts' if texts is not None else 'images'}: expected at least one input, got an empty list"
                    )
                self.add_batch(inputs=items)
            return super().compute(**kwargs)  # everything stored with add / add_batch
