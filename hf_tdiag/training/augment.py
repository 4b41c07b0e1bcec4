"""Training augmentations on PIL images with a numpy ``Generator`` (no torchvision).

Each function takes the random generator explicitly, so the trainer can derive
one generator per (seed, epoch, sample index) and an interrupted run that is
resumed sees exactly the same augmented images as an uninterrupted one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageOps

from .._validation import non_negative_int
from ..models.crate.configuration_crate import size_pair

Augmentation = Callable[[Image.Image, np.random.Generator], Image.Image]


def _check_image(img) -> None:
    if not isinstance(img, Image.Image):
        raise TypeError(f"img: expected a PIL.Image.Image, got {type(img).__name__}")


def _check_size(size) -> tuple[int, int]:
    height, width = size_pair(size, "size")
    if height < 1 or width < 1:
        raise ValueError(f"size: expected a positive int or (height, width), got {size!r}")
    return height, width


def random_resized_crop_box(
    width: int,
    height: int,
    rng: np.random.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
) -> tuple[int, int, int, int]:
    """Crop box ``(left, top, right, bottom)`` covering a random area fraction in ``scale`` with aspect ratio in ``ratio``.

    Ten tries as in Inception-style training; falls back to the largest centred crop whose ratio is within bounds.
    """
    if not (0 < scale[0] <= scale[1] <= 1):
        raise ValueError(f"scale: expected 0 < low <= high <= 1, got {scale!r}")
    if not (0 < ratio[0] <= ratio[1]):
        raise ValueError(f"ratio: expected 0 < low <= high, got {ratio!r}")
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    top, left = (height - h) // 2, (width - w) // 2
    return left, top, left + w, top + h


def random_resized_crop(
    img: Image.Image,
    size: int | tuple[int, int],
    rng: np.random.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
    resample: int = Image.BICUBIC,
) -> Image.Image:
    """Crop a random box (see :func:`random_resized_crop_box`) and resize it to ``size`` = (height, width)."""
    _check_image(img)
    height, width = _check_size(size)
    box = random_resized_crop_box(img.width, img.height, rng, scale, ratio)
    return img.resize((width, height), resample=resample, box=box)


def pad_crop(img: Image.Image, padding: int, rng: np.random.Generator, fill: int = 0) -> Image.Image:
    """Pad every side by ``padding`` pixels of ``fill`` and crop back to the original size at a random offset."""
    _check_image(img)
    non_negative_int(padding, "padding")
    if padding == 0:
        return img
    padded = ImageOps.expand(img, border=padding, fill=fill)
    left = int(rng.integers(0, 2 * padding + 1))
    top = int(rng.integers(0, 2 * padding + 1))
    return padded.crop((left, top, left + img.width, top + img.height))


def horizontal_flip(img: Image.Image, p: float, rng: np.random.Generator) -> Image.Image:
    """Mirror left-right with probability ``p``."""
    _check_image(img)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p: expected a probability in [0, 1], got {p!r}")
    if rng.random() < p:
        return img.transpose(Image.FLIP_LEFT_RIGHT)
    return img


def build_augmentation(kind: str, image_size: int | tuple[int, int], hflip: float = 0.5) -> Augmentation | None:
    """Training augmentation ``f(img, rng)`` for ``kind`` in ``none | pad_crop | random_resized_crop`` (or None)."""
    height, width = _check_size(image_size)
    if kind == "none":
        if hflip == 0:
            return None

        def flip_only(img, rng):
            return horizontal_flip(img, hflip, rng)

        return flip_only
    if kind == "pad_crop":
        padding = max(1, round(min(height, width) / 8))  # 4 px at 32 px, as for CIFAR

        def pad_crop_flip(img, rng):
            img = img.resize((width, height), resample=Image.BICUBIC) if img.size != (width, height) else img
            return horizontal_flip(pad_crop(img, padding, rng), hflip, rng)

        return pad_crop_flip
    if kind == "random_resized_crop":

        def rrc_flip(img, rng):
            return horizontal_flip(random_resized_crop(img, (height, width), rng), hflip, rng)

        return rrc_flip
    raise ValueError(f"kind: expected 'none', 'pad_crop' or 'random_resized_crop', got {kind!r}")


__all__ = [
    "random_resized_crop_box",
    "random_resized_crop",
    "pad_crop",
    "horizontal_flip",
    "build_augmentation",
]
