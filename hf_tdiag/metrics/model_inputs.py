"""Input handling shared by hf-tdiag's `evaluate` modules that run a model on images or texts.

Such a module stores one column, ``inputs`` (PIL images or strings), through evaluate's usual
``add`` / ``add_batch`` / ``compute`` API, and also accepts a ready ``pixel_values`` tensor, which
skips evaluate's storage. Mix it in before ``evaluate.Measurement`` and set ``metric_label``.
"""

from __future__ import annotations

import torch


class ModelInputsMixin:
    """``images=`` / ``texts=`` / ``pixel_values=`` handling for a model-running `evaluate` module."""

    metric_label = "metric"

    def _one_input(self, images, texts, pixel_values=None):
        given = [n for n, v in (("images", images), ("texts", texts), ("pixel_values", pixel_values)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"{self.metric_label}: give one of images, texts or pixel_values, got {given}")
        return texts if texts is not None else images

    def add_batch(self, *, images=None, texts=None, inputs=None, **kwargs):
        """Store a batch of PIL images (``images=``) or strings (``texts=``)."""
        batch = self._one_input(images, texts)
        return super().add_batch(inputs=list(batch) if batch is not None else inputs, **kwargs)

    def add(self, *, image=None, text=None, inputs=None, **kwargs):
        """Store one PIL image (``image=``) or one string (``text=``)."""
        return self.add_batch(inputs=[text if text is not None else (image if image is not None else inputs)], **kwargs)

    def compute(self, *, images=None, texts=None, pixel_values=None, predictions=None, references=None, **kwargs):
        """Like `evaluate` compute; `pixel_values` (a tensor) skips `evaluate`'s storage and is measured directly."""
        if predictions is not None or references is not None:
            raise ValueError(
                f"{self.metric_label}: takes `images=`, `texts=` or `pixel_values=` plus `model=`, not predictions/references"
            )
        batch = self._one_input(images, texts, pixel_values)
        if pixel_values is not None:
            if not isinstance(pixel_values, torch.Tensor) or pixel_values.ndim != 4:
                shape = tuple(pixel_values.shape) if isinstance(pixel_values, torch.Tensor) else type(pixel_values).__name__
                raise ValueError(f"pixel_values: expected a tensor of shape (B, C, H, W), got {shape}")
            return self._compute(pixel_values=pixel_values, **kwargs)
        if batch is not None:
            self.add_batch(inputs=list(batch))
        return super().compute(**kwargs)  # everything stored with add / add_batch
