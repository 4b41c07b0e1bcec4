"""Turn the report command's input options (an image folder, a dataset name, a text file) into ReportInputs."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .loading import LoadedModel, open_image
from .report import ReportInputs, images_to_inputs

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def image_folder(path, limit: int | None = None) -> tuple[list, list[str] | None]:
    """Images under ``path`` (sorted; class sub-folders give label names, as an ImageFolder) and their labels."""
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"images: expected a folder of images, got {str(path)!r} (not a folder)")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"images: no image files ({', '.join(IMAGE_SUFFIXES)}) found under {str(path)!r}")
    if limit is not None:
        files = files[:limit]
    images = [open_image(f) for f in files]
    nested = all(f.parent != root for f in files)
    names = [f.parent.name for f in files] if nested else None
    return images, names


def _label_ids(loaded: LoadedModel, names: list[str] | None) -> list[int] | None:
    """Map class-folder names to the model's label ids (by label name, or by integer folder names)."""
    if names is None or not loaded.is_classifier:
        return None
    label2id = {str(k).lower(): int(v) for k, v in (loaded.config.label2id or {}).items()}
    ids = []
    for name in names:
        key = name.lower()
        if key in label2id:
            ids.append(label2id[key])
        elif name.isdigit() and int(name) < loaded.config.num_labels:
            ids.append(int(name))
        else:
            return None
    return ids


def hub_dataset_images(name: str, split: str, limit: int) -> tuple[list, list[int] | None]:
    """First ``limit`` images (and ClassLabel labels, if any) of a ``datasets`` image dataset."""
    import datasets

    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as err:  # noqa: BLE001 - datasets raises many types for unknown names/offline
        raise ValueError(f"dataset: could not load {name!r} split {split!r} ({type(err).__name__}: {err})") from None
    image_cols = [c for c, f in ds.features.items() if isinstance(f, datasets.Image)]
    if not image_cols:
        raise ValueError(f"dataset: {name!r} has no image column; columns are {list(ds.features)}")
    label_cols = [c for c, f in ds.features.items() if isinstance(f, datasets.ClassLabel)]
    ds = ds.select(range(min(limit, len(ds))))
    images = list(ds[image_cols[0]])
    labels = [int(v) for v in ds[label_cols[0]]] if label_cols else None
    return images, labels


def inputs_from_args(
    loaded: LoadedModel,
    *,
    images=None,
    dataset: str | None = None,
    texts=None,
    split: str = "test",
    limit: int = 64,
) -> ReportInputs | None:
    """ReportInputs from at most one of ``images`` (folder), ``dataset`` (name) or ``texts`` (file); None if none."""
    given = [n for n, v in (("images", images), ("dataset", dataset), ("texts", texts)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"inputs: give one of --images, --dataset or --texts, got {given}")
    if images is not None:
        pil, names = image_folder(images, limit)
        return images_to_inputs(loaded, pil, _label_ids(loaded, names), description=f"images in {images}")
    if dataset is not None:
        if dataset == "digits":
            from hf_tdiag.default_model import digits_test_images

            pil, labels = digits_test_images(limit)
            desc = "scikit-learn digits, held-out split"
        else:
            pil, labels = hub_dataset_images(dataset, split, limit)
            desc = f"{dataset} ({split})"
        if labels is not None and (not loaded.is_classifier or max(labels) >= loaded.config.num_labels):
            labels = None
        return images_to_inputs(loaded, pil, labels, description=desc)
    if texts is not None:
        return text_inputs(loaded, texts, limit)
    return None


def text_inputs(loaded: LoadedModel, path, limit: int) -> ReportInputs:
    """Tokenized lines of a text file (padded batch with attention_mask)."""
    if loaded.modality != "text":
        raise ValueError(f"texts: {loaded.source!r} is a vision model; give --images or --dataset instead")
    if loaded.processor is None:
        raise ValueError(f"texts: no tokenizer found for {loaded.source!r}; save one next to the model")
    if not os.path.isfile(path):
        raise ValueError(f"texts: expected a text file with one input per line, got {str(path)!r}")
    with open(path, encoding="utf-8") as fh:
        lines = [line.strip() for line in fh if line.strip()][:limit]
    if not lines:
        raise ValueError(f"texts: {str(path)!r} has no non-empty lines")
    batch = loaded.processor(lines, padding=True, truncation=True, max_length=128, return_tensors="pt")
    batch = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    return ReportInputs(batch, None, None, f"{len(lines)} lines of {path}")


__all__ = ["IMAGE_SUFFIXES", "hub_dataset_images", "image_folder", "inputs_from_args", "text_inputs"]
