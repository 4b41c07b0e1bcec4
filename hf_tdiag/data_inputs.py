"""Deprecated alias of :mod:`hf_tdiag.inputs` (the one module for image and text inputs); import from there."""

import warnings

from hf_tdiag.inputs import (  # noqa: F401
    DIGITS_NAMES,
    IMAGE_SUFFIXES,
    ImageSet,
    LazyBatches,
    digits_images,
    images_from_dataset,
    images_from_folder,
    load_images,
    text_lines,
)

warnings.warn("hf_tdiag.data_inputs is deprecated; import from hf_tdiag.inputs", DeprecationWarning, stacklevel=2)

__all__ = [
    "DIGITS_NAMES",
    "IMAGE_SUFFIXES",
    "ImageSet",
    "LazyBatches",
    "digits_images",
    "images_from_dataset",
    "images_from_folder",
    "load_images",
    "text_lines",
]
