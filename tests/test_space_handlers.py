"""Space handlers called directly (no server): results against direct model calls, clear errors for bad input."""

from __future__ import annotations

import html
import math

import gradio as gr
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor
from hf_tdiag.gradio_app import handlers as H
from hf_tdiag.report.html import format_value


def _one_number_format(rows):
    """Every float cell of a table in one style: all fixed-point or all scientific (integers and words aside)."""
    floats = [v for row in rows for v in row[1:] if isinstance(v, str) and any(c.isdigit() for c in v) and "." in v]
    styles = {"e" in v for v in floats}
    assert len(styles) <= 1, floats


@pytest.fixture(scope="module", autouse=True)
def _local_models_allowed():
    """These tests feed save_pretrained folders, which the Space accepts only when the operator allows them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(H.LOCAL_MODELS_ENV, "1")
        yield


@pytest.fixture(scope="module")
def crate_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, id2label={i: f"digit {i}" for i in range(10)})
    path = tmp_path_factory.mktemp("space_crate")
    CrateForImageClassification(cfg).save_pretrained(path)
    CrateImageProcessor.for_config(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    path = tmp_path_factory.mktemp("space_bert")
    BertModel(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture()
def digit_png(tmp_path):
    from sklearn.datasets import load_digits

    arr = np.rint(load_digits().images[5] * (255 / 16)).astype(np.uint8)
    path = tmp_path / "digit.png"
    Image.fromarray(arr).save(path)
    return str(path)


def _message(excinfo) -> str:
    return html.unescape(excinfo.value.message)


def test_crate_tab_prediction_matches_direct_forward(crate_dir, digit_png):
    labels, heads_fig, layers_fig, srr_fig, table = H.crate_tab(crate_dir, digit_png, -1)
    model = CrateForImageClassification.from_pretrained(crate_dir).eval()
    pv = CrateImageProcessor.from_pretrained(crate_dir)(images=Image.open(digit_png), return_tensors="pt")[
        "pixel_values"
    ]
    with torch.no_grad():
        probs = model(pixel_values=pv).logits.softmax(-1)[0]
    assert list(labels) == [f"digit {i}" for i in range(10)]
    np.testing.assert_allclose([labels[f"digit {i}"] for i in range(10)], probs.numpy(), rtol=1e-5)
    assert isinstance(heads_fig, Figure) and isinstance(layers_fig, Figure)
    # one panel per head of the chosen layer / per layer, each holding the image and the attention overlay
    assert sum(1 for ax in heads_fig.axes if len(ax.images) == 2) == model.config.num_attention_heads
    assert sum(1 for ax in layers_fig.axes if len(ax.images) == 2) == model.config.num_hidden_layers
    assert "layer 4" in heads_fig._suptitle.get_text()  # -1 / out of range: the last of 4 blocks
    # SRR curves: one line per term panel for this model, values = layer_srr of this image
    import hf_tdiag

    srr = hf_tdiag.layer_srr(model, pv, progress=False)
    srr_panel = next(ax for ax in srr_fig.axes if ax.get_title().startswith("SRR"))
    lines = srr_panel.get_lines()
    # x = 0 the embeddings Z^0, x = l the output of block l
    np.testing.assert_allclose(
        lines[0].get_ydata(), [srr.embeddings["mean"]["srr"]] + srr.mean["output"]["srr"], rtol=1e-9
    )
    top = max(labels, key=labels.get)
    assert f"| crate (this model) | {top} | {labels[top]:.3f} |" in table


def test_crate_tab_compares_variants(crate_dir, digit_png, monkeypatch, tmp_path):
    # the default model of a variant is another saved CRATE: point the default cache at prepared folders
    from hf_tdiag.gradio_app import default_model

    monkeypatch.setenv(default_model.CACHE_ENV, str(tmp_path))
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, variant="crate-c")
    folder = default_model.default_model_dir("crate-c")
    torch.manual_seed(1)
    CrateForImageClassification(cfg).save_pretrained(folder)
    CrateImageProcessor.for_config(cfg).save_pretrained(folder)
    labels, _, _, srr_fig, table = H.crate_tab(crate_dir, digit_png, 1, ["crate-c"])
    assert "| crate-c (default digits model) |" in table
    panel = next(ax for ax in srr_fig.axes if ax.get_title().startswith("SRR"))
    assert len(panel.get_lines()) >= 2  # this model and crate-c (solid block outputs; dashed mid states)
    with pytest.raises(gr.Error) as excinfo:
        H.crate_tab(crate_dir, digit_png, 1, ["crate-x"])
    assert "unknown variant" in _message(excinfo)


def test_crate_tab_accepts_rgb_upload_and_refuses_a_bad_layer(crate_dir, tmp_path):
    rgb = tmp_path / "rgb.jpg"
    Image.new("RGB", (40, 30), (10, 200, 30)).save(rgb)
    for bad in (17, 0, -5):  # out of range: refused, never replaced by another layer
        with pytest.raises(gr.Error) as excinfo:
            H.crate_tab(crate_dir, str(rgb), bad)
        assert _message(excinfo) == f"layer: expected a block number 1..4 or -4..-1 from the end, got {bad}"
    labels, heads_fig, *_ = H.crate_tab(crate_dir, str(rgb), -1)
    assert sum(labels.values()) == pytest.approx(1.0, abs=1e-5)
    assert "layer 4" in heads_fig._suptitle.get_text()  # -1: the last of 4 blocks


def test_non_image_file_gives_clear_error(crate_dir, tmp_path):
    bad = tmp_path / "notes.png"
    bad.write_text("this is text")
    with pytest.raises(gr.Error) as excinfo:
        H.crate_tab(crate_dir, str(bad), 1)
    assert "not an image file" in _message(excinfo) and "notes.png" in _message(excinfo)


def test_huge_image_gives_clear_error(crate_dir, tmp_path):
    big = tmp_path / "big.png"
    Image.new("1", (6000, 6000)).save(big)
    with pytest.raises(gr.Error) as excinfo:
        H.crate_tab(crate_dir, str(big), 1)
    assert "too large" in _message(excinfo) and "6000x6000" in _message(excinfo)


def test_missing_image_gives_clear_error(crate_dir):
    with pytest.raises(gr.Error) as excinfo:
        H.crate_tab(crate_dir, None, 1)
    assert "no image given" in _message(excinfo)


def test_wrong_model_type_gives_clear_error(bert_dir, digit_png):
    with pytest.raises(gr.Error) as excinfo:
        H.crate_tab(bert_dir, digit_png, 1)
    msg = _message(excinfo)
    assert "image-classification model" in msg and "bert" in msg


def test_unknown_ids_and_paths_give_clear_errors(digit_png, tmp_path):
    with pytest.raises(gr.Error) as excinfo:
        H.crate_tab("someone/does-not-exist", digit_png, 1)  # Hub is offline in tests (HF_HUB_OFFLINE=1)
    assert "neither a local model folder nor a model id reachable on the Hub" in _message(excinfo)
    with pytest.raises(gr.Error) as excinfo:
        H.model_summary(str(tmp_path / "no" / "such" / "folder"))
    assert "not an existing folder" in _message(excinfo)
    with pytest.raises(gr.Error) as excinfo:
        H.model_summary(digit_png)
    assert "expected a model folder" in _message(excinfo)


def test_unexpected_exceptions_become_short_errors():
    @H.user_errors
    def boom():
        raise RuntimeError("<kaboom>")

    with pytest.raises(gr.Error) as excinfo:
        boom()
    # the toast renders its text as HTML: a "<" opening a tag is escaped, nothing else (API clients read it plain)
    assert excinfo.value.message == "RuntimeError: &lt;kaboom>"


def test_model_summary_describes_the_model(crate_dir, bert_dir):
    text = H.model_summary(crate_dir)
    assert "`crate`" in text and "4 layers" in text and "4 heads × 16" in text and "10 classes" in text
    text = H.model_summary(bert_dir)
    assert "`bert`" in text and "1 layers" in text and "text input" in text


def test_model_cache_reuses_loaded_models(crate_dir):
    assert H.get_model(crate_dir) is H.get_model(" " + crate_dir + " ")


def test_digits_example_returns_held_out_digit():
    from hf_tdiag.inputs import digits_test_images

    images, labels = digits_test_images()
    image = H.digits_example(2)
    assert image.size == (8, 8) and image.mode == "L"
    assert np.array_equal(np.asarray(image), np.asarray(images[2]))
    with pytest.raises(gr.Error) as excinfo:
        H.digits_example(len(images))
    assert "between 0 and" in _message(excinfo)


def test_bounds_tab_matches_schatten_bounds(crate_dir, bert_dir):
    import hf_tdiag

    for folder in (crate_dir, bert_dir):
        text, heatmap, spectra, contrib, rows = H.bounds_tab(folder, 1.13)
        direct = hf_tdiag.schatten_bounds(folder)
        assert f"{format_value(direct.schatten_bound)}" in text and f"{format_value(direct.edelman_bound)}" in text
        assert len(rows) == len(direct.matrices)
        assert [float(r[6]) for r in rows] == pytest.approx([m.p_opt for m in direct.matrices], rel=1e-3, abs=1e-12)
        _one_number_format(rows)
        assert all(isinstance(f, Figure) for f in (heatmap, spectra, contrib))
    with pytest.raises(gr.Error) as excinfo:
        H.bounds_tab(crate_dir, "abc")
    assert "L_phi" in _message(excinfo)


def test_concepts_tab_reports_fidelity(crate_dir, digit_png):
    import hf_tdiag
    from hf_tdiag.inputs import digits_test_images
    from hf_tdiag.loading import load_model, pixel_values_for

    text, heat, top, kl, rows = H.concepts_tab(crate_dir, digit_png, 3, 1, 5)
    values = dict((q, v) for q, v in rows)
    loaded = load_model(crate_dir)
    pv = pixel_values_for([Image.open(digit_png)] + digits_test_images(5)[0], loaded)
    direct = hf_tdiag.concept_fidelity(loaded.model, pv, 1, 3, bounds=False, progress=False)
    # shown to 4 significant digits (people read the table; the JSON-able numbers stay in the API), one format
    assert float(values["δ_rec = ‖A − Â‖_F (mean over images)"]) == pytest.approx(direct["delta_rec"], rel=1e-3)
    assert float(values["δ_gram = √L_gram"]) == pytest.approx(direct["delta_gram"], rel=1e-3)
    numbers = {q: v for q, v in values.items() if not q.startswith("↳")}  # "↳ ..." rows: a bound's label and why
    assert all(len(v.replace("-", "").replace(".", "").split("e")[0].lstrip("0")) <= 4 for v in numbers.values())
    _one_number_format([[q, v] for q, v in numbers.items()])
    assert "3 concepts after block 1" in text and "6 images" in text
    assert "Shown: " in text and "of 3 concepts" in text  # which concepts the figures show, and why not the rest
    for words in ("certified constants", "estimated constants"):
        bound = float(values[f"KL bound, {words} (mean)"])
        line = next(line for line in text.split("\n") if f"**KL bound, {words}**" in line)
        assert ("**vacuous**" in line) is (bound > math.log(10)), line  # above log C = log 10: labelled, with why
        labels = [v for q, v in values.items() if q.startswith(f"↳ KL bound, {words}: above log C = 2.3")]
        assert labels == (["vacuous"] if bound > math.log(10) else [])
    assert all(isinstance(f, Figure) for f in (heat, top, kl))
    with pytest.raises(gr.Error) as excinfo:
        H.concepts_tab(crate_dir, None, 3, 1, 0)
    assert "upload an image" in _message(excinfo)


def test_concepts_note_says_which_concepts_are_shown_and_why_not_the_others():
    from hf_tdiag.report.concept_section import shown_concepts, shown_concepts_note

    codes = torch.zeros(2, 5, 8)  # 2 images x 5 patches x 8 concepts; concepts 5 and 7 never active
    strengths = {0: 9.0, 1: 8.0, 2: 7.0, 3: 6.0, 4: 5.0, 6: 4.0, 5: 0.0, 7: 0.0}
    for k, v in strengths.items():
        codes[0, k % 5, k] = v
    assert shown_concepts(codes) == [0, 1, 2, 3, 4, 6]  # the columns: largest mean code first
    assert shown_concepts_note(codes, shown_concepts(codes)) == (
        "Shown: 6 of 8 concepts (0, 1, 2, 3, 4, 6), largest mean code first; 2 of 8 concepts (5, 7) are active on "
        "no patch of these inputs (every code 0)."
    )
    codes[1, 0, 7] = 0.5  # concept 7 active, but weaker than the six shown
    assert shown_concepts_note(codes, shown_concepts(codes)).endswith(
        "1 of 8 concepts (5) are active on no patch of these inputs (every code 0); left out as weaker (smaller mean "
        "code): 7."
    )


def test_svm_experiment_reports_gd_correlation_with_w_mm():
    from hf_tdiag.experiments.attention_gd import make_attention_data, train_attention
    from hf_tdiag.measures.attention_svm import att_svm

    text, fig = H.svm_experiment(3, 4, 8, 200, 0)
    data = make_attention_data(3, 4, 8, seed=0)
    svm = att_svm(data.X, data.z, data.optimal, norm="fro")
    run = train_attention(data, param="W", steps=200, lr=0.5, references={"mm": svm.W}, record_every=1, seed=0)
    final = float(run.correlation["mm"][-1])
    assert f"| W | fro | {final:.4f} |" in text and "| KQ | nuc |" in text
    assert "Over-parameterized (d ≥ max(T−1, n)): **yes**" in text
    assert isinstance(fig, Figure) and len(fig.axes[0].get_lines()) >= 2
    # both runs take the slider's number of steps (the (K, Q) curve used to run twice as long as the slider said)
    assert {int(line.get_xdata()[-1]) for line in fig.axes[0].get_lines() if len(line.get_xdata()) > 2} == {200}
    with pytest.raises(gr.Error) as excinfo:
        H.svm_experiment(3, 4, 500, 200, 0)
    assert "d: expected an integer in [2, 64]" in _message(excinfo)


def test_svm_head_tab_matches_diagnostic(crate_dir, digit_png, bert_dir):
    import hf_tdiag
    from hf_tdiag.inputs import digits_test_images
    from hf_tdiag.loading import load_model, pixel_values_for

    text, fig, rows = H.svm_head_tab(crate_dir, digit_png, -1, 1, 3)
    loaded = load_model(crate_dir)
    pv = pixel_values_for([Image.open(digit_png)] + digits_test_images(3)[0], loaded)
    diag = hf_tdiag.attention_svm_diagnostic(loaded.model, pv, 4, 1, max_queries=64)
    values = dict((q, v) for q, v in rows)
    assert float(values["corr(W_h, W_mm)"]) == pytest.approx(diag.correlation, rel=1e-3)
    assert values["SVM feasible"] in ("yes", "no")  # never a raw Python True
    _one_number_format(rows)
    assert f"{diag.correlation:.4f}" in text and "Head 1 of layer 4 on 4 images" in text
    assert isinstance(fig, Figure)
    for args, needle in (
        ((crate_dir, digit_png, 1, 9, 0), "head: expected 0..3"),
        ((crate_dir, digit_png, 0, 0, 0), "layer: expected a block number 1..4"),
        ((bert_dir, digit_png, 0, 0, 0), "text model"),
    ):
        with pytest.raises(gr.Error) as excinfo:
            H.svm_head_tab(*args)
        assert needle in _message(excinfo)


def test_crate_tab_works_for_a_vit_classifier(tmp_path, digit_png):
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=3,
    )
    torch.manual_seed(0)
    model = ViTForImageClassification(cfg).eval()
    model.save_pretrained(tmp_path)  # no processor saved: a ViT processor for the config's size is used
    labels, heads_fig, layers_fig, _, table = H.crate_tab(str(tmp_path), digit_png, 1)
    from hf_tdiag.loading import load_model, pixel_values_for

    pv = pixel_values_for([Image.open(digit_png)], load_model(str(tmp_path)))
    assert pv.shape == (1, 3, 32, 32)
    with torch.no_grad():
        probs = model(pixel_values=pv).logits.softmax(-1)[0]
    np.testing.assert_allclose([labels[f"LABEL_{i}"] for i in range(3)], probs.numpy(), rtol=1e-5)
    assert sum(1 for ax in heads_fig.axes if len(ax.images) == 2) == 4
    assert "| vit (this model) |" in table


def test_server_paths_are_refused_unless_the_operator_allows_them(crate_dir, tmp_path, monkeypatch):
    """A visitor cannot load the server's folders, nor probe paths: an existing model folder, an existing folder
    without config.json and a missing path all get the same answer, naming what was typed and how the operator
    allows local folders."""
    monkeypatch.delenv(H.LOCAL_MODELS_ENV)
    (tmp_path / "empty").mkdir()
    answers = []
    for spec in (crate_dir, str(tmp_path / "empty"), str(tmp_path / "missing"), "../etc", "./runs/main", "~/x"):
        with pytest.raises(gr.Error) as excinfo:
            H.model_summary(spec)
        message = _message(excinfo)
        assert "local folders are turned off" in message and f"{H.LOCAL_MODELS_ENV}=1" in message
        answers.append(message.replace(repr(spec), "SPEC"))
    assert len(set(answers)) == 1
    # a Hub-id-shaped name that is a saved model's folder in the working directory (runs/main) is that folder: the
    # same refusal, not a download attempt; a name that is no model folder here goes to the Hub
    monkeypatch.chdir(tmp_path)
    CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).save_pretrained("runs/main")
    with pytest.raises(gr.Error) as excinfo:
        H.model_summary("runs/main")
    assert _message(excinfo).replace("'runs/main'", "SPEC") == answers[0]
    (tmp_path / "org" / "name").mkdir(parents=True)  # a folder, but no saved model in it
    with pytest.raises(gr.Error) as excinfo:
        H.model_summary("org/name")  # tests run offline: the Hub cannot be reached, and the message says so
    assert _message(excinfo).startswith("model: the Hugging Face Hub could not be reached from this server, so 'org/")
    monkeypatch.setenv(H.LOCAL_MODELS_ENV, "1")
    assert "`crate`" in H.model_summary(crate_dir)
    assert "`crate`" in H.model_summary("runs/main")


def test_concepts_tab_takes_minus_one_as_the_middle_and_refuses_other_bad_layers(crate_dir, digit_png):
    for bad in (-3, 9):  # only -1 has a meaning (the middle block); nothing else is replaced by a default
        with pytest.raises(gr.Error) as excinfo:
            H.concepts_tab(crate_dir, digit_png, 2, bad, 3)
        assert _message(excinfo).startswith(f"layer: expected a block number 0..4 (0 = the embeddings), got {bad}")
