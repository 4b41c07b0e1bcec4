"""Load images as PIL images from a folder, a ``datasets`` dataset (Hub name or ``save_to_disk`` folder) or
scikit-learn's digits, for the command line, recipes, report and Space.

Everything returns an :class:`ImageSet` (images, integer labels or None, label names or None, a description
of the source). ``load_images(spec)`` picks the right loader from ``spec``:

* ``"digits"`` / ``"sklearn:digits"`` — the 8×8 digits shipped with scikit-learn (no download),
* a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``,
* a folder of image files (class sub-folders become labels, as torchvision's ImageFolder),
* anything else is passed to ``datasets.load_dataset`` (a Hub name or a local loading script / folder).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from PIL import Image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
DIGITS_NAMES = ("digits", "sklearn:digits", "sklearn/digits")
_IMAGE_COLUMNS = ("image", "img", "pixel_values", "images")
_LABEL_COLUMNS = ("label", "labels", "fine_label", "coarse_label", "class", "target")


@dataclass
class ImageSet:
    """PIL images with optional integer labels and label names."""

    images: List[Image.Image]
    labels: Optional[List[int]]
    label_names: Optional[List[str]]
    source: str

    def __len__(self) -> int:
        return len(self.images)


def _check_limit(limit) -> Optional[int]:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit: expected a positive int or None, got {limit!r}")
    return limit


def digits_images(limit: int | None = None, rgb: bool = False) -> ImageSet:
    """scikit-learn's 8×8 digits (values 0..16 scaled to 0..255) as grayscale (or RGB) PIL images with labels."""
    import numpy as np
    from sklearn.datasets import load_digits

    limit = _check_limit(limit)
    digits = load_digits()
    data = digits.images if limit is None else digits.images[:limit]
    target = digits.target if limit is None else digits.target[:limit]
    images = []
    for arr in data:
        im = Image.fromarray(np.clip(np.round(arr * (255.0 / 16.0)), 0, 255).astype(np.uint8))  # 2-D uint8: mode "L"
        images.append(im.convert("RGB") if rgb else im)
    return ImageSet(images, [int(t) for t in target], [str(n) for n in digits.target_names], "sklearn:digits")


def images_from_folder(path, limit: int | None = None) -> ImageSet:
    """Image files under ``path`` (sorted); when every file sits in a class sub-folder, folder names are labels."""
    limit = _check_limit(limit)
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"images: expected a folder of images, got {str(path)!r} (not a folder)")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"images: no image files ({', '.join(IMAGE_SUFFIXES)}) found under {str(path)!r}")
    if limit is not None:
        files = files[:limit]
    images = []
    for f in files:
        with Image.open(f) as im:
            im.load()
            images.append(im.copy())
    labels = names = None
    if all(f.parent != root for f in files):
        names = sorted({f.parent.relative_to(root).as_posix() for f in files})
        index = {n: i for i, n in enumerate(names)}
        labels = [index[f.parent.relative_to(root).as_posix()] for f in files]
    return ImageSet(images, labels, names, str(root))


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any(
        (path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json")
    )


def _pick_column(features, names: Sequence[str], kind) -> Optional[str]:
    typed = [c for c, f in features.items() if isinstance(f, kind)]
    if typed:
        return typed[0]
    return next((c for c in names if c in features), None)


def images_from_dataset(
    name_or_path,
    split: str | None = None,
    limit: int | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
) -> ImageSet:
    """Images (and labels) of a ``datasets`` dataset: a ``save_to_disk`` folder or a ``load_dataset`` name.

    ``split`` defaults to the first of test / validation / train that exists. Columns are found from the
    features (an ``Image`` column; a ``ClassLabel`` column) unless named.
    """
    import datasets

    limit = _check_limit(limit)
    spec = os.fspath(name_or_path)
    try:
        if _is_saved_dataset(Path(spec)):
            ds = datasets.load_from_disk(spec)
        else:
            ds = datasets.load_dataset(spec) if split is None else datasets.load_dataset(spec, split=split)
    except Exception as err:  # noqa: BLE001 - datasets raises many types for unknown names / offline mode
        raise ValueError(
            f"dataset: could not load {spec!r} as a saved dataset folder or a datasets name "
            f"({type(err).__name__}: {' '.join(str(err).split())[:300]})"
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        if split is None:
            split = next((s for s in ("test", "validation", "train") if s in ds), next(iter(ds)))
        if split not in ds:
            raise ValueError(f"split: {spec!r} has splits {list(ds)}, got {split!r}")
        ds = ds[split]
    image_column = image_column or _pick_column(ds.features, _IMAGE_COLUMNS, datasets.Image)
    if image_column is None or image_column not in ds.features:
        raise ValueError(f"image_column: {spec!r} has no image column; columns are {list(ds.features)}")
    if label_column is None:
        label_column = _pick_column(ds.features, _LABEL_COLUMNS, datasets.ClassLabel)
    elif label_column not in ds.features:
        raise ValueError(f"label_column: {spec!r} has no column {label_column!r}; columns are {list(ds.features)}")
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    images = [_to_pil(v, image_column) for v in ds[image_column]]
    labels = names = None
    if label_column is not None:
        labels = [int(v) for v in ds[label_column]]
        feature = ds.features[label_column]
        names = list(feature.names) if isinstance(feature, datasets.ClassLabel) else None
    return ImageSet(images, labels, names, f"{spec}" + (f"[{split}]" if split else ""))


def _to_pil(value, column: str) -> Image.Image:
    if isinstance(value, Image.Image):
        return value
    import numpy as np

    arr = np.asarray(value)
    if arr.ndim in (2, 3):
        if arr.dtype != np.uint8:
            arr = np.clip(arr * (255.0 if arr.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
        if arr.ndim == 3 and arr.shape[0] in (1, 3) and arr.shape[-1] not in (1, 3):
            arr = arr.transpose(1, 2, 0)  # channels-first -> channels-last
        if arr.ndim == 3 and arr.shape[-1] == 1:
            arr = arr[..., 0]
        return Image.fromarray(arr)
    raise ValueError(f"image_column: values of {column!r} are not images (got an array of shape {arr.shape})")


class LazyBatches:
    """A sized iterable that converts ``items`` chunk by chunk (``convert(items[i:i+batch_size])``) when iterated.

    Lets a long list of PIL images or strings stream through a processor/tokenizer batch by batch instead of
    materialising every tensor at once (``len()`` is the number of batches, for progress bars).
    """

    def __init__(self, items: Sequence, batch_size: int, convert):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        if len(items) == 0:
            raise ValueError("items: expected at least one item, got none")
        self.items, self.batch_size, self.convert = items, batch_size, convert

    def __len__(self) -> int:
        return (len(self.items) + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        for start in range(0, len(self.items), self.batch_size):
            yield self.convert(self.items[start : start + self.batch_size])


def text_lines(path, limit: int | None = None) -> list[str]:
    """The non-empty, stripped lines of a UTF-8 text file (one input per line), at most ``limit``."""
    limit = _check_limit(limit)
    if not os.path.isfile(path):
        raise ValueError(f"texts: expected a text file with one input per line, got {str(path)!r}")
    with open(path, encoding="utf-8") as fh:
        lines = [line.strip() for line in fh if line.strip()][:limit]
    if not lines:
        raise ValueError(f"texts: {str(path)!r} has no non-empty lines")
    return lines


def load_images(spec, *, split: str | None = None, limit: int | None = None, **dataset_kwargs) -> ImageSet:
    """Load images from ``spec``: ``digits``, a ``save_to_disk`` folder, an image folder or a datasets name."""
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"spec: expected a folder path, 'digits' or a datasets name, got {type(spec).__name__}")
    text = os.fspath(spec)
    if text.strip().lower() in DIGITS_NAMES:
        return digits_images(limit=limit)
    path = Path(text)
    if _is_saved_dataset(path):
        return images_from_dataset(path, split=split, limit=limit, **dataset_kwargs)
    if path.is_dir() and any(p.suffix.lower() in IMAGE_SUFFIXES for p in path.rglob("*") if p.is_file()):
        return images_from_folder(path, limit=limit)
    return images_from_dataset(text, split=split, limit=limit, **dataset_kwargs)


__all__ = ["ImageSet", "LazyBatches", "IMAGE_SUFFIXES", "digits_images", "images_from_folder", "images_from_dataset", "load_images"]
