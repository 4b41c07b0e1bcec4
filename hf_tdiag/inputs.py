"""Every image and text input hf-tdiag reads: one PIL converter, one digits loader, datasets (saved folders, image
folders through ``load_dataset("imagefolder")``, names), text files, and uploaded image files.

Image loaders return an :class:`ImageSet` (PIL images, integer labels or None, label names or None, a description of
the source). ``load_images(spec)`` picks the loader from ``spec``:

* ``"digits"`` / ``"sklearn:digits"`` — the 8×8 digits shipped with scikit-learn (no download),
* a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``,
* a folder of image files (class sub-folders become labels), read with ``datasets.load_dataset("imagefolder")``,
* anything else is passed to ``datasets.load_dataset`` (a Hub name or a local loading script / folder).

Array images (:func:`to_pil`): ``uint8`` and other integer arrays hold values 0..255; ``bool`` arrays are 0/255;
float arrays whose values all lie in [0, 1] are scaled by 255 (the matplotlib / torchvision convention), other float
arrays hold values 0..255. Anything outside 0..255, or NaN, is an error naming the input (never silently clipped).

Image files and PIL images (:func:`normalize_image`, used by every path that reads an image: the command line,
the evaluate modules, the report, the Space and the trainer): the EXIF orientation is applied; transparent pixels
are composited onto white (as a viewer shows them; dropping the alpha channel would expose the colour stored under
them, often black); 16-bit images
(PNG, TIFF) are scaled by their real range, 0..65535 -> 0..255; float images (TIFF mode ``F``) and 32-bit integer
images follow the array rule above, so one whose values are not in [0, 1] or 0..255 is refused, never clipped.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ._validation import positive_int

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
DIGITS_NAMES = ("digits", "sklearn:digits", "sklearn/digits")
DIGITS_TEST_SIZE = 0.2
DIGITS_SPLIT_SEED = 0
MAX_IMAGE_PIXELS = 4096 * 4096
MAX_IMAGE_BYTES = 25 * 1024 * 1024
_IMAGE_COLUMNS = ("image", "img", "pixel_values", "images", "picture")
_LABEL_COLUMNS = ("label", "labels", "fine_label", "coarse_label", "class", "target")


class UserInputError(ValueError):
    """Bad input from a person (shown to them verbatim)."""


@dataclass
class ImageSet:
    """PIL images with optional integer labels and label names."""

    images: list[Image.Image]
    labels: list[int] | None
    label_names: list[str] | None
    source: str

    def __len__(self) -> int:
        return len(self.images)


def _check_limit(limit) -> int | None:
    return positive_int(limit, "limit", allow_none=True)


# --------------------------------------------------------------------------- one converter


def check_image_size(image, max_pixels: int = MAX_IMAGE_PIXELS, name: str = "image") -> None:
    """UserInputError when ``image`` (PIL) is empty or has more than ``max_pixels`` pixels."""
    width, height = image.size
    if width * height > max_pixels:
        raise UserInputError(
            f"{name}: {width}x{height} pixels is too large; the limit is {max_pixels:,} pixels (e.g. 4096x4096)"
        )
    if width < 1 or height < 1:
        raise UserInputError(f"{name}: expected a non-empty image, got {width}x{height}")


def _decode(data, name: str, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """Decode an image file (path or bytes): header first, size check, then the pixels; errors name ``name``."""
    try:
        image = Image.open(io.BytesIO(data) if isinstance(data, bytes) else data)
    except Image.DecompressionBombError:  # a header claiming far more pixels than any limit here
        raise UserInputError(
            f"{name}: the image is too large; the limit is {max_pixels:,} pixels (e.g. 4096x4096)"
        ) from None
    except (UnidentifiedImageError, OSError):
        raise UserInputError(f"{name}: not an image file Pillow can read (PNG, JPEG, WebP, BMP, GIF…)") from None
    check_image_size(image, max_pixels, name=name)
    try:
        image.load()
    except (OSError, ValueError) as err:
        raise UserInputError(f"{name}: the image file is damaged or truncated ({err})") from None
    try:
        return normalize_image(image, name)
    except ValueError as err:
        raise UserInputError(str(err)) from None


_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
_EXIF_ORIENTATION = 0x0112


def normalize_image(image: Image.Image, name: str = "image") -> Image.Image:
    """The image as it should be seen: EXIF orientation applied (``ImageOps.exif_transpose``), transparent pixels
    composited onto white, 16-bit modes scaled
    to 8 bits by 255/65535, float and 32-bit integer modes by the array rule (values in [0, 1] or 0..255, else a
    ValueError naming the input); opaque 8-bit modes are returned as they are."""
    from PIL import ImageOps

    fmt = getattr(image, "format", None)
    try:
        orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - a damaged EXIF block: the pixels are still usable as stored
        orientation = 1
    if orientation not in (None, 1):
        image = ImageOps.exif_transpose(image)
    image = _flatten_transparency(image)
    mode = image.mode
    if mode in _SIXTEEN_BIT_MODES or (mode == "I" and fmt == "PNG"):  # Pillow opens 16-bit PNGs as mode I
        arr = np.asarray(image).astype(np.float64)
        if arr.size and (arr.min() < 0 or arr.max() > 65535):
            raise ValueError(f"{name}: a 16-bit image with values outside 0..65535 ({arr.min():g} to {arr.max():g})")
        return Image.fromarray(np.rint(arr * (255.0 / 65535.0)).astype(np.uint8))
    if mode in ("I", "F"):
        words = "a float" if mode == "F" else "a 32-bit integer"
        try:
            return Image.fromarray(_array_to_uint8(np.asarray(image), name))
        except ValueError as err:
            raise ValueError(f"{err} ({words} image; save it with 8 or 16 bits per channel)") from None
    return image


def _flatten_transparency(image: Image.Image) -> Image.Image:
    """An image with transparent pixels composited onto white, as a viewer shows it (``convert`` would drop the
    alpha channel and expose the colour stored under transparent pixels, often black); opaque images unchanged."""
    original, mode = image, image.mode
    if mode in ("P", "L", "RGB") and "transparency" in image.info:
        image = image.convert("LA" if mode == "L" else "RGBA")
    elif mode in ("PA", "RGBa", "La"):
        image = image.convert("LA" if mode == "La" else "RGBA")
    if image.mode not in ("RGBA", "LA") or image.getchannel("A").getextrema()[0] == 255:
        return original  # no transparent pixel: the colour channels are the image
    rgba = image.convert("RGBA")
    flat = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    return flat.convert("RGB" if image.mode == "RGBA" else "L")


def _array_to_uint8(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(f"{name}: expected a numeric image array, got dtype {arr.dtype}")
    if arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty image, got shape {arr.shape}")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.isfinite(arr).all():
            raise ValueError(f"{name}: contains NaN or inf")
        if arr.min() >= 0.0 and arr.max() <= 1.0:
            arr = arr * 255.0
    lo, hi = float(arr.min()), float(arr.max())
    if lo < 0 or hi > 255:
        raise ValueError(
            f"{name}: expected pixel values in 0..255 (or floats in [0, 1]), got values from {lo:g} to {hi:g}"
        )
    return np.rint(arr).astype(np.uint8)


def to_pil(value, name: str = "image") -> Image.Image:
    """One image as a PIL image: a PIL image as is, an encoded file (path, bytes, or a ``datasets`` ``{"bytes",
    "path"}`` dict), or a ``(H, W)`` / ``(H, W, C)`` / ``(C, H, W)`` array (values as in the module docstring)."""
    if isinstance(value, Image.Image):
        return normalize_image(value, name)
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        label = f"{name} {os.path.basename(value['path'])!r}" if value.get("path") else name
        return _decode(value["bytes"] if value.get("bytes") is not None else value["path"], label)
    if isinstance(value, bytes):
        return _decode(value, name)
    if isinstance(value, (str, os.PathLike)):
        return _decode(os.fspath(value), f"{name} {os.path.basename(os.fspath(value))!r}")
    arr = np.asarray(value)
    if arr.ndim == 3 and arr.shape[0] in (1, 3, 4) and arr.shape[-1] not in (1, 3, 4):
        arr = arr.transpose(1, 2, 0)  # channels-first -> channels-last
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[-1] not in (3, 4)):
        raise ValueError(f"{name}: expected an (H, W), (H, W, C) or (C, H, W) image array, got shape {arr.shape}")
    return Image.fromarray(_array_to_uint8(arr, name))


def open_image(path, *, max_pixels: int = MAX_IMAGE_PIXELS, max_bytes: int = MAX_IMAGE_BYTES) -> Image.Image:
    """Open an uploaded image file with size checks before decoding; UserInputError for anything unusable."""
    if path is None or (isinstance(path, str) and not path.strip()):
        raise UserInputError("image: no image given; upload an image or pick a digits example")
    if isinstance(path, Image.Image):
        check_image_size(path, max_pixels)
        try:
            return normalize_image(path)
        except ValueError as err:
            raise UserInputError(str(err)) from None
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise UserInputError(f"image: file not found: {os.path.basename(path)!r}")
    size = os.path.getsize(path)
    if size > max_bytes:
        raise UserInputError(f"image: file is {size / 2**20:.1f} MiB; the limit is {max_bytes / 2**20:.0f} MiB")
    return _decode(path, f"image {os.path.basename(path)!r}", max_pixels)


# --------------------------------------------------------------------------- digits


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1797 digits as ``uint8`` images (N, 8, 8) in 0..255 (values 0..16 scaled) and int64 labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8), digits.target.astype(np.int64)


def digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits recipe's fixed stratified 80/20 split: ``(train_images, test_images, train_labels, test_labels)``."""
    from sklearn.model_selection import train_test_split

    images, labels = digits_arrays()
    return train_test_split(images, labels, test_size=DIGITS_TEST_SIZE, random_state=DIGITS_SPLIT_SEED, stratify=labels)


def digits_images(limit: int | None = None, rgb: bool = False, split: str | None = None) -> ImageSet:
    """Digits as grayscale (or RGB) PIL images with labels: all 1797 in scikit-learn's order (``split=None``) or
    the recipe's ``"train"`` / ``"test"`` split (:func:`digits_split`); the first ``limit``."""
    limit = _check_limit(limit)
    if split is None:
        images, labels = digits_arrays()
    elif split in ("train", "test"):
        x_train, x_test, y_train, y_test = digits_split()
        images, labels = (x_train, y_train) if split == "train" else (x_test, y_test)
    else:
        raise ValueError(f"split: expected None, 'train' or 'test' for the digits, got {split!r}")
    images, labels = images[:limit], labels[:limit]
    pil = [Image.fromarray(a) for a in images]  # 2-D uint8: mode "L"
    if rgb:
        pil = [im.convert("RGB") for im in pil]
    source = "sklearn:digits" if split is None else f"sklearn:digits[{split}]"
    return ImageSet(pil, [int(t) for t in labels], [str(i) for i in range(10)], source)


def digits_test_images(limit: int | None = None) -> tuple[list[Image.Image], list[int]]:
    """The digits recipe's held-out test images (mode ``L``, 8×8) and their labels."""
    found = digits_images(limit, split="test")
    return found.images, found.labels


# --------------------------------------------------------------------------- datasets


def is_saved_dataset(path) -> bool:
    """True when ``path`` is a folder written by ``save_to_disk``."""
    path = Path(path)
    return path.is_dir() and any(
        (path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json")
    )


def open_dataset(spec, config_name: str | None = None, split: str | None = None):
    """A ``datasets`` Dataset/DatasetDict from a ``save_to_disk`` folder, an image folder (``imagefolder``) or a
    ``load_dataset`` name; ValueError naming ``dataset`` when it cannot be opened."""
    import datasets

    spec = os.fspath(spec)
    try:
        if is_saved_dataset(spec):  # every split: pick_split chooses and names the missing one
            return datasets.load_from_disk(spec)
        if _is_image_folder(Path(spec)):
            return datasets.load_dataset("imagefolder", data_dir=spec)
        kwargs = {} if split is None else {"split": split}
        return datasets.load_dataset(spec, config_name, **kwargs)
    except Exception as err:  # noqa: BLE001 - datasets raises many types for unknown names / offline mode
        raise ValueError(
            f"dataset: could not load {spec!r} as a saved dataset folder, an image folder or a datasets name "
            f"({type(err).__name__}: {' '.join(str(err).split())[:300]})"
        ) from None


def image_folder_splits(train_dir, validation_dir=None):
    """``DatasetDict`` with ``train`` (and ``validation``) from image folders with one sub-folder per class."""
    import datasets

    for flag, folder in (("train_dir", train_dir), ("validation_dir", validation_dir)):
        if folder is not None and not os.path.isdir(folder):
            raise ValueError(f"{flag}: expected a folder of class sub-folders of images, got {str(folder)!r}")
    files = {"train": os.path.join(train_dir, "**")}
    if validation_dir:
        files["validation"] = os.path.join(validation_dir, "**")
    return datasets.load_dataset("imagefolder", data_files=files)


def _check_utf8_names(folder: Path) -> None:
    """ValueError naming the first file or folder whose name is not valid UTF-8 (the datasets library cannot read
    it, and would report the whole folder as a failed dataset); the folder's own name included."""
    for p in [folder, *folder.rglob("*")]:
        try:
            os.fsencode(p.name).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(
                f"images: the name {os.fsencode(p.name)!r} in {os.fsdecode(os.fsencode(p.parent))!r} is not valid "
                "UTF-8 (written on a system with another encoding); rename it"
            ) from None


def _is_image_folder(path: Path) -> bool:
    return path.is_dir() and any(p.suffix.lower() in IMAGE_SUFFIXES for p in path.rglob("*") if p.is_file())


def _pick_column(features, names: Sequence[str], kind) -> str | None:
    typed = [c for c, f in features.items() if isinstance(f, kind)]
    if typed:
        return typed[0]
    return next((c for c in names if c in features), None)


def pick_split(ds, split: str | None, spec: str):
    """One split of a DatasetDict: ``split``, else the first of test / validation / train (then any)."""
    import datasets

    if not isinstance(ds, datasets.DatasetDict):
        return ds, split
    if split is None:
        split = next((s for s in ("test", "validation", "train") if s in ds), next(iter(ds)))
    if split not in ds:
        raise ValueError(f"split: {spec!r} has splits {list(ds)}, got {split!r}")
    return ds[split], split


def _images_of(ds, column: str) -> list[Image.Image]:
    """Decode ``column`` ourselves (so a bad file is named), one converter for every feature type."""
    import datasets

    if isinstance(ds.features[column], datasets.Image):
        ds = ds.cast_column(column, datasets.Image(decode=False))
    return [to_pil(v, f"images[{i}]") for i, v in enumerate(ds[column])]


def images_from_dataset(
    name_or_path,
    split: str | None = None,
    limit: int | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
) -> ImageSet:
    """Images (and labels) of a dataset: a ``save_to_disk`` folder, an image folder or a ``load_dataset`` name.

    ``split`` defaults to the first of test / validation / train that exists. Columns are found from the
    features (an ``Image`` column; a ``ClassLabel`` column) unless named.
    """
    import datasets

    limit = _check_limit(limit)
    spec = os.fspath(name_or_path)
    ds, split = pick_split(open_dataset(spec, split=split), split, spec)
    image_column = image_column or _pick_column(ds.features, _IMAGE_COLUMNS, datasets.Image)
    if image_column is None or image_column not in ds.features:
        raise ValueError(f"image_column: {spec!r} has no image column; columns are {list(ds.features)}")
    if label_column is None:
        label_column = _pick_column(ds.features, _LABEL_COLUMNS, datasets.ClassLabel)
    elif label_column not in ds.features:
        raise ValueError(f"label_column: {spec!r} has no column {label_column!r}; columns are {list(ds.features)}")
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    images = _images_of(ds, image_column)
    labels = names = None
    if label_column is not None:
        labels = [int(v) for v in ds[label_column]]
        feature = ds.features[label_column]
        names = list(feature.names) if isinstance(feature, datasets.ClassLabel) else None
    return ImageSet(images, labels, names, spec + (f"[{split}]" if split else ""))


def images_from_folder(path, limit: int | None = None, split: str | None = None) -> ImageSet:
    """Image files under ``path`` via ``load_dataset("imagefolder")``: class sub-folders become labels (``train/``,
    ``test/`` … sub-folders become splits, as ``imagefolder`` reads them; ``split`` picks one, default test)."""
    if not Path(path).is_dir():
        raise ValueError(f"images: expected a folder of images, got {str(path)!r} (not a folder)")
    if not _is_image_folder(Path(path)):
        raise ValueError(f"images: no image files ({', '.join(IMAGE_SUFFIXES)}) found under {str(path)!r}")
    _check_utf8_names(Path(path))
    found = images_from_dataset(path, split=split, limit=limit)
    found.source = os.fspath(path)
    return found


def load_images(spec, *, split: str | None = None, limit: int | None = None, **dataset_kwargs) -> ImageSet:
    """Load images from ``spec``: ``digits``, a ``save_to_disk`` folder, an image folder or a datasets name."""
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"spec: expected a folder path, 'digits' or a datasets name, got {type(spec).__name__}")
    text = os.fspath(spec)
    if text.strip().lower() in DIGITS_NAMES:
        return digits_images(limit=limit, split=split)
    if os.path.isdir(text) and not any(os.scandir(text)):
        raise ValueError(
            f"{text!r}: the folder is empty; expected image files (class sub-folders allowed) or a saved dataset"
        )
    if not is_saved_dataset(text) and _is_image_folder(Path(text)) and not dataset_kwargs:
        return images_from_folder(text, limit=limit, split=split)
    return images_from_dataset(text, split=split, limit=limit, **dataset_kwargs)


# --------------------------------------------------------------------------- text and batching


def text_lines(path, limit: int | None = None) -> list[str]:
    """The non-empty, stripped lines of a UTF-8 text file (one input per line), at most ``limit``; a byte-order mark
    at its start (Windows editors write one) is not part of the first text."""
    limit = _check_limit(limit)
    if not os.path.isfile(path):
        why = "is a folder" if os.path.isdir(path) else "does not exist"
        raise ValueError(f"texts: {str(path)!r} {why}; expected a text file with one input per line")
    try:
        with open(path, encoding="utf-8-sig") as fh:
            lines = [line.strip() for line in fh if line.strip()][:limit]
    except UnicodeDecodeError as err:
        raise ValueError(f"texts: {str(path)!r} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not lines:
        raise ValueError(f"texts: {str(path)!r} has no non-empty lines")
    return lines


def check_texts(texts, name: str = "texts") -> None:
    """A list of non-blank strings, or an error naming the first bad entry (one string is refused, not split into
    its characters; an empty text is refused, not measured as its special tokens alone)."""
    if isinstance(texts, str):
        raise TypeError(f"{name}: expected a list of strings, got one string; pass {name}=[...]")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}]: expected a string, got {type(text).__name__}")
        if not text.strip():
            raise ValueError(f"{name}[{i}]: the text is empty; remove it or give it some words")


class LazyBatches:
    """A sized iterable that converts ``items`` chunk by chunk (``convert(items[i:i+batch_size])``) when iterated.

    Lets a long list of PIL images or strings stream through a processor/tokenizer batch by batch instead of
    materialising every tensor at once (``len()`` is the number of batches, for progress bars).
    """

    def __init__(self, items: Sequence, batch_size: int, convert):
        positive_int(batch_size, "batch_size")
        if len(items) == 0:
            raise ValueError("items: expected at least one item, got none")
        self.items, self.batch_size, self.convert = items, batch_size, convert

    def __len__(self) -> int:
        return (len(self.items) + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        for start in range(0, len(self.items), self.batch_size):
            yield self.convert(self.items[start : start + self.batch_size])


__all__ = [
    "DIGITS_NAMES",
    "IMAGE_SUFFIXES",
    "ImageSet",
    "LazyBatches",
    "UserInputError",
    "check_image_size",
    "check_texts",
    "digits_arrays",
    "digits_images",
    "digits_split",
    "digits_test_images",
    "image_folder_splits",
    "images_from_dataset",
    "images_from_folder",
    "is_saved_dataset",
    "load_images",
    "normalize_image",
    "open_dataset",
    "open_image",
    "pick_split",
    "text_lines",
    "to_pil",
]
