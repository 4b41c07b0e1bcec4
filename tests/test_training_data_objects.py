"""train(train_dataset=..., eval_dataset=...) with datasets.Dataset, DatasetDict, IterableDataset and a torch Dataset:
each form gives the same images, labels and pixel values; a real run trains on them."""

import json

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from hf_tdiag.training import args as targs
from hf_tdiag.training import data, train
from hf_tdiag.training.model import build_model_and_processor

pytestmark = pytest.mark.slow

NAMES = ["circle", "square", "triangle"]


def _images(n, seed):
    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8), mode="L") for _ in range(n)]
    return images, [i % 3 for i in range(n)]


def _dataset(n, seed, image="image", label="label"):
    images, labels = _images(n, seed)
    features = datasets.Features({image: datasets.Image(), label: datasets.ClassLabel(names=NAMES)})
    return datasets.Dataset.from_dict({image: images, label: labels}, features=features)


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        self.images, self.labels = _images(n, seed)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def _forms():
    return {
        "Dataset": (_dataset(12, 0), _dataset(6, 1)),
        "DatasetDict": (
            datasets.DatasetDict({"train": _dataset(12, 0, "img", "labels"), "test": _dataset(6, 1)}),
            None,
        ),
        "IterableDataset": (_dataset(12, 0).to_iterable_dataset(), _dataset(6, 1).to_iterable_dataset()),
        "torch Dataset": (Pairs(12, 0), Pairs(6, 1)),
    }


def test_every_form_reads_the_same_images_labels_and_pixels(tmp_path):
    args = targs.make_args(
        output_dir=str(tmp_path), image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2
    )
    expected_images, expected_labels = _images(12, 0)
    reference = None
    for form, (train_data, eval_data) in _forms().items():
        raw = data.load_raw_data(args, train_data, eval_data)
        assert (raw.num_train, raw.num_eval, raw.num_channels, raw.image_size) == (12, 6, 1, (8, 8)), form
        assert raw.labels == (NAMES if form != "torch Dataset" else ["0", "1", "2"]), form
        assert raw.dataset_id == data.IN_MEMORY and not raw.is_digits
        assert list(raw.train[raw.label_column]) == expected_labels, form
        model, processor, _ = build_model_and_processor(args, raw)
        built = data.build_datasets(args, raw, processor, model.config.num_channels, (8, 8))
        pixels = torch.stack([built.train_eval[i]["pixel_values"] for i in range(12)])
        hand = processor(expected_images, return_tensors="pt")["pixel_values"]  # the same PIL images, processed
        torch.testing.assert_close(pixels, hand, rtol=0, atol=1e-6)
        reference = pixels if reference is None else reference
        torch.testing.assert_close(pixels, reference, rtol=0, atol=0)


def test_bad_data_objects_name_the_argument(tmp_path):
    args = targs.make_args(output_dir=str(tmp_path))
    with pytest.raises(TypeError, match="train_dataset: expected a datasets.Dataset"):
        data.load_raw_data(args, [1, 2, 3])
    with pytest.raises(ValueError, match="eval_dataset: given without train_dataset"):
        data.load_raw_data(args, None, _dataset(4, 0))
    with pytest.raises(ValueError, match=r"train_dataset\[0\]: expected an image column"):
        data.load_raw_data(args, _Items([{"pixels": 1, "label": 0}]))


class _Items(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_train_runs_on_a_dataset_and_its_card_names_no_dataset(tmp_path):
    out = tmp_path / "out"
    results = train(
        output_dir=str(out),
        train_dataset=_dataset(12, 0),
        eval_dataset=_dataset(6, 1),
        image_size=8,
        patch_size=4,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_train_steps=2,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        layer_srr_samples=0,
        disable_tqdm=True,
    )
    assert (results["train_samples"], results["eval_samples"], results["steps"]) == (12, 6, 2)
    assert results["dataset"] == data.IN_MEMORY
    config = json.loads((out / "config.json").read_text())
    assert config["num_channels"] == 1 and sorted(config["id2label"].values()) == NAMES
    card = (out / "README.md").read_text()
    assert "(lr 0.001," in card  # the default learning rate, not the digits recipe's (no dataset flag was given)
    assert "\ndatasets:" not in card.split("---")[1]  # nothing on the Hub to link
