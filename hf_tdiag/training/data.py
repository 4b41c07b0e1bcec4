"""Image-classification data for the trainer.

Sources, in the order the flags are checked:

* ``--dataset_path``: a ``DatasetDict`` written with ``save_to_disk``;
* ``--dataset_name``: anything ``datasets.load_dataset`` accepts (a Hub id such as ``cifar10``, a local folder);
* ``--train_dir`` / ``--validation_dir``: local image folders with one sub-folder per class (``imagefolder``);
* ``train(train_dataset=..., eval_dataset=...)``: a ``datasets.Dataset``, ``DatasetDict``, ``IterableDataset`` or
  a torch ``Dataset`` of ``(image, label)`` pairs or dicts (the last two read once into memory), with the image
  column ``image``/``img`` and the label column ``label``/``labels`` as in Transformers'
  ``run_image_classification.py`` (``--image-column-name`` / ``--label-column-name`` pick others);
* none of them: scikit-learn's 8x8 digits (shipped with scikit-learn, works offline) with a fixed stratified
  80/20 train/test split (``random_state=0``), 1437 training and 360 test images.

Loading happens in two phases: :func:`load_raw_data` reads images and labels (so the model can be sized from
them), then :func:`build_datasets` wraps them into torch datasets that apply augmentation and the image processor.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ..inputs import digits_split, image_folder_splits, open_dataset, to_pil
from .augment import build_augmentation

_IMAGE_COLUMNS = ("image", "img", "pixel_values", "picture")
_LABEL_COLUMNS = ("label", "labels", "fine_label", "class", "target")
_EVAL_SPLITS = ("validation", "valid", "val", "test")
_SPLIT_FOLDERS = ("train", "training")
# builders whose name is not a dataset's (a local folder or file, an in-memory generator)
_LOCAL_BUILDERS = ("imagefolder", "audiofolder", "parquet", "json", "csv", "arrow", "text", "generator", "webdataset")
IN_MEMORY = "in-memory"


@dataclass
class RawImageData:
    """Images and labels before any transform."""

    name: str  # human readable, for logs and the model card
    dataset_id: str  # Hub id / folder / "sklearn-digits"
    train: Any  # datasets.Dataset or a dict with "images" (N, H, W) uint8 and "labels" (N,)
    eval: Any
    labels: list[str]
    image_column: str = "image"
    label_column: str = "label"
    image_size: tuple[int, int] = (8, 8)  # (height, width) of the first training image
    num_channels: int = 3
    eval_split: str = "validation"
    is_digits: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def num_train(self) -> int:
        return len(self.train["labels"]) if self.is_digits else len(self.train)

    @property
    def num_eval(self) -> int:
        return len(self.eval["labels"]) if self.is_digits else len(self.eval)


def _load_digits() -> RawImageData:
    x_train, x_test, y_train, y_test = digits_split()
    return RawImageData(
        name="scikit-learn digits (8x8 grayscale, fixed stratified 80/20 split, random_state=0)",
        dataset_id="sklearn-digits",
        train={"images": x_train, "labels": y_train},
        eval={"images": x_test, "labels": y_test},
        labels=[str(i) for i in range(10)],
        image_size=(8, 8),
        num_channels=1,
        eval_split="test",
        is_digits=True,
    )


def _pick_column(columns, wanted, candidates, what, flag) -> str:
    if wanted is not None:
        if wanted not in columns:
            raise ValueError(f"{flag}: column {wanted!r} not in the dataset's columns {list(columns)}")
        return wanted
    for name in candidates:
        if name in columns:
            return name
    raise ValueError(f"{flag}: could not find the {what} column among {list(columns)}; pass {flag}")


def _load_hf(args) -> RawImageData:
    if args.dataset_path:
        if not os.path.isdir(args.dataset_path):
            raise FileNotFoundError(f"dataset_path: {args.dataset_path!r} is not a folder written with save_to_disk")
        ds = open_dataset(args.dataset_path)
        dataset_id = os.path.abspath(args.dataset_path)
    elif args.dataset_name:
        ds = open_dataset(args.dataset_name, args.dataset_config_name)
        dataset_id = args.dataset_name
    else:
        ds = image_folder_splits(args.train_dir, args.validation_dir)
        dataset_id = os.path.abspath(args.train_dir)
    if args.dataset_name:
        name = args.dataset_name
    else:
        folder = os.path.normpath(args.dataset_path or args.train_dir)
        name = os.path.basename(folder)
        if args.train_dir and name.lower() in _SPLIT_FOLDERS:  # data/flowers/train: the dataset is "flowers"
            name = os.path.basename(os.path.dirname(folder)) or name
    return _raw_from_splits(ds, args, dataset_id, name)


def _raw_from_splits(ds, args, dataset_id: str, name: str) -> RawImageData:
    """Images and label names from a ``Dataset``/``DatasetDict``: the train split, an evaluation split (or a
    held-out fraction of train), the image and label columns, the label names and the image size/channels."""
    import datasets

    if isinstance(ds, datasets.Dataset):
        ds = datasets.DatasetDict({"train": ds})
    if "train" not in ds:
        raise ValueError(f"dataset: expected a 'train' split, got splits {list(ds)}")
    eval_split = next((s for s in _EVAL_SPLITS if s in ds), None)
    train = ds["train"]
    if eval_split is None:
        if not 0 < args.train_val_split < 1:
            raise ValueError(
                f"train_val_split: the dataset has no validation/test split, so a fraction in (0, 1) is needed, "
                f"got {args.train_val_split!r}"
            )
        split = train.train_test_split(test_size=args.train_val_split, seed=args.seed, stratify_by_column=None)
        train, evaluation, eval_split = split["train"], split["test"], f"train[{args.train_val_split:g} held out]"
    else:
        evaluation = ds[eval_split]
    columns = train.column_names
    image_column = _pick_column(columns, args.image_column_name, _IMAGE_COLUMNS, "image", "--image_column_name")
    label_column = _pick_column(columns, args.label_column_name, _LABEL_COLUMNS, "label", "--label_column_name")
    feature = train.features[label_column]
    if isinstance(feature, datasets.ClassLabel):
        labels = list(feature.names)
    else:
        values = sorted(set(train[label_column]) | set(evaluation[label_column]))
        if values != list(range(len(values))):
            mapping = {v: i for i, v in enumerate(values)}
            train = train.map(lambda ex: {label_column: mapping[ex[label_column]]})
            evaluation = evaluation.map(lambda ex: {label_column: mapping[ex[label_column]]})
        labels = [str(v) for v in values]
    if args.max_train_samples:
        train = train.select(range(min(args.max_train_samples, len(train))))
    if args.max_eval_samples:
        evaluation = evaluation.select(range(min(args.max_eval_samples, len(evaluation))))
    first = to_pil(train[0][image_column], image_column)
    channels = 1 if first.mode in ("L", "1", "I", "F", "I;16") else 3
    return RawImageData(
        name=name,
        dataset_id=dataset_id,
        train=train,
        eval=evaluation,
        labels=labels,
        image_column=image_column,
        label_column=label_column,
        image_size=(first.height, first.width),
        num_channels=channels,
        eval_split=eval_split,
    )


def _row(item, name: str) -> dict:
    """One torch-dataset item as a row: ``(image, label)`` pairs or dicts with image and label columns."""
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return {"image": to_pil(item[0], name), "label": int(item[1])}
    if not isinstance(item, Mapping):
        raise TypeError(f"{name}: expected (image, label) pairs or dicts of columns, got {type(item).__name__}")
    image = next((k for k in _IMAGE_COLUMNS if k in item), None)
    label = next((k for k in _LABEL_COLUMNS if k in item), None)
    if image is None or label is None:
        raise ValueError(
            f"{name}: expected an image column ({', '.join(_IMAGE_COLUMNS)}) and a label column "
            f"({', '.join(_LABEL_COLUMNS)}), got {list(item)}"
        )
    return {image: to_pil(item[image], f"{name}[{image!r}]"), label: int(item[label])}


def as_hf_dataset(data, name: str):
    """A ``datasets.Dataset`` of ``data``: a ``Dataset`` as is, an ``IterableDataset`` or a torch ``Dataset`` read
    once into memory (the trainer needs the length and random access, for epoch shuffling and exact resume)."""
    import datasets

    if isinstance(data, datasets.Dataset):
        return data
    if isinstance(data, datasets.IterableDataset):
        rows = list(data)
        features = data.features
        return datasets.Dataset.from_list(rows, features=features) if features else datasets.Dataset.from_list(rows)
    if isinstance(data, Dataset) and hasattr(data, "__len__"):
        return datasets.Dataset.from_list([_row(data[i], f"{name}[{i}]") for i in range(len(data))])
    raise TypeError(
        f"{name}: expected a datasets.Dataset, DatasetDict, IterableDataset or a sized torch Dataset, "
        f"got {type(data).__name__}"
    )


def _object_id(data) -> str:
    """The Hub name a ``datasets`` object was loaded from (``in-memory`` for local builders and torch datasets)."""
    info = getattr(data, "info", None)
    if info is None and hasattr(data, "values"):  # a DatasetDict: its splits' info
        info = getattr(next(iter(data.values()), None), "info", None)
    name = getattr(info, "dataset_name", None)
    return name if isinstance(name, str) and name and name not in _LOCAL_BUILDERS else IN_MEMORY


def _load_objects(args, train_dataset, eval_dataset) -> RawImageData:
    """``train(train_dataset=..., eval_dataset=...)``: the data objects as the flags' datasets are read."""
    import datasets

    if isinstance(train_dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        splits = {k: as_hf_dataset(v, f"train_dataset[{k!r}]") for k, v in train_dataset.items()}
        if eval_dataset is not None:
            splits = {k: v for k, v in splits.items() if k not in _EVAL_SPLITS}
    else:
        splits = {"train": as_hf_dataset(train_dataset, "train_dataset")}
    if eval_dataset is not None:
        if isinstance(eval_dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
            raise TypeError("eval_dataset: expected one split (a Dataset), got a DatasetDict; pass eval_dataset[split]")
        splits["validation"] = as_hf_dataset(eval_dataset, "eval_dataset")
    dataset_id = _object_id(train_dataset)
    return _raw_from_splits(datasets.DatasetDict(splits), args, dataset_id, dataset_id)


def load_raw_data(args, train_dataset=None, eval_dataset=None) -> RawImageData:
    """Images and label names from the data objects, else the dataset flags of ``args`` (digits when none is set)."""
    from .args import is_digits

    if train_dataset is not None:
        return _load_objects(args, train_dataset, eval_dataset)
    if eval_dataset is not None:
        raise ValueError("eval_dataset: given without train_dataset; pass train_dataset too")
    if is_digits(args):
        raw = _load_digits()
        if args.max_train_samples:
            raw.train = {k: v[: args.max_train_samples] for k, v in raw.train.items()}
        if args.max_eval_samples:
            raw.eval = {k: v[: args.max_eval_samples] for k, v in raw.eval.items()}
        return raw
    return _load_hf(args)


class TensorImageDataset(Dataset):
    """Pre-processed ``pixel_values`` (N, C, H, W) and ``labels`` (N,) held in memory."""

    def __init__(self, pixel_values: torch.Tensor, labels: torch.Tensor):
        if pixel_values.shape[0] != labels.shape[0]:
            raise ValueError(
                f"labels: expected {pixel_values.shape[0]} labels for {pixel_values.shape[0]} images, got {labels.shape[0]}"
            )
        self.pixel_values = pixel_values
        self.labels = labels

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, index: int) -> dict:
        return {"pixel_values": self.pixel_values[index], "labels": self.labels[index]}


class ProcessedImageDataset(Dataset):
    """A ``datasets.Dataset`` of images seen through an optional augmentation and the image processor.

    The augmentation of sample ``i`` in epoch ``e`` uses ``numpy.random.default_rng([seed, e, i])``: it does not
    depend on worker count, process count or on where a resumed run started.
    """

    def __init__(self, dataset, image_column, label_column, processor, mode, augmentation=None, seed=0):
        self.dataset = dataset
        self.image_column = image_column
        self.label_column = label_column
        self.processor = processor
        self.mode = mode
        self.augmentation = augmentation
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        example = self.dataset[int(index)]
        img = to_pil(example[self.image_column], f"{self.image_column}[{index}]").convert(self.mode)
        if self.augmentation is not None:
            img = self.augmentation(img, np.random.default_rng([self.seed, self.epoch, int(index)]))
        pixel_values = self.processor(img, return_tensors="pt")["pixel_values"][0]
        return {"pixel_values": pixel_values, "labels": torch.tensor(int(example[self.label_column]))}


@dataclass
class ImageDatasets:
    train: Dataset  # augmented
    eval: Dataset
    train_eval: Dataset  # training images without augmentation (generalization gap)
    augmentation: str


def resolve_augmentation(args, raw: RawImageData, image_size: tuple[int, int]) -> tuple[str, float]:
    """``(kind, hflip)`` after resolving ``auto``: none for digits, pad_crop up to 64 px, random_resized_crop above."""
    kind = args.augmentation
    if kind == "auto":
        if raw.is_digits:
            kind = "none"
        else:
            kind = "pad_crop" if max(image_size) <= 64 else "random_resized_crop"
    hflip = args.hflip if args.hflip is not None else (0.0 if raw.is_digits else 0.5)
    return kind, hflip


def build_datasets(args, raw: RawImageData, processor, num_channels: int, image_size: tuple[int, int]) -> ImageDatasets:
    """Torch datasets of ``{"pixel_values", "labels"}`` for training, evaluation and the train-set evaluation."""
    kind, hflip = resolve_augmentation(args, raw, image_size)
    augmentation = build_augmentation(kind, image_size, hflip)
    description = kind if hflip == 0 else f"{kind} + horizontal flip (p={hflip:g})"
    mode = "L" if num_channels == 1 else "RGB"
    if raw.is_digits and augmentation is None:

        def encode(part):
            images = [Image.fromarray(img).convert(mode) for img in part["images"]]
            pixel_values = processor(images, return_tensors="pt")["pixel_values"]
            return TensorImageDataset(pixel_values, torch.as_tensor(part["labels"], dtype=torch.long))

        train = encode(raw.train)
        return ImageDatasets(train=train, eval=encode(raw.eval), train_eval=train, augmentation=description)
    if raw.is_digits:  # digits with an explicit augmentation: wrap the arrays as a datasets.Dataset
        import datasets

        def as_ds(part):
            return datasets.Dataset.from_dict(
                {"image": [Image.fromarray(i) for i in part["images"]], "label": part["labels"].tolist()},
                features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")}),
            )

        train_ds, eval_ds, image_col, label_col = as_ds(raw.train), as_ds(raw.eval), "image", "label"
    else:
        train_ds, eval_ds, image_col, label_col = raw.train, raw.eval, raw.image_column, raw.label_column
    train = ProcessedImageDataset(train_ds, image_col, label_col, processor, mode, augmentation, seed=args.seed)
    train_eval = ProcessedImageDataset(train_ds, image_col, label_col, processor, mode, None)
    evaluation = ProcessedImageDataset(eval_ds, image_col, label_col, processor, mode, None)
    return ImageDatasets(train=train, eval=evaluation, train_eval=train_eval, augmentation=description)


__all__ = [
    "RawImageData",
    "ImageDatasets",
    "TensorImageDataset",
    "ProcessedImageDataset",
    "digits_split",
    "load_raw_data",
    "as_hf_dataset",
    "IN_MEMORY",
    "build_datasets",
    "resolve_augmentation",
]
