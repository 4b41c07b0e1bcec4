"""Bad inputs to the Python helpers issue 45 added or changed, one table: each row calls one function with what a
careless user might pass and expects either a one-line ValueError/TypeError naming the input, or the value a user
means (``("ok", expected)``). The helpers: class names (:func:`check_unique_labels`), numbers typed into a form
(:func:`whole_number`: what a Space handler should call for a layer), token ids a text model can embed
(:func:`check_token_ids`), loaded checkpoints (:func:`check_dense_tensors`), text files (:func:`text_lines`: BOM,
missing, folder), images given to a pipeline (:func:`read_pipeline_image`) and array images (:func:`to_pil`: complex,
object, NaN, out-of-range values)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from hf_tdiag._validation import check_dense_tensors, check_token_ids, check_unique_labels, whole_number
from hf_tdiag.inputs import load_images, text_lines, to_pil

OK = "ok"


def _file(tmp_path, data: bytes, name: str = "t.txt") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def _image_tree(tmp_path, folder: bytes, name: bytes) -> str:
    """``tmp_path/<folder>/cls/<name>``, an 8x8 PNG, names given as bytes (as another system wrote them)."""
    from PIL import Image

    root = os.path.join(os.fsencode(str(tmp_path)), folder)
    os.makedirs(os.path.join(root, b"cls"), exist_ok=True)
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(os.fsdecode(os.path.join(root, b"cls", name)))
    return os.fsdecode(root)


# (id, call(tmp_path) -> result, expected: ("ok", value) or (exception type, text in its one-line message))
CASES = [
    # class names: two classes of one name would share one label2id entry
    ("labels: distinct", lambda p: check_unique_labels(["cat", "dog"]), (OK, ["cat", "dog"])),
    ("labels: a repeated name", lambda p: check_unique_labels(["cat", "dog", "cat"]), (ValueError, "'cat' is given twice (classes 0 and 2)")),
    ("labels: numbers as names", lambda p: check_unique_labels([0, 1, 2]), (OK, ["0", "1", "2"])),
    ("labels: 1 and '1' are one name", lambda p: check_unique_labels([1, "1"]), (ValueError, "'1' is given twice")),
    ("labels: empty list", lambda p: check_unique_labels([]), (OK, [])),
    ("labels: case differs", lambda p: check_unique_labels(["Cat", "cat"]), (OK, ["Cat", "cat"])),
    ("labels: the name in the message", lambda p: check_unique_labels(["a", "a"], "--labels"), (ValueError, "--labels: the name 'a'")),
    # numbers typed into a form: never truncated
    ("layer: 3", lambda p: whole_number(3, "layer"), (OK, 3)),
    ("layer: 3.0 from a number box", lambda p: whole_number(3.0, "layer"), (OK, 3)),
    ("layer: 2.5", lambda p: whole_number(2.5, "layer"), (ValueError, "layer: expected a whole number, got 2.5")),
    ("layer: -1.0", lambda p: whole_number(-1.0, "layer"), (OK, -1)),
    ("layer: '4' typed", lambda p: whole_number("4", "layer"), (OK, 4)),
    ("layer: ' -2 ' typed", lambda p: whole_number(" -2 ", "layer"), (OK, -2)),
    ("layer: '2.5' typed", lambda p: whole_number("2.5", "layer"), (ValueError, "got '2.5'")),
    ("layer: 'two'", lambda p: whole_number("two", "layer"), (ValueError, "got 'two'")),
    ("layer: NaN", lambda p: whole_number(float("nan"), "layer"), (ValueError, "got nan")),
    ("layer: inf", lambda p: whole_number(float("inf"), "layer"), (ValueError, "got inf")),
    ("layer: True", lambda p: whole_number(True, "layer"), (ValueError, "got True")),
    ("layer: None with a default", lambda p: whole_number(None, "layer", default=-1), (OK, -1)),
    ("layer: None without a default", lambda p: whole_number(None, "layer"), (ValueError, "got None")),
    ("layer: numpy 2.0", lambda p: whole_number(np.float32(2.0), "layer"), (OK, 2)),
    ("layer: numpy int", lambda p: whole_number(np.int64(5), "layer"), (OK, 5)),
    ("head: 0.999", lambda p: whole_number(0.999, "head"), (ValueError, "head: expected a whole number")),
    # token ids a text model can embed
    ("ids: in range", lambda p: check_token_ids(torch.tensor([[0, 5, 9]]), 10), (OK, None)),
    ("ids: empty batch", lambda p: check_token_ids(torch.zeros(1, 0, dtype=torch.long), 10), (ValueError, "input_ids: no tokens (shape (1, 0))")),
    ("ids: no sequences", lambda p: check_token_ids(torch.zeros(0, dtype=torch.long), 10), (ValueError, "no tokens")),
    ("ids: one past the vocabulary", lambda p: check_token_ids(torch.tensor([[1, 10]]), 10), (ValueError, "the id 10 is outside the vocabulary of 10 tokens")),
    ("ids: negative", lambda p: check_token_ids(torch.tensor([[-1, 2]]), 10), (ValueError, "the id -1 is outside")),
    ("ids: floats", lambda p: check_token_ids(torch.tensor([[1.0]]), 10), (TypeError, "expected an integer tensor of token ids, got torch.float32")),
    ("ids: a list", lambda p: check_token_ids([[1, 2]], 10), (TypeError, "got list")),
    ("ids: booleans", lambda p: check_token_ids(torch.tensor([[True]]), 10), (TypeError, "torch.bool")),
    ("ids: the name in the message", lambda p: check_token_ids(torch.tensor([[99]]), 10, "--texts token ids"), (ValueError, "--texts token ids: the id 99")),
    # loaded checkpoints
    ("checkpoint: dense", lambda p: check_dense_tensors({"w": torch.ones(2)}, "ck"), (OK, None)),
    ("checkpoint: meta", lambda p: check_dense_tensors({"w": torch.empty(2, device="meta")}, "ck"), (ValueError, "ck: the tensor 'w' is on the meta device")),
    ("checkpoint: sparse COO", lambda p: check_dense_tensors({"w": torch.eye(2).to_sparse()}, "ck"), (ValueError, "'w' is sparse_coo")),
    ("checkpoint: sparse CSR", lambda p: check_dense_tensors({"w": torch.eye(2).to_sparse_csr()}, "ck"), (ValueError, "'w' is sparse_csr")),
    ("checkpoint: nested meta", lambda p: check_dense_tensors({"model": {"w": torch.empty(1, device="meta")}}, "ck"), (ValueError, "'model.w'")),
    ("checkpoint: non-tensor entries", lambda p: check_dense_tensors({"epoch": 3, "args": {"lr": 0.1}}, "ck"), (OK, None)),
    # text files
    ("texts: BOM stripped", lambda p: text_lines(_file(p, "\ufeffhello\nworld\n".encode())), (OK, ["hello", "world"])),
    ("texts: BOM only line", lambda p: text_lines(_file(p, "\ufeff\n\nx\n".encode())), (OK, ["x"])),
    ("texts: CRLF", lambda p: text_lines(_file(p, b"a\r\nb\r\n")), (OK, ["a", "b"])),
    ("texts: missing", lambda p: text_lines(str(p / "none.txt")), (ValueError, "does not exist; expected a text file")),
    ("texts: a folder", lambda p: text_lines(str(p)), (ValueError, "is a folder; expected a text file")),
    ("texts: UTF-16", lambda p: text_lines(_file(p, "hi".encode("utf-16"))), (ValueError, "is not UTF-8 text")),
    ("texts: latin-1", lambda p: text_lines(_file(p, "café".encode("latin-1"))), (ValueError, "is not UTF-8 text")),
    ("texts: blank", lambda p: text_lines(_file(p, b" \n\t\n")), (ValueError, "has no non-empty lines")),
    # image folders whose names are not UTF-8 (the datasets library fails on the whole folder)
    ("folder: non-UTF-8 folder name", lambda p: load_images(_image_tree(p, b"d\xff", b"a.png")), (ValueError, "b'd\\xff' in")),
    ("folder: non-UTF-8 file name", lambda p: load_images(_image_tree(p, b"d", b"\xe9t\xe9.png")), (ValueError, "is not valid UTF-8")),
    ("folder: UTF-8 names", lambda p: len(load_images(_image_tree(p, "dé".encode(), "été.png".encode())).images), (OK, 1)),
    # array images
    ("image: complex values", lambda p: to_pil(np.ones((8, 8), dtype=np.complex64)), (TypeError, "expected a numeric image array, got dtype complex64")),
    ("image: complex tensor", lambda p: to_pil(torch.ones(8, 8, dtype=torch.complex64)), (TypeError, "got dtype complex64")),
    ("image: object array", lambda p: to_pil(np.array([["a"]], dtype=object)), (TypeError, "got dtype object")),
    ("image: NaN", lambda p: to_pil(np.full((8, 8), np.nan)), (ValueError, "contains NaN or inf")),
    ("image: 1e30", lambda p: to_pil(np.full((8, 8), 1e30)), (ValueError, "expected pixel values in 0..255")),
    ("image: negative", lambda p: to_pil(np.full((8, 8), -1.0)), (ValueError, "got values from -1 to -1")),
    ("image: floats in [0, 1]", lambda p: np.asarray(to_pil(np.full((2, 2), 0.5))).tolist(), (OK, [[128, 128], [128, 128]])),
    ("image: empty", lambda p: to_pil(np.zeros((0, 8))), (ValueError, "expected a non-empty image")),
    ("image: 5 channels", lambda p: to_pil(np.zeros((8, 8, 5))), (ValueError, "got shape (8, 8, 5)")),
    ("image: a name in the message", lambda p: to_pil(np.full((2, 2), 300.0), "pixels[3]"), (ValueError, "pixels[3]: expected pixel values")),
]  # fmt: skip


@pytest.mark.parametrize("case, call, expected", CASES, ids=[c[0] for c in CASES])
def test_api_case(tmp_path, case, call, expected):
    kind, value = expected
    if kind == OK:
        assert call(tmp_path) == value
        return
    with pytest.raises(kind) as info:
        call(tmp_path)
    message = str(info.value)
    assert value in message and "\n" not in message, message
