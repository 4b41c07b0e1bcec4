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
from hf_tdiag.training import augment, data, loop, optim, outcome


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
    monkeypatch.setattr(hub, "check_hub_reachable", lambda **kwargs: "https://hub.test")  # no network here
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


def test_crop_size_errors_name_the_size():
    img = Image.new("L", (6, 6))
    with pytest.raises(TypeError, match=r"^size: expected an int or a \(height, width\) pair"):
        augment.random_resized_crop(img, "8", np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"^size: expected a positive int"):
        augment.random_resized_crop(img, 0, np.random.default_rng(0))


def test_default_epochs_and_learning_rate_depend_on_the_dataset(tmp_path):
    digits = targs.make_args(output_dir=str(tmp_path))
    other = targs.make_args(output_dir=str(tmp_path), dataset_name="cifar10", optimizer="lion")
    loop._resolve_defaults(digits)
    loop._resolve_defaults(other)
    assert (digits.num_train_epochs, other.num_train_epochs) == (loop.DIGITS_EPOCHS, loop.DEFAULT_EPOCHS)
    assert digits.learning_rate == loop.DIGITS_LR["adamw"] and other.learning_rate == loop.DEFAULT_LR["lion"]
    assert other.adam_beta2 == 0.99  # Lion's β₂


@pytest.mark.parametrize(("warmup_ratio", "max_steps", "warmup"), [(0.2, 50, 10), (0.25, 10, 2)])
def test_warmup_steps_are_the_ratio_of_the_training_steps(tmp_path, warmup_ratio, max_steps, warmup):
    class OneProcess:
        num_processes = 1

    args = targs.make_args(
        output_dir=str(tmp_path), warmup_ratio=warmup_ratio, max_train_steps=max_steps, lr_scheduler_type="linear"
    )
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = loop._schedule(args, OneProcess(), opt, batches_per_epoch=7)
    lrs = []
    for _ in range(max_steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # linear warmup to the peak at step `warmup`, then linear decay to 0 at max_steps
    assert lrs[: warmup + 1] == pytest.approx([s / warmup for s in range(warmup + 1)])
    assert lrs[warmup + 1] == pytest.approx((max_steps - warmup - 1) / (max_steps - warmup))
    assert args.num_train_epochs == math.ceil(max_steps / 7)


def test_resume_from_a_checkpoint_without_the_epoch_loss_starts_its_sum_at_zero(tmp_path, monkeypatch):
    from types import SimpleNamespace

    state = {"completed_steps": 12, "epoch": 2, "batches_in_epoch": 3}  # written before the epoch loss was saved
    monkeypatch.setattr(loop, "resolve_checkpoint", lambda spec, out: str(tmp_path / "checkpoint-12"))
    monkeypatch.setattr(loop, "load_checkpoint", lambda acc, path: dict(state))
    run = SimpleNamespace(
        args=SimpleNamespace(resume_from_checkpoint="latest", output_dir=str(tmp_path)),
        accelerator=SimpleNamespace(print=lambda *a: None),
    )
    loop.resume(run)
    assert (run.completed_steps, run.start_epoch, run.resume_batches) == (12, 2, 3)
    assert (run.loss_sum, run.loss_count, run.history, run.srr_history) == (0.0, 0, [], [])
    state.update(epoch_loss_sum=4.5, epoch_loss_count=3, history=[{"epoch": 1}])
    loop.resume(run)
    assert (run.loss_sum, run.loss_count, run.history) == (4.5, 3, [{"epoch": 1}])


def test_push_to_hub_records_the_repo_url_in_the_results(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from hf_tdiag.training import hub

    calls = []
    monkeypatch.setattr(
        hub, "publish", lambda out, repo, **kw: calls.append((out, repo, kw)) or "https://hub.test/me/x"
    )
    monkeypatch.setattr(outcome, "write_json", lambda path, data: None)

    class Card:
        def save(self, path):
            calls.append(("card", path))

    monkeypatch.setattr("hf_tdiag.training.model_card.build_model_card", lambda *a, **k: Card())
    args = targs.make_args(output_dir=str(tmp_path / "run"), push_to_hub=True)
    run = SimpleNamespace(
        args=args,
        config=SimpleNamespace(model_type="crate"),
        raw=None,
        preset=None,
        unwrapped="model",
        processor="processor",
        accelerator=SimpleNamespace(print=lambda *a: None),
    )
    results = dict(train_runtime_s=1.0, eval_accuracy=0.5, eval_loss=1.0, train_loss=0.9, generalization_gap=0.1)
    outcome._publish(run, results)
    assert results["hub_url"] == "https://hub.test/me/x"
    assert calls[-1][:2] == (str(tmp_path / "run"), "run")  # the repo is named after the output folder
    assert calls[-1][2]["model"] == "model" and calls[-1][2]["processor"] == "processor"


@pytest.mark.parametrize("trust", [False, True])
def test_fine_tuning_passes_trust_remote_code_to_every_loader(tmp_path, monkeypatch, trust):
    import hf_tdiag.loading as loading
    from hf_tdiag.training import model as tmodel

    seen = {}
    config = CrateConfig.from_preset("crate-digits", hidden_size=16, num_hidden_layers=1, num_attention_heads=2)

    def load_config(path, trust_remote_code, name):
        seen["config"] = trust_remote_code
        return config

    def load_pretrained(path, cls, config, trust_remote_code, name, ignore_mismatched_sizes):
        seen["model"] = trust_remote_code
        return CrateForImageClassification(config)

    def load_image_processor(path, trust_remote_code):
        seen["processor"] = trust_remote_code
        return None

    monkeypatch.setattr(loading, "load_config", load_config)
    monkeypatch.setattr(loading, "load_pretrained", load_pretrained)
    monkeypatch.setattr(loading, "load_image_processor", load_image_processor)
    args = targs.make_args(output_dir=str(tmp_path), model_name_or_path="someone/crate", trust_remote_code=trust)
    raw = data.load_raw_data(targs.make_args(output_dir=str(tmp_path)))
    model, processor, preset = tmodel.build_model_and_processor(args, raw)
    assert seen == {"config": trust, "model": trust, "processor": trust}
    assert model.config.num_labels == 10 and preset is None and processor is not None


def test_digits_with_an_explicit_augmentation_are_wrapped_as_a_dataset(tmp_path):
    from hf_tdiag.models.crate import CrateImageProcessor

    args = targs.make_args(output_dir=str(tmp_path), augmentation="pad_crop", max_train_samples=6, max_eval_samples=4)
    raw = data.load_raw_data(args)
    processor = CrateImageProcessor.for_config(CrateConfig.from_preset("crate-digits"))
    sets = data.build_datasets(args, raw, processor, 1, (8, 8))
    assert (len(sets.train), len(sets.eval), sets.augmentation) == (6, 4, "pad_crop")
    item = sets.eval[2]  # evaluation is not augmented: the processor's normalisation of the image
    expected = (raw.eval["images"][2].astype(np.float32) / 255.0 - 0.5) / 0.5
    np.testing.assert_allclose(item["pixel_values"][0].numpy(), expected, atol=1e-6)
    assert int(item["labels"]) == int(raw.eval["labels"][2])


@pytest.mark.parametrize("flag", ["layer_srr_samples", "track_srr_samples"])
def test_negative_sample_counts_are_named(tmp_path, flag):
    with pytest.raises(ValueError, match=rf"^{flag}: "):
        targs.make_args(output_dir=str(tmp_path), **{flag: -1})
