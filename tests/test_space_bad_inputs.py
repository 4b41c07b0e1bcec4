"""The Space handlers' family of issue 29: bad uploads, unusual image modes and huge images. Each upload either gives
a one-line ``gr.Error`` naming the image (never a traceback, never a misleading reason) or reaches the model as the
image a viewer shows, checked against pixel values computed here from the file's own numbers."""

from __future__ import annotations

import html
import io
import struct
import zlib

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image

from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor
from hf_tdiag.gradio_app import handlers as H
from hf_tdiag.inputs import open_image
from hf_tdiag.loading import pixel_values_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", autouse=True)
def _local_models_allowed():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(H.LOCAL_MODELS_ENV, "1")
        yield


@pytest.fixture(scope="module")
def crate_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=1)
    path = tmp_path_factory.mktemp("space_bad_crate")
    CrateForImageClassification(cfg).save_pretrained(path)
    CrateImageProcessor.for_config(cfg).save_pretrained(path)
    return str(path)


def _digit() -> np.ndarray:
    from sklearn.datasets import load_digits

    return np.rint(load_digits().images[3] * (255 / 16)).astype(np.uint8)


def _png_header_only(path, width, height):
    """A PNG whose header claims ``width`` x ``height`` 1-bit pixels, with one tiny (wrong) data chunk."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")
    )
    return path


def _crate_tab_error(crate_dir, upload) -> str:
    with pytest.raises(gr.Error) as err:
        H.crate_tab(crate_dir, upload, -1)
    return html.unescape(err.value.message)


UPLOAD_ERRORS = [
    # (id, how the upload is made from tmp_path, text of the one-line error)
    ("nothing", lambda p: None, "image: no image given; upload an image or pick a digits example"),
    ("blank path", lambda p: "  ", "image: no image given"),
    ("missing file", lambda p: str(p / "gone.png"), "image: file not found: 'gone.png'"),
    ("zero bytes", lambda p: _write(p / "empty.png", b""), "image 'empty.png': not an image file Pillow can read"),
    ("text as png", lambda p: _write(p / "notes.png", b"hello\n" * 50), "image 'notes.png': not an image file"),
    ("truncated", lambda p: _write(p / "cut.png", _png_bytes()[:-40]), "image 'cut.png': the image file is damaged"),
    ("too many pixels", lambda p: str(_png_header_only(p / "wide.png", 5000, 5000)), "5000x5000 pixels is too large"),
    (
        "decompression bomb",
        lambda p: str(_png_header_only(p / "bomb.png", 60000, 60000)),
        "image 'bomb.png': the image is too large; the limit is 16,777,216 pixels",
    ),
    ("too many bytes", lambda p: _write(p / "big.png", b"\0" * (26 * 2**20)), "image: file is 26.0 MiB; the limit"),
    ("a folder", lambda p: str(p), "image: file not found"),
    (
        "float out of range",
        lambda p: _save(p / "f.tiff", Image.fromarray(_digit().astype(np.float32) * 4)),
        f"expected pixel values in 0..255 (or floats in [0, 1]), got values from 0 to {4 * int(_digit().max())} (a float "
        "image; save it with 8 or 16 bits per channel)",
    ),
]


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _save(path, image: Image.Image) -> str:
    image.save(path)
    return str(path)


def _png_bytes() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(_digit()).resize((64, 64)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("make, message", [c[1:] for c in UPLOAD_ERRORS], ids=[c[0] for c in UPLOAD_ERRORS])
def test_bad_uploads_give_one_line_errors(crate_dir, tmp_path, make, message):
    text = _crate_tab_error(crate_dir, make(tmp_path))
    assert message in text and "\n" not in text and "Traceback" not in text, text


def _expected_l(gray: np.ndarray) -> np.ndarray:
    return gray.astype(np.float64)


def _white_composite(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    a = alpha.astype(np.float64)[..., None] / 255
    return rgb.astype(np.float64) * a + 255 * (1 - a)


def _luma(rgb: np.ndarray) -> np.ndarray:
    return rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114  # ITU-R 601-2, Pillow's L


def _modes():
    d = _digit()
    alpha = np.where(d > 0, 255, 0).astype(np.uint8)  # the ink opaque, the background transparent
    ink = np.zeros((*d.shape, 3), np.uint8)
    ink[..., 0] = d  # red strokes; black stored under the transparent pixels
    rgba = Image.fromarray(np.dstack([ink, alpha]), "RGBA")
    half = Image.fromarray(np.dstack([d, np.full_like(d, 128)]), "LA")
    return [
        # (id, PIL image as uploaded, file suffix, expected grayscale pixel values 0..255, tolerance)
        ("RGBA transparent background", rgba, ".png", _luma(_white_composite(ink, alpha)), 1.0),
        ("LA half transparent", half, ".png", _white_composite(d[..., None], np.full_like(d, 128))[..., 0], 1.0),
        ("palette", Image.fromarray(d).convert("P"), ".png", _expected_l(d), 0.0),
        ("1-bit", Image.fromarray(d > 127), ".png", (d > 127) * 255.0, 0.0),
        ("16-bit", Image.fromarray(d.astype(np.uint16) * 257), ".png", _expected_l(d), 0.0),
        ("float in [0, 1]", Image.fromarray(d.astype(np.float32) / 255), ".tiff", _expected_l(d), 0.5),
        ("RGB", Image.fromarray(np.dstack([d, d, d])), ".png", _expected_l(d), 1.0),
        ("CMYK", Image.fromarray(np.dstack([d, d, d])).convert("CMYK"), ".tiff", _expected_l(d), 1.0),
    ]


@pytest.mark.parametrize("image, suffix, want, tol", [m[1:] for m in _modes()], ids=[m[0] for m in _modes()])
def test_image_modes_reach_the_model_as_a_viewer_shows_them(crate_dir, tmp_path, image, suffix, want, tol):
    path = _save(tmp_path / f"upload{suffix}", image)
    loaded = H.get_model(crate_dir)
    got = pixel_values_for([open_image(path)], loaded)  # the Space's path: open_image, then the model's processor
    expected = loaded.processor(images=[Image.fromarray(np.rint(want).astype(np.uint8))], return_tensors="pt")
    assert got.shape == expected["pixel_values"].shape
    std = float(np.asarray(loaded.processor.image_std).reshape(-1)[0])
    gap = float((got - expected["pixel_values"]).abs().max()) * std * 255  # in pixel values 0..255
    assert gap <= tol + 0.5 + 1e-6, gap  # the expected values are rounded to integers


def test_a_mode_pillow_cannot_convert_is_named(crate_dir):
    loaded = H.get_model(crate_dir)
    image = Image.new("HSV", (8, 8))
    try:
        pixels = pixel_values_for([open_image(image)], loaded)
    except ValueError as err:
        assert str(err).startswith("images[0]: Pillow cannot convert mode HSV to L"), err
    else:  # Pillow converts it: then the value is the one of its own RGB route
        want = loaded.processor(images=[image.convert("RGB").convert("L")], return_tensors="pt")["pixel_values"]
        torch.testing.assert_close(pixels, want)


ARGUMENT_ERRORS = [
    # (id, handler call, text of the error)
    ("concepts not a number", lambda d: H.concepts_tab(d, None, "many"), "n_concepts: expected a positive integer"),
    ("extra digits too many", lambda d: H.concepts_tab(d, None, 4, -1, 10**6), "extra digits images: expected 0..256"),
    ("svm n huge", lambda d: H.svm_experiment(n=10**9), "n: expected an integer in [1, 32], got 1000000000"),
    ("svm d text", lambda d: H.svm_experiment(d="wide"), "d: expected an integer in [2, 64], got 'wide'"),
    ("example index huge", lambda d: H.digits_example(10**9), "example: expected an index between 0 and"),
    ("L_phi text", lambda d: H.bounds_tab(d, "abc"), "L_phi: expected a finite number > 0, got 'abc'"),
    ("head out of range", lambda d: H.svm_head_tab(d, None, 1, 99, 2), "head: expected 0..3, got 99"),
    # a fractional number in a box is refused, never truncated to the block below
    ("concepts layer 1.5", lambda d: H.concepts_tab(d, None, 4, 1.5, 3), "layer: expected a whole number, got 1.5"),
    ("svm layer 2.5", lambda d: H.svm_head_tab(d, None, 2.5, 0, 2), "layer: expected a whole number, got 2.5"),
    ("svm head 0.5", lambda d: H.svm_head_tab(d, None, 1, 0.5, 2), "head: expected a whole number, got 0.5"),
    ("svm extra 1.2", lambda d: H.svm_head_tab(d, None, 1, 0, 1.2), "extra digits images: expected a whole number"),
    (
        "concepts layer text",
        lambda d: H.concepts_tab(d, None, 4, "two", 3),
        "layer: expected a whole number, got 'two'",
    ),
]


@pytest.mark.parametrize("call, message", [c[1:] for c in ARGUMENT_ERRORS], ids=[c[0] for c in ARGUMENT_ERRORS])
def test_bad_handler_arguments_give_one_line_errors(crate_dir, call, message):
    with pytest.raises(gr.Error) as err:
        call(crate_dir)
    text = html.unescape(err.value.message)
    assert message in text and "\n" not in text, text
