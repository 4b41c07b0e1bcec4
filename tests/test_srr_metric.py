"""SRR evaluate module round trip (offline), hf-tdiag srr command, viz curves and hf_tdiag.inputs loaders."""

import json

import evaluate
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertTokenizerFast,
    ViTConfig,
    ViTForImageClassification,
)

import hf_tdiag
from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor, layer_srr
from hf_tdiag.cli import main as cli_main
from hf_tdiag.inputs import LazyBatches, digits_images, images_from_folder, load_images
from hf_tdiag.viz import plot_layer_srr, save_figure


@pytest.fixture(scope="module")
def crate_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", variant="crate-n", num_labels=10, num_hidden_layers=2)
    model = CrateForImageClassification(cfg).eval()
    path = tmp_path_factory.mktemp("crate")
    model.save_pretrained(path)
    return str(path), model


@pytest.fixture(scope="module")
def srr_module():
    return evaluate.load(hf_tdiag.metric_path("srr"))


def _pixel_values(model, images):
    proc = CrateImageProcessor.for_config(model.config)
    return proc(images=images, return_tensors="pt")["pixel_values"]


def test_evaluate_round_trip_images_pixel_values_and_add_batch(crate_dir, srr_module):
    path, model = crate_dir
    images = digits_images(limit=9).images
    # the same batches on both sides (float32 Gram products can differ in the last bits with the batch's size)
    expected = layer_srr(model, _pixel_values(model, images), eps=0.2, batch_size=4, progress=False)
    out = srr_module.compute(model=path, images=images, eps=0.2, batch_size=4, progress=False, return_report=True)
    report = out.pop("report")
    assert report["layers"] == [1, 2] and out["num_samples"] == 9
    for term in ("R", "Rc", "sparsity", "srr"):
        np.testing.assert_allclose(report["mean"]["output"][term], expected.mean["output"][term], rtol=1e-9)
        np.testing.assert_allclose([out[f"{term}_layer_{l}"] for l in (1, 2)], expected.mean["output"][term], rtol=1e-9)
        np.testing.assert_allclose(report["std"]["output"][term], expected.std["output"][term], rtol=1e-7, atol=1e-12)
        assert out[f"input_{term}_last_layer"] == pytest.approx(expected.mean["input"][term][-1], rel=1e-9)
        assert out[f"mid_{term}_mean_over_layers"] == pytest.approx(np.mean(expected.mean["mid"][term]), rel=1e-9)
        assert out[f"embeddings_{term}"] == pytest.approx(expected.embeddings["mean"][term], rel=1e-9)
    official = srr_module.compute(
        model=path, images=images, measurement="official", batch_size=4, progress=False, return_report=True
    )
    expected_official = layer_srr(
        model, _pixel_values(model, images), measurement="official", batch_size=4, progress=False
    )
    np.testing.assert_allclose(
        official["report"]["mean"]["official"]["Rc"], expected_official.mean["official"]["Rc"], rtol=1e-9
    )
    assert "embeddings_srr" not in official and official["report"]["settings"]["measurement"] == "official"
    assert out["srr_mean_over_layers"] == pytest.approx(np.mean(expected.mean["output"]["srr"]))
    assert report["settings"]["eps"] == 0.2 and report["settings"]["variant"] == "crate-n"
    # the same with a model object, with pixel values, and with add_batch
    out_obj = srr_module.compute(
        model=model, pixel_values=_pixel_values(model, images), eps=0.2, batch_size=4, progress=False
    )
    assert out_obj == pytest.approx(out, rel=1e-9)
    srr_module.add_batch(images=images[:4])
    srr_module.add_batch(images=images[4:])
    out_batches = srr_module.compute(model=path, eps=0.2, batch_size=4, return_report=True, progress=False)
    assert out_batches["srr_layer_2"] == pytest.approx(out["srr_layer_2"], rel=1e-9)
    assert out_batches["report"]["num_samples"] == 9


def test_evaluate_texts_with_local_tokenizer(tmp_path, srr_module):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "a", "mat", "dog", "ran"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    tok = BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt"))
    cfg = BertConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, vocab_size=len(words)
    )
    model = BertForSequenceClassification(cfg).eval()
    folder = tmp_path / "bert"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    texts = ["the cat sat on a mat", "a dog ran", "the dog sat"]
    out = srr_module.compute(model=str(folder), texts=texts, source="key", progress=False, return_report=True)
    batch = dict(tok(texts, padding=True, return_tensors="pt"))
    expected = layer_srr(model, batch, source="key", progress=False)
    np.testing.assert_allclose([out["Rc_layer_1"], out["Rc_layer_2"]], expected.mean["output"]["Rc"], rtol=1e-6)
    assert "mid_srr_last_layer" not in out and out["report"]["settings"]["source"] == "key"


def test_evaluate_errors(crate_dir, srr_module):
    path, model = crate_dir
    images = digits_images(limit=2).images
    with pytest.raises(ValueError, match="one of images, texts or pixel_values"):
        srr_module.compute(model=path, images=images, pixel_values=torch.zeros(2, 1, 8, 8))
    with pytest.raises(ValueError, match="pixel_values"):
        srr_module.compute(model=path, pixel_values=torch.zeros(8, 8))
    with pytest.raises(ValueError, match="model"):
        srr_module.compute(pixel_values=torch.zeros(2, 1, 8, 8))
    with pytest.raises(ValueError, match="predictions"):
        srr_module.compute(model=path, predictions=[1])


# ---------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------


def test_cli_writes_json_and_png_matching_the_api(crate_dir, tmp_path):
    path, model = crate_dir
    out_dir = tmp_path / "out"
    rc = cli_main(
        [
            "srr",
            path,
            "--dataset",
            "digits",
            "--limit",
            "10",
            "--batch-size",
            "4",
            "--eps",
            "0.3",
            "--labels",
            "N",
            "--output-dir",
            str(out_dir),
        ]
    )
    assert rc == 0
    data = json.loads((out_dir / "srr.json").read_text())
    rep = data["reports"]["N"]
    expected = layer_srr(model, _pixel_values(model, digits_images(limit=10).images), eps=0.3, progress=False)
    np.testing.assert_allclose(rep["mean"]["output"]["srr"], expected.mean["output"]["srr"], rtol=1e-9)
    assert rep["num_samples"] == 10 and rep["settings"]["eps"] == 0.3
    with Image.open(out_dir / "srr.png") as im:
        assert im.format == "PNG" and im.size[0] > 300


def test_cli_vit_all_sources_and_errors(tmp_path, capsys):
    cfg = ViTConfig(
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        image_size=8,
        patch_size=4,
        num_labels=3,
    )
    folder = tmp_path / "vit"
    ViTForImageClassification(cfg).save_pretrained(folder)
    imgs = tmp_path / "imgs"
    for cls in ("a", "b"):
        (imgs / cls).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(np.random.randint(0, 255, (8, 8, 3), dtype=np.uint8)).save(imgs / cls / f"{i}.png")
    rc = cli_main(["srr", str(folder), "--images", str(imgs), "--source", "all", "--output-dir", str(tmp_path / "o")])
    assert rc == 0
    reports = json.loads((tmp_path / "o" / "srr.json").read_text())["reports"]
    assert sorted(reports) == ["vit · key", "vit · query", "vit · value"]
    assert all(r["num_samples"] == 4 for r in reports.values())
    assert cli_main(["srr", str(folder), "--images", str(tmp_path / "nope")]) == 1
    assert cli_main(["srr", str(folder), "--dataset", "digits", "--labels", "a", "b"]) == 1
    assert "labels" in capsys.readouterr().err
    capsys.readouterr()
    assert cli_main(["srr", str(folder)]) == 1  # a folder that records no training data needs an input flag
    assert "inputs: pass --images DIR, --dataset NAME or --texts FILE" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# figures
# ---------------------------------------------------------------------------


def test_plot_layer_srr_several_models(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(3, 1, 8, 8)
    reports = {}
    for variant in ("crate-c", "crate-n"):
        cfg = CrateConfig.from_preset("crate-digits", variant=variant, num_labels=10, num_hidden_layers=2)
        reports[variant] = layer_srr(CrateForImageClassification(cfg), x, progress=False)
    fig = plot_layer_srr(reports)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 4
    for ax in axes:
        assert len(ax.lines) == 4  # 2 models x 2 states (block outputs, mid states)
    srr_ax = axes[3]
    c = reports["crate-c"]
    # x = 0: the embeddings Z^0; x = l: the output of block l; mid states at l - 1/2
    np.testing.assert_allclose(srr_ax.lines[0].get_xdata(), [0, 1, 2])
    np.testing.assert_allclose(srr_ax.lines[0].get_ydata(), [c.embeddings["mean"]["srr"]] + c.mean["output"]["srr"])
    np.testing.assert_allclose(srr_ax.lines[1].get_xdata(), [0.5, 1.5])
    np.testing.assert_allclose(srr_ax.lines[1].get_ydata(), c.mean["mid"]["srr"])
    fig2 = plot_layer_srr([r.to_dict() for r in reports.values()], labels=["C", "N"], terms=["Rc"], states=["mid"])
    assert len(fig2.axes[0].lines) == 2
    assert [line.get_label() for line in fig2.axes[0].lines] == ["C", "N"]
    path = save_figure(fig, tmp_path / "sub" / "f.png")
    assert Image.open(path).format == "PNG"
    with pytest.raises(ValueError, match="terms"):
        plot_layer_srr(reports, terms=["bogus"])
    with pytest.raises(ValueError, match="labels"):
        plot_layer_srr(reports, labels=["only one"])
    with pytest.raises(TypeError, match="reports"):
        plot_layer_srr([1, 2])


# ---------------------------------------------------------------------------
# data inputs
# ---------------------------------------------------------------------------


def test_digits_images_scale_and_labels():
    from sklearn.datasets import load_digits

    ref = load_digits()
    s = digits_images(limit=5)
    assert len(s) == 5 and s.labels == [int(t) for t in ref.target[:5]] and s.label_names[3] == "3"
    arr = np.asarray(s.images[2])
    assert s.images[2].mode == "L" and arr.shape == (8, 8)
    np.testing.assert_array_equal(arr, np.round(ref.images[2] * 255 / 16).astype(np.uint8))
    assert digits_images(limit=1, rgb=True).images[0].mode == "RGB"
    assert load_images("digits", limit=3).source == "sklearn:digits"


def test_folder_and_saved_dataset_loading(tmp_path):
    import datasets

    root = tmp_path / "folder"
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (5, 4), (i * 40, 0, 0)).save(root / cls / f"{i}.png")
    (root / "cat" / "notes.txt").write_text("not an image")
    s = images_from_folder(root)
    assert len(s) == 6 and s.label_names == ["cat", "dog"] and s.labels == [0, 0, 0, 1, 1, 1]
    assert s.images[4].size == (5, 4) and s.images[4].getpixel((0, 0)) == (40, 0, 0)
    assert len(load_images(root, limit=2)) == 2

    flat = tmp_path / "flat"
    flat.mkdir()
    Image.new("L", (3, 3)).save(flat / "x.png")
    assert images_from_folder(flat).labels is None

    feats = datasets.Features({"img": datasets.Image(), "y": datasets.ClassLabel(names=["no", "yes"])})
    ds = datasets.Dataset.from_dict({"img": [Image.new("RGB", (4, 4), (9, 9, 9))] * 3, "y": [1, 0, 1]}, features=feats)
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": ds}).save_to_disk(str(saved))
    got = load_images(saved)
    assert got.labels == [1, 0, 1] and got.label_names == ["no", "yes"] and got.images[0].getpixel((1, 1)) == (9, 9, 9)
    with pytest.raises(ValueError, match="split"):
        load_images(saved, split="test")
    with pytest.raises(ValueError, match="images: expected a folder"):
        images_from_folder(tmp_path / "missing")
    with pytest.raises(ValueError, match="dataset: could not load"):
        load_images(str(tmp_path / "no-such-dataset"))
    with pytest.raises(ValueError, match="limit"):
        digits_images(limit=0)


def test_lazy_batches():
    seen = []
    lb = LazyBatches(list(range(7)), 3, lambda chunk: seen.append(list(chunk)) or sum(chunk))
    assert len(lb) == 3
    assert list(lb) == [3, 12, 6] and seen == [[0, 1, 2], [3, 4, 5], [6]]
    with pytest.raises(ValueError, match="batch_size"):
        LazyBatches([1], 0, sum)
