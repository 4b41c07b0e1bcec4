"""The trainer's numbers by hand: the crop box's fallback, label mapping of a saved dataset, the smoothed loss,
the run's JSON config and the optimizer's argument checks (gaps found by mutation testing, scripts/mutation.sh)."""

import argparse
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
from hf_tdiag.training import args as targs
from hf_tdiag.training import augment, data, loop, optim


class _NoDraw:
    """A generator whose draws make every one of the ten tries too large for the image: the fallback is taken."""

    def uniform(self, low, high):
        return high

    def integers(self, low, high):
        raise AssertionError("the fallback box is centred, not drawn")


@pytest.mark.parametrize(
    ("width", "height", "ratio", "box"),
    [
        # wider than ratio[1] allows: full height, width = height * ratio[1] = 20, centred: left = (100 - 20) / 2
        (100, 10, (1.0, 2.0), (40, 0, 60, 10)),
        # taller than ratio[0] allows: full width, height = width / ratio[0] = 20, centred: top = (100 - 20) / 2
        (10, 100, (0.5, 1.0), (0, 40, 10, 60)),
    ],
)
def test_crop_box_fallback_is_the_largest_centred_box_within_the_ratio(width, height, ratio, box):
    # scale (1, 1) at aspect ratio[1] (wide case) or ratio[1] (tall case) never fits inside the image
    assert augment.random_resized_crop_box(width, height, _NoDraw(), scale=(1.0, 1.0), ratio=ratio) == box


def test_crop_box_fallback_inside_the_ratio_is_the_whole_image():
    # 30 x 20 (ratio 1.5) with ratio bounds (1, 2): the whole image; scale draws of 1 at aspect 2 do not fit
    assert augment.random_resized_crop_box(30, 20, _NoDraw(), scale=(1.0, 1.0), ratio=(1.0, 2.0)) == (0, 0, 30, 20)


def test_crop_box_rejects_a_zero_ratio():
    with pytest.raises(ValueError, match="ratio"):
        augment.random_resized_crop_box(10, 10, np.random.default_rng(0), ratio=(0.0, 1.0))


def test_digits_dataset_id_names_the_package_data(tmp_path):
    raw = data.load_raw_data(targs.make_args(output_dir=str(tmp_path)))
    assert raw.dataset_id == "sklearn-digits"


def _saved_dataset(tmp_path, columns):
    import datasets

    images = [Image.fromarray(np.full((4, 4, 3), 30 * i, dtype=np.uint8)) for i in range(6)]
    train = datasets.Dataset.from_dict({"image": images[:4], **{k: v[:4] for k, v in columns.items()}})
    val = datasets.Dataset.from_dict({"image": images[4:], **{k: v[4:] for k, v in columns.items()}})
    path = tmp_path / "saved"
    datasets.DatasetDict({"train": train, "validation": val}).save_to_disk(str(path))
    return str(path)


def test_string_labels_map_to_the_sorted_union_of_both_splits(tmp_path):
    # "eel" occurs only in the validation split: the label set is the union, sorted, and both splits are mapped
    path = _saved_dataset(tmp_path, {"label": ["dog", "cat", "dog", "cat", "eel", "cat"]})
    raw = data.load_raw_data(targs.make_args(output_dir=str(tmp_path / "out"), dataset_path=path))
    assert raw.labels == ["cat", "dog", "eel"]
    assert list(raw.train["label"]) == [1, 0, 1, 0]
    assert list(raw.eval["label"]) == [2, 0]


def test_a_dataset_without_a_label_column_is_named(tmp_path):
    path = _saved_dataset(tmp_path, {"caption": ["a", "b", "c", "d", "e", "f"]})
    with pytest.raises(ValueError, match=r"could not find the label column among \['image', 'caption'\]"):
        data.load_raw_data(targs.make_args(output_dir=str(tmp_path / "out"), dataset_path=path))


def test_json_config_keeps_plain_values_and_writes_the_rest_as_text():
    ns = argparse.Namespace(a=Path("runs/x"), b=[1, 2], c=None, d=0.5, e="s", f=True, func=print, hub_token="secret")
    assert loop._json_config(ns) == {"a": "runs/x", "b": "[1, 2]", "c": None, "d": 0.5, "e": "s", "f": True}


def test_loss_is_the_label_smoothed_cross_entropy_by_hand(tmp_path):
    torch.manual_seed(0)
    model = CrateForImageClassification(
        CrateConfig.from_preset(
            "crate-digits", hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_labels=10
        )
    ).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(50)  # peaked logits: smoothing changes the loss visibly
    batch = {"pixel_values": torch.randn(5, 1, 8, 8), "labels": torch.tensor([0, 3, 9, 3, 1])}
    args = targs.make_args(output_dir=str(tmp_path), label_smoothing=0.3)
    loss, ce, penalty = loop.compute_loss(model, model, batch, args, step=0)
    with torch.no_grad():
        logp = torch.log_softmax(model(pixel_values=batch["pixel_values"]).logits.double(), dim=1)
    # (1 − ε)·(−log p_y) + ε·mean_k(−log p_k), averaged over the batch
    nll = -logp[torch.arange(5), batch["labels"]]
    smooth = -logp.mean(dim=1)
    expected = float(((1 - 0.3) * nll + 0.3 * smooth).mean())
    assert penalty is None and float(loss) == float(ce)
    assert float(ce) == pytest.approx(expected, rel=1e-5)
    assert not math.isclose(expected, float(nll.mean()), rel_tol=1e-3)  # the smoothing changes the number


@pytest.mark.parametrize("betas", [(0.5, 1.0), (1.0, 0.5), (-0.1, 0.5), (0.5, -0.1)])
def test_lion_rejects_betas_outside_the_unit_interval(betas):
    with pytest.raises(ValueError, match="betas"):
        optim.Lion([torch.nn.Parameter(torch.zeros(2))], betas=betas)


def _labelled_config(num_labels: int):
    config = CrateConfig.from_preset(
        "crate-digits", variant="crate-c", hidden_size=16, num_hidden_layers=3, num_attention_heads=2
    )
    config.id2label = {i: f"c{i}" for i in range(num_labels)}
    config.label2id = {v: k for k, v in config.id2label.items()}
    return config


def test_model_card_architecture_fields_by_hand():
    from hf_tdiag.training import model_card

    fields = model_card._model_fields(_labelled_config(21), "crate-digits")
    expected = dict(
        variant="crate-c",
        variant_name="CRATE-C",
        preset="crate-digits",
        hidden_size=16,
        num_layers=3,
        num_heads=2,
        head_dim=8,
        num_labels=21,
        labels=", ".join(f"c{i}" for i in range(20)) + " …",  # the first 20 of 21, then an ellipsis
    )
    assert {k: fields[k] for k in expected} == expected
    assert fields["variant_description"] == model_card.VARIANT_DESCRIPTIONS["crate-c"]
    assert model_card._model_fields(_labelled_config(20), None)["labels"] == ", ".join(f"c{i}" for i in range(20))


def test_model_card_training_fields_and_command_by_hand(tmp_path):
    from hf_tdiag.training import model_card

    args = targs.make_args(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=7,
        srr_eps=0.25,
        srr_weight=0.1,
        seed=3,
        push_to_hub=True,
        hub_model_id="me/crate",
    )
    fields = model_card._training_fields(args, {"num_processes": 2})
    assert (fields["batch_size"], fields["srr_eps"], fields["srr_weight"], fields["seed"]) == (7, 0.25, 0.1, 3)
    assert fields["num_processes"] == 2
    # the command reproduces the run: the non-default flags, the output folder by name, no Hub publishing flags
    assert fields["command"] == (
        "python recipes/train_crate.py --output_dir run --per_device_train_batch_size 7 --seed 3 --srr_eps 0.25 "
        "--srr_weight 0.1"
    )


def test_publish_fills_in_what_is_not_given_from_the_output_folder_and_pushes_the_card_last(tmp_path, monkeypatch):
    """publish's order and sources, with the Hub client replaced by a recorder (the HTTP path is
    tests/test_training_hub.py's, in a subprocess)."""
    import huggingface_hub

    import hf_tdiag.loading as loading
    from hf_tdiag.training import hub

    log = []

    class Pushes:
        def __init__(self, what):
            self.what = what

        def push_to_hub(self, repo_id, **kwargs):
            log.append((self.what, repo_id))

    class Api:
        def __init__(self, token=None):
            log.append(("api", token))

        def create_repo(self, repo_id, **kwargs):
            return huggingface_hub.RepoUrl(f"https://hub.test/me/{repo_id}", endpoint="https://hub.test")

        def upload_folder(self, repo_id, folder_path, allow_patterns, **kwargs):
            log.append(("extras", repo_id, folder_path, sorted(allow_patterns)))

    class Card:
        @staticmethod
        def load(path):
            log.append(("card-load", path))
            return Pushes("card")

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "ModelCard", Card)
    monkeypatch.setattr(
        loading, "load_pretrained", lambda path, cls, name: log.append(("model-load", path)) or Pushes("model")
    )
    monkeypatch.setattr(loading, "load_image_processor", lambda path: pytest.fail("the processor was given"))
    (tmp_path / "layer_srr.json").write_text("{}")
    (tmp_path / "all_results.json").write_text("{}")
    url = hub.publish(str(tmp_path), "crate", processor=Pushes("processor"), token="t")
    assert url == "https://hub.test/me/crate"
    assert log == [
        ("api", "t"),
        ("model-load", str(tmp_path)),
        ("model", "me/crate"),
        ("processor", "me/crate"),
        ("extras", "me/crate", str(tmp_path), ["all_results.json", "layer_srr.json"]),
        ("card-load", os.path.join(str(tmp_path), "README.md")),
        ("card", "me/crate"),
    ]
