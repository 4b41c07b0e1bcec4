"""hf_tdiag.inputs: the one PIL converter (against both former converters' intended semantics), the one digits
loader, image folders through ``load_dataset("imagefolder")``, text files."""

import io

import numpy as np
import pytest
from PIL import Image

from hf_tdiag.inputs import (
    UserInputError,
    digits_arrays,
    digits_images,
    digits_split,
    digits_test_images,
    images_from_folder,
    load_images,
    open_image,
    text_lines,
    to_pil,
)


def _pixels(image):
    return np.asarray(image)


# ---------------------------------------------------------------- the converter


def test_uint8_arrays_pass_through_unchanged():
    arr = np.arange(48, dtype=np.uint8).reshape(4, 4, 3) * 5
    assert np.array_equal(_pixels(to_pil(arr)), arr)
    gray = np.array([[0, 17], [200, 255]], dtype=np.uint8)
    image = to_pil(gray)
    assert image.mode == "L" and np.array_equal(_pixels(image), gray)


def test_floats_in_unit_range_are_scaled_by_255():
    """The former data_inputs converter's intent: a [0, 1] float image (matplotlib / torchvision) is x255."""
    arr = np.array([[0.0, 0.5], [0.25, 1.0]])
    expected = np.array([[0, 128], [64, 255]], dtype=np.uint8)  # rint(255 * x), 127.5 -> 128
    assert np.array_equal(_pixels(to_pil(arr)), expected)
    assert np.array_equal(_pixels(to_pil(arr.astype(np.float32))), expected)


def test_values_already_in_0_255_keep_their_values():
    """The former trainer converter's intent: int64 / float pixel values 0..255 (e.g. a datasets Sequence column)."""
    ints = [[0, 1, 2], [100, 254, 255]]  # plain lists arrive as int64
    assert np.array_equal(_pixels(to_pil(ints)), np.array(ints, dtype=np.uint8))
    floats = np.array([[0.0, 3.4], [127.6, 255.0]])
    assert np.array_equal(_pixels(to_pil(floats)), np.array([[0, 3], [128, 255]], dtype=np.uint8))


@pytest.mark.parametrize("bad", [np.array([[-1.0, 0.5]]), np.array([[0, 256]]), np.array([[3.0, 300.0]])])
def test_out_of_range_values_are_refused_not_clipped(bad):
    with pytest.raises(ValueError, match=r"image: expected pixel values in 0\.\.255"):
        to_pil(bad)


def test_nan_and_wrong_shapes_name_the_input():
    with pytest.raises(ValueError, match="frame: contains NaN"):
        to_pil(np.array([[0.1, np.nan]]), name="frame")
    with pytest.raises(ValueError, match=r"image: expected an \(H, W\).*got shape \(2, 2, 2, 2\)"):
        to_pil(np.zeros((2, 2, 2, 2)))
    with pytest.raises(TypeError, match="numeric image array"):
        to_pil(np.array([["a", "b"]]))


def test_channels_first_bool_and_single_channel_layouts():
    chw = np.zeros((3, 2, 5), dtype=np.uint8)
    chw[0] = 255  # red plane
    image = to_pil(chw)
    assert image.size == (5, 2) and image.getpixel((4, 1)) == (255, 0, 0)
    assert to_pil(np.zeros((4, 4, 1), dtype=np.uint8)).mode == "L"
    assert np.array_equal(_pixels(to_pil(np.array([[True, False]]))), np.array([[255, 0]], dtype=np.uint8))


def test_encoded_images_decode_and_bad_files_are_named(tmp_path):
    buf = io.BytesIO()
    Image.new("RGB", (3, 2), (9, 8, 7)).save(buf, format="PNG")
    assert to_pil({"bytes": buf.getvalue(), "path": None}).getpixel((2, 1)) == (9, 8, 7)  # datasets' encoded form
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(UserInputError, match="broken.png.*not an image file"):
        to_pil({"bytes": None, "path": str(bad)})
    with pytest.raises(UserInputError, match="broken.png.*not an image file"):
        open_image(bad)


# ---------------------------------------------------------------- digits


def test_digits_are_scaled_0_16_to_0_255_and_one_split_serves_everyone():
    from sklearn.datasets import load_digits

    raw = load_digits()
    images, labels = digits_arrays()
    assert images.dtype == np.uint8 and images.shape == (1797, 8, 8)
    assert np.array_equal(images, np.rint(raw.images * 255 / 16).astype(np.uint8)) and np.array_equal(
        labels, raw.target
    )
    x_train, x_test, y_train, y_test = digits_split()
    assert len(x_train) == 1437 and len(x_test) == 360
    for a, b in zip(digits_split(), (x_train, x_test, y_train, y_test)):
        assert np.array_equal(a, b)  # fixed: random_state=0
    assert np.bincount(y_test).min() >= 35  # stratified: every class ~36 times
    pil, lab = digits_test_images()
    assert lab == [int(y) for y in y_test] and all(np.array_equal(_pixels(p), x) for p, x in zip(pil, x_test))
    assert len(digits_test_images(5)[0]) == 5
    everything = digits_images(limit=4, rgb=True)
    assert everything.images[0].mode == "RGB" and everything.labels == [int(t) for t in raw.target[:4]]
    with pytest.raises(ValueError, match="split"):
        digits_images(split="val")


# ---------------------------------------------------------------- folders and text


def test_image_folder_through_datasets_names_the_bad_file(tmp_path):
    root = tmp_path / "imgs"
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        Image.new("L", (4, 4), 7).save(root / cls / "a.png")
    found = images_from_folder(root)
    assert found.label_names == ["cat", "dog"] and found.labels == [0, 1] and found.source == str(root)
    (root / "dog" / "zz.png").write_bytes(b"garbage")
    with pytest.raises(UserInputError, match="zz.png"):
        load_images(root)


def test_text_lines(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("a\n\n  b \nc\n", encoding="utf-8")
    assert text_lines(f) == ["a", "b", "c"] and text_lines(f, 2) == ["a", "b"]
    f.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ValueError, match="texts: .* is not UTF-8"):
        text_lines(f)
