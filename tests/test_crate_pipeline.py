"""transformers.pipeline on CRATE checkpoints (grayscale and RGB), with hf-tdiag imported and in a Python without it;
every Auto class named in the saved auto_map loads without hf-tdiag."""

import builtins
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import pipeline

import hf_tdiag  # noqa: F401
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification, CrateImageProcessor, CrateModel

pytestmark = pytest.mark.slow


def _save(folder, channels: int) -> CrateForImageClassification:
    config = CrateConfig(
        image_size=8,
        patch_size=4,
        num_channels=channels,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_labels=3,
    )
    torch.manual_seed(channels)
    model = CrateForImageClassification(config).eval()
    model.save_pretrained(folder)
    CrateImageProcessor.for_config(config).save_pretrained(folder)
    return model


def _image() -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8), mode="RGB")


def _reference_pixels(channels: int) -> torch.Tensor:
    """The processor's job written out: grey by PIL for one channel, rescale to [0, 1], normalise (8x8: no resize)."""
    image = _image()
    if channels == 1:
        x = np.asarray(image.convert("L"), dtype=np.float64)[None] / 255.0
        x = (x - 0.5) / 0.5
    else:
        mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
        x = (np.asarray(image, dtype=np.float64) / 255.0 - mean) / std
        x = np.moveaxis(x, -1, 0)
    return torch.tensor(x[None], dtype=torch.float32)


def _expected(model, channels: int) -> dict:
    pixels = _reference_pixels(channels)
    with torch.no_grad():
        probs = torch.softmax(model(pixel_values=pixels).logits, -1)[0]
        hidden = model.crate(pixel_values=pixels).last_hidden_state[0]
    return {"probs": probs.tolist(), "hidden": hidden.tolist()}


def _scores(result, id2label) -> list[float]:
    by_label = {r["label"]: r["score"] for r in result}
    return [by_label[id2label[i]] for i in range(len(id2label))]


@pytest.mark.parametrize("channels", [1, 3])
def test_pipeline_with_hf_tdiag_imported_asks_nothing(tmp_path, monkeypatch, channels):
    model = _save(tmp_path, channels)

    def no_prompt(*args, **kwargs):
        raise AssertionError(f"pipeline asked: {args}")

    monkeypatch.setattr(builtins, "input", no_prompt)
    expected = _expected(model, channels)
    classify = pipeline("image-classification", model=str(tmp_path))
    assert type(classify.model) is CrateForImageClassification  # the native class, not remote code
    scores = _scores(classify(_image(), top_k=3), model.config.id2label)
    np.testing.assert_allclose(scores, expected["probs"], rtol=1e-5, atol=1e-6)
    extract = pipeline("image-feature-extraction", model=str(tmp_path))
    assert type(extract.model) is CrateModel
    np.testing.assert_allclose(np.array(extract(_image()))[0], expected["hidden"], rtol=1e-5, atol=1e-5)


_WITHOUT_HF_TDIAG = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from PIL import Image
    from transformers import (AutoConfig, AutoImageProcessor, AutoModel, AutoModelForImageClassification, pipeline)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8), mode="RGB")
    classes = {"AutoConfig": AutoConfig, "AutoModel": AutoModel, "AutoImageProcessor": AutoImageProcessor,
               "AutoModelForImageClassification": AutoModelForImageClassification}
    out = {}
    for folder in sys.argv[1:]:
        auto_map = json.load(open(folder + "/config.json"))["auto_map"]
        auto_map.update(json.load(open(folder + "/preprocessor_config.json"))["auto_map"])
        loaded = {name: type(classes[name].from_pretrained(folder, trust_remote_code=True)).__name__
                  for name in auto_map}
        classify = pipeline("image-classification", model=folder, trust_remote_code=True)
        extract = pipeline("image-feature-extraction", model=folder, trust_remote_code=True)
        out[folder] = {"loaded": loaded, "result": classify(image, top_k=3),
                       "hidden": np.array(extract(image))[0].tolist()}
    out["hf_tdiag_imported"] = any(m == "hf_tdiag" or m.startswith("hf_tdiag.") for m in sys.modules)
    print(json.dumps(out))
    """
)


def test_pipeline_and_every_auto_class_without_hf_tdiag(tmp_path):
    folders = {channels: tmp_path / f"crate-{channels}ch" for channels in (1, 3)}
    models = {channels: _save(folder, channels) for channels, folder in folders.items()}
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_HF_TDIAG, *map(str, folders.values())],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["hf_tdiag_imported"] is False
    for channels, folder in folders.items():
        run, expected = got[str(folder)], _expected(models[channels], channels)
        assert run["loaded"] == {
            "AutoConfig": "CrateConfig",
            "AutoModel": "CrateModel",
            "AutoModelForImageClassification": "CrateForImageClassification",
            "AutoImageProcessor": "CrateImageProcessor",
        }
        scores = _scores(run["result"], models[channels].config.id2label)
        np.testing.assert_allclose(scores, expected["probs"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(run["hidden"], expected["hidden"], rtol=1e-5, atol=1e-5)
