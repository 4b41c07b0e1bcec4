"""One image path for every entry point, ``pipeline()`` included (issue 45): with hf-tdiag's pipeline classes a
transparent, palette, 16-bit or float image reaches a white-box model as the command line reads it (the image
processor fed :func:`hf_tdiag.inputs.to_pil`'s image), where Transformers' own class, whose ``load_image`` converts
to RGB first, reads it differently. Any other model is read by Transformers' own rule."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import pipeline
from transformers.pipelines import PIPELINE_REGISTRY, ImageClassificationPipeline

from hf_tdiag.image_pipeline import (
    WhiteBoxImageClassificationPipeline,
    WhiteBoxImageFeatureExtractionPipeline,
    read_pipeline_image,
    register,
)
from hf_tdiag.inputs import to_pil
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification, CrateImageProcessor


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits_model")
    torch.manual_seed(0)
    config = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=1)
    CrateForImageClassification(config).eval().save_pretrained(folder)
    CrateImageProcessor.for_config(config).save_pretrained(folder)
    return str(folder)


def _stroke() -> np.ndarray:
    mask = np.zeros((8, 8), dtype=bool)
    mask[1:7, 3:5] = True  # a "1"
    return mask


def _transparent(path):
    """Black stored under transparent pixels, a white stroke opaque: a viewer shows a white image with a white 1."""
    rgba = np.zeros((8, 8, 4), dtype=np.uint8)
    rgba[_stroke()] = (255, 255, 255, 255)
    rgba[..., 3][~_stroke()] = 0
    Image.fromarray(rgba, "RGBA").save(path)


def _palette(path):
    img = Image.fromarray(np.where(_stroke(), 1, 0).astype(np.uint8), "P")
    img.putpalette([0, 0, 0, 40, 40, 40] + [0] * 762)
    img.save(path, transparency=0)  # index 0 (black) transparent


def _sixteen_bit(path):
    Image.fromarray(np.where(_stroke(), 30000, 2000).astype(np.uint16)).save(path)  # dark grey stroke on near-black


def _float(path):
    Image.fromarray(np.where(_stroke(), 0.9, 0.1).astype(np.float32), "F").save(path)  # TIFF mode F in [0, 1]


MAKERS = {"transparent": (_transparent, "png"), "palette": (_palette, "png"), "16-bit": (_sixteen_bit, "png"),
          "float": (_float, "tiff")}  # fmt: skip


def _cli_scores(folder, path) -> torch.Tensor:
    """What the command line computes: the model on the processor's pixels of hf-tdiag's image."""
    model = CrateForImageClassification.from_pretrained(folder).eval()
    pixels = CrateImageProcessor.from_pretrained(folder)(images=to_pil(path), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return model(pixel_values=pixels).logits.softmax(-1)[0]


def _pipeline_scores(classify, path) -> torch.Tensor:
    out = classify(str(path), top_k=10)
    scores = torch.zeros(10)
    for row in out:
        scores[classify.model.config.label2id[row["label"]]] = row["score"]
    return scores


@pytest.mark.parametrize("kind", list(MAKERS))
def test_the_pipeline_reads_images_as_the_command_line(digits_model, tmp_path, kind):
    make, suffix = MAKERS[kind]
    path = tmp_path / f"image.{suffix}"
    make(path)
    reference = _cli_scores(digits_model, path)
    pixels = CrateImageProcessor.from_pretrained(digits_model)(images=to_pil(path), return_tensors="pt")["pixel_values"]
    ours = pipeline("image-classification", model=digits_model, pipeline_class=WhiteBoxImageClassificationPipeline)
    assert torch.equal(ours.preprocess(str(path))["pixel_values"], pixels)
    torch.testing.assert_close(_pipeline_scores(ours, path), reference, rtol=1e-5, atol=1e-6)
    # Transformers' own class converts to RGB first: the model sees another image (pixels normalized to [-1, 1])
    plain = pipeline("image-classification", model=digits_model, pipeline_class=ImageClassificationPipeline)
    assert (plain.preprocess(str(path))["pixel_values"] - pixels).abs().max() > 0.2


def test_register_makes_them_the_default_classes_and_leaves_other_models_alone(digits_model, tmp_path):
    impl = PIPELINE_REGISTRY.supported_tasks["image-classification"]["impl"]
    feature_impl = PIPELINE_REGISTRY.supported_tasks["image-feature-extraction"]["impl"]
    try:
        register()
        classify = pipeline("image-classification", model=digits_model)
        assert isinstance(classify, WhiteBoxImageClassificationPipeline)
        _transparent(tmp_path / "t.png")
        torch.testing.assert_close(
            _pipeline_scores(classify, tmp_path / "t.png"), _cli_scores(digits_model, tmp_path / "t.png"), rtol=1e-5,
            atol=1e-6,
        )  # fmt: skip
        extract = pipeline("image-feature-extraction", model=digits_model)
        assert isinstance(extract, WhiteBoxImageFeatureExtractionPipeline)
        features = torch.tensor(extract(str(tmp_path / "t.png")))
        model = CrateForImageClassification.from_pretrained(digits_model).eval()
        pixels = CrateImageProcessor.from_pretrained(digits_model)(images=to_pil(tmp_path / "t.png"),
                                                                   return_tensors="pt")["pixel_values"]  # fmt: skip
        with torch.no_grad():
            hidden = model.crate(pixel_values=pixels).last_hidden_state
        torch.testing.assert_close(features, hidden, rtol=1e-5, atol=1e-6)
        classify.model.config.model_type = "vit"  # another model: Transformers' own reading (load_image -> RGB)
        from transformers.image_utils import load_image

        processor = CrateImageProcessor.from_pretrained(digits_model)
        expected = processor(images=load_image(str(tmp_path / "t.png")), return_tensors="pt")["pixel_values"]
        assert torch.equal(classify.preprocess(str(tmp_path / "t.png"))["pixel_values"], expected)
    finally:
        PIPELINE_REGISTRY.supported_tasks["image-classification"]["impl"] = impl
        PIPELINE_REGISTRY.supported_tasks["image-feature-extraction"]["impl"] = feature_impl


BAD = [
    ("not a file nor base64", "no/such/file.png", ValueError, "is not an image file, an http(s) URL or base64"),
    ("a number", 12, TypeError, "expected a PIL image, a file path, a URL or base64 text, got int"),
    ("float outside [0, 1] and 0..255", "float-range", ValueError, "expected pixel values in 0..255"),
]  # fmt: skip


@pytest.mark.parametrize("case, given, error, text", BAD, ids=[c[0] for c in BAD])
def test_unreadable_pipeline_images_are_named(tmp_path, case, given, error, text):
    if given == "float-range":
        given = tmp_path / "f.tiff"
        Image.fromarray(np.full((8, 8), 300.5, dtype=np.float32), "F").save(given)
    with pytest.raises(error, match=re.escape(text)):
        read_pipeline_image(given)


def test_import_makes_the_white_box_pipelines_the_default_for_every_image_family():
    """``import hf_tdiag`` registers the pipeline classes with the families, and every family of the table that reads
    images (each with an image processor) is read by hf-tdiag's converter — the model types come from the table."""
    import hf_tdiag  # noqa: F401 - the import registers
    from hf_tdiag.image_pipeline import _is_white_box
    from hf_tdiag.models.families import FAMILIES

    assert PIPELINE_REGISTRY.supported_tasks["image-classification"]["impl"] is WhiteBoxImageClassificationPipeline
    assert (
        PIPELINE_REGISTRY.supported_tasks["image-feature-extraction"]["impl"] is WhiteBoxImageFeatureExtractionPipeline
    )
    image_families = [f for f in FAMILIES.values() if f.image_processor is not None]
    assert {f.model_type for f in image_families} == {"crate", "crate-alpha", "crate-mae", "tost", "aot"}
    for family in image_families:
        config = family.load(family.config)()
        assert _is_white_box(type("M", (), {"config": config})()), family.model_type
    text = FAMILIES["crate_text"]
    assert not _is_white_box(type("M", (), {"config": text.load(text.config)()})())
