"""Bad inputs to the Space's handlers (issue 45), one table: each row calls a handler of hf_tdiag/gradio_app as the
browser would (model box, uploaded file path, number boxes, text box) with what a careless visitor might give, and is
classed by what came back:

* ``clear``: a one-line ``gr.Error`` titled "Invalid input" whose message names the input (the expected text);
* ``handled``: a result, and the row's check of it holds;
* ``raw``: an exception other than ``gr.Error`` escaped, or a ``gr.Error`` titled "Internal error" (an unexpected
  exception the handler only wrapped);
* ``unclear``: an "Invalid input" error without the expected text; ``silent-wrong``: a result failing its check.

Every row here must be ``clear`` or ``handled``. :func:`tally` classes the whole table (for the issue's before/after
counts). Models: a 1-block digits CRATE, a tiny BERT without a classifier, a 2-block text CRATE with its tokenizer,
a folder whose config asks for remote code; all local (the operator's ``HF_TDIAG_SPACE_LOCAL_MODELS=1``)."""

from __future__ import annotations

import html
import json
import os
from types import SimpleNamespace

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image

from hf_tdiag.gradio_app import handlers as H
from hf_tdiag.gradio_app import text_handlers as TH

OK = "ok"
TEXT = "The for statement iterates over a sequence."


def _models(root: str) -> SimpleNamespace:
    from pydoc_data.topics import topics

    from transformers import BertConfig, BertModel

    from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor
    from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM
    from hf_tdiag.text_corpus import train_tokenizer

    torch.manual_seed(0)
    ns = SimpleNamespace(root=root)
    ns.crate = os.path.join(root, "crate")
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=1)
    CrateForImageClassification(cfg).save_pretrained(ns.crate)
    CrateImageProcessor.for_config(cfg).save_pretrained(ns.crate)
    ns.bert = os.path.join(root, "bert")
    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(ns.bert)  # fmt: skip
    ns.text = os.path.join(root, "text")
    tokenizer = train_tokenizer([topics["for"], topics["if"]], 300)
    tcfg = CrateTextConfig.from_preset(
        "crate-lm-12l", vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=24, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    CrateTextForCausalLM(tcfg).save_pretrained(ns.text)
    tokenizer.save_pretrained(ns.text)
    ns.remote = os.path.join(root, "remote")
    os.makedirs(ns.remote)
    with open(os.path.join(ns.remote, "config.json"), "w") as fh:
        json.dump(
            {
                "model_type": "mine",
                "auto_map": {"AutoModel": "modeling_mine.MineModel"},
                "architectures": ["MineModel"],
            },
            fh,
        )
    with open(os.path.join(ns.remote, "modeling_mine.py"), "w") as fh:
        fh.write("raise SystemExit('remote code ran')\n")
    ns.empty = os.path.join(root, "empty")
    os.makedirs(ns.empty)
    return ns


def _image(ns, name: str, array=None, mode: str | None = None, size=(8, 8)) -> str:
    """An upload under the case folder: ``array`` saved by Pillow (in ``mode``), else a digit."""
    path = os.path.join(ns.root, name)
    if array is None:
        from sklearn.datasets import load_digits

        array = np.rint(load_digits().images[5] * (255 / 16)).astype(np.uint8)
    img = Image.fromarray(array) if mode is None else Image.fromarray(array).convert(mode)
    if size != img.size:
        img = img.resize(size)
    img.save(path)
    return path


def _bytes(ns, name: str, data: bytes) -> str:
    path = os.path.join(ns.root, name)
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def _digit(ns) -> str:
    return _image(ns, "digit.png")


def _no_local(fn):
    """``fn`` run with local model folders turned off (the Space's default)."""

    def call(ns):
        old = os.environ.pop(H.LOCAL_MODELS_ENV, None)
        try:
            return fn(ns)
        finally:
            if old is not None:
                os.environ[H.LOCAL_MODELS_ENV] = old

    return call


def _labels(result) -> bool:
    return isinstance(result[0], dict) and abs(sum(result[0].values()) - 1) < 1e-3


def _text(result) -> bool:
    return isinstance(result[0], str) and result[0]


# (id, call(ns) -> result, expected: (OK, check(result)) or the text the one-line "Invalid input" message holds)
CASES = [
    # --- the model box
    ("model: a number", lambda ns: H.model_summary(123), "model: expected a Hub id (text), got int"),
    ("model: a list", lambda ns: H.model_summary(["a/b"]), "got list"),
    ("model: a missing folder", lambda ns: H.model_summary(os.path.join(ns.root, "nothing")), "nothing"),
    ("model: a folder without a model", lambda ns: H.model_summary(ns.empty), "empty"),
    ("model: remote code refused", lambda ns: H.model_summary(ns.remote), "trust_remote_code"),
    ("model: a path with local folders off", _no_local(lambda ns: H.model_summary(ns.crate)), "HF_TDIAG_SPACE_LOCAL_MODELS=1"),
    ("model: not a Hub id", _no_local(lambda ns: H.model_summary("not a model id!")), "expected a Hub id"),
    ("model: a saved folder's relative name, local off", _no_local(lambda ns: H.model_summary(os.path.relpath(ns.crate))), "is a local path"),
    ("model: the tiny CRATE summarised", lambda ns: H.model_summary(ns.crate), (OK, lambda r: "crate" in r.lower())),
    ("crate tab: a model without a classifier", lambda ns: H.crate_tab(ns.bert, _digit(ns), -1), "needs an image-classification model"),
    ("crate tab: a text model", lambda ns: H.crate_tab(ns.text, _digit(ns), -1), "needs an image-classification model"),
    ("concepts tab: a text model", lambda ns: H.concepts_tab(ns.text, _digit(ns)), "needs an image-classification model"),
    ("head tab: a text model", lambda ns: H.svm_head_tab(ns.text, _digit(ns)), "this tab feeds images"),
    ("text tab: an image model", lambda ns: TH.text_tab(ns.crate, TEXT), "text"),
    ("bounds tab: remote code refused", lambda ns: H.bounds_tab(ns.remote), "trust_remote_code"),
    # --- uploads
    ("upload: none", lambda ns: H.crate_tab(ns.crate, None, -1), "image: no image given"),
    ("upload: empty path", lambda ns: H.crate_tab(ns.crate, "", -1), "image: no image given"),
    ("upload: a missing file", lambda ns: H.crate_tab(ns.crate, os.path.join(ns.root, "gone.png"), -1), "file not found"),
    ("upload: a folder", lambda ns: H.crate_tab(ns.crate, ns.empty, -1), "image"),
    ("upload: zero bytes", lambda ns: H.crate_tab(ns.crate, _bytes(ns, "z.png", b""), -1), "not an image file"),
    ("upload: text named .png", lambda ns: H.crate_tab(ns.crate, _bytes(ns, "t.png", b"hello\n" * 40), -1), "not an image file"),
    ("upload: a PDF", lambda ns: H.crate_tab(ns.crate, _bytes(ns, "d.pdf", b"%PDF-1.4\n%\xe2\xe3\n"), -1), "not an image file"),
    ("upload: RGBA", lambda ns: H.crate_tab(ns.crate, _image(ns, "a.png", mode="RGBA"), -1), (OK, _labels)),
    ("upload: palette", lambda ns: H.crate_tab(ns.crate, _image(ns, "p.png", mode="P"), -1), (OK, _labels)),
    ("upload: 16-bit", lambda ns: H.crate_tab(ns.crate, _image(ns, "i16.png", np.full((8, 8), 40000, np.uint16)), -1), (OK, _labels)),
    ("upload: float TIFF", lambda ns: H.crate_tab(ns.crate, _image(ns, "f.tif", np.full((8, 8), 0.5, np.float32)), -1), (OK, _labels)),
    ("upload: CMYK JPEG", lambda ns: H.crate_tab(ns.crate, _image(ns, "c.jpg", mode="CMYK"), -1), (OK, _labels)),
    ("upload: 1x1 pixel", lambda ns: H.crate_tab(ns.crate, _image(ns, "one.png", size=(1, 1)), -1), (OK, _labels)),
    ("upload: 600x20 strip", lambda ns: H.crate_tab(ns.crate, _image(ns, "strip.png", size=(600, 20)), -1), (OK, _labels)),
    ("upload: concepts, none and no extra images", lambda ns: H.concepts_tab(ns.crate, None, extra_digits=0), "upload an image or add some digits"),
    ("upload: head tab, none and no extra images", lambda ns: H.svm_head_tab(ns.crate, None, extra_digits=0), "upload an image or add some digits"),
    # --- number boxes
    ("crate tab: layer 2.5", lambda ns: H.crate_tab(ns.crate, _digit(ns), 2.5), "layer: expected a whole number, got 2.5"),
    ("crate tab: layer 'two'", lambda ns: H.crate_tab(ns.crate, _digit(ns), "two"), "layer: expected a whole number, got 'two'"),
    ("crate tab: layer 9", lambda ns: H.crate_tab(ns.crate, _digit(ns), 9), "layer"),
    ("crate tab: layer NaN", lambda ns: H.crate_tab(ns.crate, _digit(ns), float("nan")), "layer: expected a whole number, got nan"),
    ("crate tab: layer True", lambda ns: H.crate_tab(ns.crate, _digit(ns), True), "layer: expected a whole number, got True"),
    ("crate tab: layer -1 (the last)", lambda ns: H.crate_tab(ns.crate, _digit(ns), -1.0), (OK, _labels)),
    ("crate tab: an unknown variant to compare", lambda ns: H.crate_tab(ns.crate, _digit(ns), -1, ["crate-x"]), "compare: unknown variant"),
    ("concepts tab: layer 1.5", lambda ns: H.concepts_tab(ns.crate, _digit(ns), layer=1.5), "layer: expected a whole number, got 1.5"),
    ("concepts tab: layer 7", lambda ns: H.concepts_tab(ns.crate, _digit(ns), layer=7), "layer"),
    ("concepts tab: extra images -1", lambda ns: H.concepts_tab(ns.crate, _digit(ns), extra_digits=-1), "extra digits images: expected 0..256, got -1"),
    ("concepts tab: extra images 10000", lambda ns: H.concepts_tab(ns.crate, _digit(ns), extra_digits=10000), "extra digits images: expected 0..256"),
    ("concepts tab: extra images 3.5", lambda ns: H.concepts_tab(ns.crate, _digit(ns), extra_digits=3.5), "extra digits images: expected a whole number"),
    ("concepts tab: concepts 2.5", lambda ns: H.concepts_tab(ns.crate, _digit(ns), n_concepts=2.5), "n_concepts: expected a whole number, got 2.5"),
    ("concepts tab: concepts 0", lambda ns: H.concepts_tab(ns.crate, _digit(ns), n_concepts=0), "n_concepts"),
    ("concepts tab: concepts 100000", lambda ns: H.concepts_tab(ns.crate, _digit(ns), n_concepts=100000), "n_concepts"),
    ("head tab: head 4 of 4", lambda ns: H.svm_head_tab(ns.crate, _digit(ns), head=4), "head: expected 0..3, got 4"),
    ("head tab: head -1", lambda ns: H.svm_head_tab(ns.crate, _digit(ns), head=-1), "head: expected 0..3, got -1"),
    ("head tab: head 0.5", lambda ns: H.svm_head_tab(ns.crate, _digit(ns), head=0.5), "head: expected a whole number, got 0.5"),
    ("head tab: layer 3", lambda ns: H.svm_head_tab(ns.crate, _digit(ns), layer=3), "layer"),
    ("head tab: extra images 65", lambda ns: H.svm_head_tab(ns.crate, _digit(ns), extra_digits=65), "extra digits images: expected 0..64, got 65"),
    ("head tab: extra images 'many'", lambda ns: H.svm_head_tab(ns.crate, _digit(ns), extra_digits="many"), "extra digits images: expected a whole number"),
    ("head tab: one image measured", lambda ns: H.svm_head_tab(ns.crate, _digit(ns), extra_digits=0), (OK, _text)),
    ("bounds tab: l_phi 'abc'", lambda ns: H.bounds_tab(ns.crate, l_phi="abc"), "l_phi"),
    ("bounds tab: l_phi -1", lambda ns: H.bounds_tab(ns.crate, l_phi=-1.0), "l_phi"),
    ("svm experiment: n 0", lambda ns: H.svm_experiment(n=0, steps=10), "n: expected an integer in"),
    ("svm experiment: n 2.5", lambda ns: H.svm_experiment(n=2.5, steps=10), "n: expected an integer in [1, 32], got 2.5"),
    ("svm experiment: d 'x'", lambda ns: H.svm_experiment(d="x", steps=10), "d: expected an integer in [2, 64], got 'x'"),
    ("svm experiment: steps 10**9", lambda ns: H.svm_experiment(steps=10**9), "steps: expected an integer in"),
    ("svm experiment: seed 'abc'", lambda ns: H.svm_experiment(steps=10, seed="abc"), "seed: expected a whole number, got 'abc'"),
    ("svm experiment: seed 1.5", lambda ns: H.svm_experiment(steps=10, seed=1.5), "seed: expected a whole number, got 1.5"),
    ("svm experiment: seed -1", lambda ns: H.svm_experiment(steps=10, seed=-1), "seed: expected a whole number >= 0, got -1"),
    ("digits example: -1", lambda ns: H.digits_example(-1), "example: expected an index between 0 and"),
    ("digits example: 10**6", lambda ns: H.digits_example(10**6), "example: expected an index between 0 and"),
    ("digits example: 'x'", lambda ns: H.digits_example("x"), "example: expected an integer index, got 'x'"),
    ("digits example: 2.5", lambda ns: H.digits_example(2.5), "example: expected an integer index, got 2.5"),
    ("digits example: 0", lambda ns: H.digits_example(0), (OK, lambda r: isinstance(r, Image.Image))),
    # --- the text box and the text tab's numbers
    ("text tab: no text", lambda ns: TH.text_tab(ns.text, ""), "texts"),
    ("text tab: None", lambda ns: TH.text_tab(ns.text, None), "texts"),
    ("text tab: blank lines only", lambda ns: TH.text_tab(ns.text, " \n\t\n"), "texts"),
    ("text tab: a number", lambda ns: TH.text_tab(ns.text, 42), "texts"),
    ("text tab: continuation tokens 999", lambda ns: TH.text_tab(ns.text, TEXT, new_tokens=999), "continuation tokens: expected 0..32, got 999"),
    ("text tab: continuation tokens -1", lambda ns: TH.text_tab(ns.text, TEXT, new_tokens=-1), "continuation tokens: expected 0..32"),
    ("text tab: continuation tokens 2.5", lambda ns: TH.text_tab(ns.text, TEXT, new_tokens=2.5), "continuation tokens: expected a whole number"),
    ("text tab: layer 5", lambda ns: TH.text_tab(ns.text, TEXT, layer=5), "layer"),
    ("text tab: layer 1.5", lambda ns: TH.text_tab(ns.text, TEXT, layer=1.5), "layer: expected a whole number"),
    ("text tab: a text past the positions, said to be cut", lambda ns: TH.text_tab(ns.text, TEXT * 6), (OK, lambda r: "Text(s) 1 were cut to their first 24 tokens" in r[0])),
    ("text tab: continuation past the positions, said to be shorter", lambda ns: TH.text_tab(ns.text, TEXT, new_tokens=32), (OK, lambda r: "of the 32 tokens asked: the model has no more positions" in r[0])),
    ("text tab: measured", lambda ns: TH.text_tab(ns.text, TEXT, layer=1, new_tokens=2), (OK, _text)),
    ("text tab: a model without a tokenizer", lambda ns: TH.text_tab(ns.bert, TEXT), "tokenizer"),
]  # fmt: skip


def classify(ns, call, expected) -> tuple[str, str]:
    """``(outcome class, message)`` of one row."""
    try:
        result = call(ns)
    except gr.Error as err:
        message = html.unescape(str(err.message))
        if err.title == "Internal error":
            return "raw", message
        if isinstance(expected, tuple):
            return "unclear", message
        return ("clear" if expected in message and "\n" not in message else "unclear"), message
    except BaseException as err:  # noqa: BLE001 - a raw exception is one of the outcomes
        return "raw", f"{type(err).__name__}: {err}"
    if not isinstance(expected, tuple):
        return "silent-wrong", repr(result)[:200]
    return ("handled" if expected[1](result) else "silent-wrong"), repr(result)[:200]


@pytest.fixture(scope="module")
def ns(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(H.LOCAL_MODELS_ENV, "1")
        yield _models(str(tmp_path_factory.mktemp("space_fuzz")))


def tally(root: str) -> dict[str, int]:
    os.environ[H.LOCAL_MODELS_ENV] = "1"
    models = _models(root)
    counts: dict[str, int] = {}
    for _, call, expected in CASES:
        outcome, _ = classify(models, call, expected)
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


@pytest.mark.parametrize("case, call, expected", CASES, ids=[c[0] for c in CASES])
def test_space_case(ns, one_torch_thread, case, call, expected):
    outcome, message = classify(ns, call, expected)
    assert outcome == ("handled" if isinstance(expected, tuple) else "clear"), f"{outcome}: {message}"
