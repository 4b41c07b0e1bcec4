"""CRATE save/load: safetensors + Auto classes, trust_remote_code without hf_tdiag, image processor."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoModelForImageClassification

import hf_tdiag  # noqa: F401
from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor, CrateModel


def _config(variant="crate", **kw):
    return CrateConfig.from_preset("crate-digits", variant=variant, num_labels=10, **kw)


@pytest.mark.parametrize("variant", ["crate", "crate-fix", "crate-t"])
def test_save_reload_auto_identical_logits(tmp_path, variant):
    model = CrateForImageClassification(_config(variant)).eval()
    model.save_pretrained(tmp_path)
    files = set(os.listdir(tmp_path))
    assert "model.safetensors" in files and "pytorch_model.bin" not in files
    assert {"modeling_crate.py", "configuration_crate.py"} <= files
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "crate" and cfg["variant"] == variant
    assert cfg["auto_map"]["AutoModelForImageClassification"] == "modeling_crate.CrateForImageClassification"
    assert isinstance(AutoConfig.from_pretrained(tmp_path), CrateConfig)
    reloaded = AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    assert isinstance(reloaded, CrateForImageClassification)
    x = torch.randn(3, 1, 8, 8)
    assert torch.equal(model(x).logits, reloaded(x).logits)
    for (n1, t1), (n2, t2) in zip(model.state_dict().items(), reloaded.state_dict().items()):
        assert n1 == n2 and torch.equal(t1, t2), n1


def test_base_model_loads_from_classifier_folder(tmp_path):
    model = CrateForImageClassification(_config()).eval()
    model.save_pretrained(tmp_path)
    base = AutoModel.from_pretrained(tmp_path).eval()
    assert isinstance(base, CrateModel)
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(base(x).last_hidden_state, model.crate(x).last_hidden_state)


def test_eager_attn_implementation_from_pretrained(tmp_path):
    model = CrateForImageClassification(_config()).eval()
    model.save_pretrained(tmp_path)
    eager = AutoModelForImageClassification.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert eager.config._attn_implementation == "eager"
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(eager(x).logits, model(x).logits, rtol=1e-5, atol=1e-5)


def test_bf16_save_reload_keeps_dtype(tmp_path):
    model = AutoModelForImageClassification.from_config(_config(), dtype=torch.bfloat16)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForImageClassification.from_pretrained(tmp_path, dtype="auto")
    assert reloaded.dtype == torch.bfloat16
    as_fp32 = AutoModelForImageClassification.from_pretrained(tmp_path, dtype=torch.float32)
    assert as_fp32.dtype == torch.float32


_REMOTE_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["hf_tdiag"] = None  # any `import hf_tdiag` now fails
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageClassification
    try:
        import hf_tdiag  # noqa: F401
        raise SystemExit("hf_tdiag is importable")
    except ImportError:
        pass
    model = AutoModelForImageClassification.from_pretrained("model", trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    processor = AutoImageProcessor.from_pretrained("model", trust_remote_code=True)
    pixels = processor(Image.fromarray(torch.load("image.pt").numpy(), mode="L"), return_tensors="pt").pixel_values
    with torch.no_grad():
        logits = model(pixels).logits
    torch.save({"logits": logits, "pixels": pixels}, "out.pt")
    print("MODULE", type(model).__module__, "PROCESSOR", type(processor).__name__)
    """
)


def test_trust_remote_code_without_hf_tdiag(tmp_path):
    cfg = _config("crate-fix")
    model = CrateForImageClassification(cfg).eval()
    processor = CrateImageProcessor.for_config(cfg)
    src = tmp_path / "saved"
    model.save_pretrained(src)
    processor.save_pretrained(src)
    work = tmp_path / "isolated"
    work.mkdir()
    shutil.copytree(src, work / "model")
    image = (np.random.default_rng(0).random((8, 8)) * 255).astype(np.uint8)
    torch.save(torch.from_numpy(image), work / "image.pt")
    (work / "run.py").write_text(_REMOTE_SCRIPT)
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(hf_tdiag.__file__)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    proc = subprocess.run(
        [sys.executable, "-I", "run.py"], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MODULE transformers_modules." in proc.stdout
    assert repo_root not in proc.stdout
    result = torch.load(work / "out.pt", weights_only=True)
    expected_pixels = processor(Image.fromarray(image, mode="L"), return_tensors="pt").pixel_values
    torch.testing.assert_close(result["pixels"], expected_pixels)
    with torch.no_grad():
        torch.testing.assert_close(result["logits"], model(expected_pixels).logits)


def test_image_processor_auto_and_math(tmp_path):
    cfg = CrateConfig.from_preset("crate-32", num_labels=3)
    processor = CrateImageProcessor.for_config(cfg)
    processor.save_pretrained(tmp_path)
    _config().save_pretrained(tmp_path)  # a crate config.json next to it
    loaded = AutoImageProcessor.from_pretrained(tmp_path)
    assert isinstance(loaded, CrateImageProcessor)
    rng = np.random.default_rng(0)
    arr = (rng.random((32, 32, 3)) * 255).astype(np.uint8)
    pixels = loaded(Image.fromarray(arr), return_tensors="pt").pixel_values
    assert pixels.shape == (1, 3, 32, 32)
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    expected = (torch.from_numpy(arr).permute(2, 0, 1).float() / 255.0 - mean) / std
    torch.testing.assert_close(pixels[0], expected, rtol=1e-5, atol=1e-5)
    # a larger image is resized to the configured size
    assert loaded(Image.fromarray(np.zeros((64, 48, 3), np.uint8)), return_tensors="pt").pixel_values.shape == (
        1,
        3,
        32,
        32,
    )
    # grayscale digits preset: one channel, mean = std = 0.5
    gray = CrateImageProcessor.for_config(_config())
    img = (rng.random((8, 8)) * 255).astype(np.uint8)
    px = gray(Image.fromarray(img, mode="L"), return_tensors="pt").pixel_values
    assert px.shape == (1, 1, 8, 8)
    torch.testing.assert_close(px[0, 0], (torch.from_numpy(img).float() / 255.0 - 0.5) / 0.5, rtol=1e-5, atol=1e-5)


def test_finetune_reload_with_new_head_and_tuple_outputs(tmp_path):
    model = CrateForImageClassification(_config()).eval()
    model.save_pretrained(tmp_path)
    new = AutoModelForImageClassification.from_pretrained(tmp_path, num_labels=3, ignore_mismatched_sizes=True).eval()
    assert new.classifier.out_features == 3
    # the encoder is carried over unchanged
    for (n1, t1), (n2, t2) in zip(model.crate.state_dict().items(), new.crate.state_dict().items()):
        assert n1 == n2 and torch.equal(t1, t2), n1
    x = torch.randn(2, 1, 8, 8)
    tup = new(x, labels=torch.tensor([0, 2]), output_mid_hidden_states=True, return_dict=False)
    loss, logits, mids = tup
    assert logits.shape == (2, 3) and len(mids) == 4
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, torch.tensor([0, 2])))
