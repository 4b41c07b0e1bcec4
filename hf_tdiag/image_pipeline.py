"""``pipeline("image-classification")`` and ``pipeline("image-feature-extraction")`` reading images as every other
hf-tdiag entry point does (:func:`hf_tdiag.inputs.to_pil`).

Transformers' pipelines convert each image with ``load_image``, which ends in ``Image.convert("RGB")`` before the
image processor sees it: transparent pixels become the colour stored under them (often black) instead of being
composited onto white, 16-bit images are clipped to white, float images in [0, 1] read as black. No image processor
can undo that. The pipeline classes here read the image first with hf-tdiag's one converter (EXIF orientation,
transparency onto white, 16 bits scaled, floats by their range; an image outside those ranges is refused naming it)
for the white-box image models (``WHITE_BOX_IMAGE_TYPES``); any other model is read exactly as Transformers does.

Use them with ``pipeline("image-classification", model=folder, pipeline_class=WhiteBoxImageClassificationPipeline)``,
or call :func:`register` once to make them the classes ``pipeline()`` picks for the two tasks.
"""

from __future__ import annotations

import base64
import binascii
import os

from transformers.pipelines import ImageClassificationPipeline, ImageFeatureExtractionPipeline

from .models.families import FAMILIES

#: the white-box model types that read images (every family of the table with an image processor)
WHITE_BOX_IMAGE_TYPES = tuple(t for t, family in FAMILIES.items() if family.image_processor is not None)


def _is_white_box(model) -> bool:
    return getattr(getattr(model, "config", None), "model_type", None) in WHITE_BOX_IMAGE_TYPES


def read_pipeline_image(image, timeout: float | None = None):
    """What a pipeline is given (a PIL image, a file path, an http(s) URL or base64 text; arrays and tensors pass
    through) as hf-tdiag reads it: a PIL image through :func:`hf_tdiag.inputs.to_pil`."""
    import numpy as np
    import torch
    from PIL import Image

    from .inputs import to_pil

    if isinstance(image, (np.ndarray, torch.Tensor)):
        return image
    if isinstance(image, Image.Image):
        return to_pil(image)
    if isinstance(image, (str, os.PathLike)):
        text = os.fspath(image)
        if os.path.isfile(text):
            return to_pil(text)
        if text.startswith(("http://", "https://")):
            import httpx

            return to_pil(httpx.get(text, timeout=timeout, follow_redirects=True).content, f"image {text!r}")
        try:
            data = base64.b64decode(text.split(",", 1)[1] if text.startswith("data:image/") else text, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(
                f"image: {text[:80]!r} is not an image file, an http(s) URL or base64 image data"
            ) from None
        return to_pil(data)
    raise TypeError(f"image: expected a PIL image, a file path, a URL or base64 text, got {type(image).__name__}")


class WhiteBoxImageClassificationPipeline(ImageClassificationPipeline):
    """:class:`~transformers.ImageClassificationPipeline` reading a white-box model's images with hf-tdiag's
    converter (transparency, 16-bit and float images as the command line, the Space and the evaluate modules)."""

    def preprocess(self, image, timeout=None):
        if _is_white_box(self.model):
            image = read_pipeline_image(image, timeout)
        return super().preprocess(image, timeout=timeout)


class WhiteBoxImageFeatureExtractionPipeline(ImageFeatureExtractionPipeline):
    """:class:`~transformers.ImageFeatureExtractionPipeline` reading a white-box model's images with hf-tdiag's
    converter."""

    def preprocess(self, image, timeout=None, **image_processor_kwargs):
        if _is_white_box(self.model):
            image = read_pipeline_image(image, timeout)
        return super().preprocess(image, timeout=timeout, **image_processor_kwargs)


def register() -> None:
    """Make the two classes the ones ``pipeline("image-classification")`` and ``pipeline("image-feature-extraction")``
    build (every other model still reads its images exactly as with Transformers' own classes)."""
    from transformers.pipelines import PIPELINE_REGISTRY

    for task, cls in (
        ("image-classification", WhiteBoxImageClassificationPipeline),
        ("image-feature-extraction", WhiteBoxImageFeatureExtractionPipeline),
    ):
        impl = PIPELINE_REGISTRY.supported_tasks[task]
        impl["impl"] = cls  # in place: the task's models and default stay Transformers' own


__all__ = [
    "WHITE_BOX_IMAGE_TYPES",
    "WhiteBoxImageClassificationPipeline",
    "WhiteBoxImageFeatureExtractionPipeline",
    "read_pipeline_image",
    "register",
]
