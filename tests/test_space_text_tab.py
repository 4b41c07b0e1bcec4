"""The Space's Text tab (gradio_app/text_handlers.py) called directly: the perplexity, continuation, SRR and ledger it
shows against direct calls on the model, the refusals, and the default text model's cache (slow: trains a tokenizer
on the whole corpus)."""

from __future__ import annotations

import html
import math

import gradio as gr
import pytest
import torch
from matplotlib.figure import Figure

from hf_tdiag.gradio_app import handlers as H
from hf_tdiag.gradio_app import text_handlers as TH
from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM

TEXTS = "The for statement iterates over a sequence.\nA function object is created by a def statement."


@pytest.fixture(scope="module", autouse=True)
def _local_models_allowed():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(H.LOCAL_MODELS_ENV, "1")
        yield


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    from pydoc_data.topics import topics

    from hf_tdiag.text_corpus import train_tokenizer

    tokenizer = train_tokenizer([topics["for"], topics["function"], topics["if"]], 300)
    config = CrateTextConfig.from_preset(
        "crate-lm-12l", vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=40, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("space_text")
    CrateTextForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_text_tab_numbers_match_direct_calls(text_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_tdiag

    summary, attention, srr_fig, ledger_fig, rows = TH.text_tab(text_dir, TEXTS, layer=1, new_tokens=4)
    model = AutoModelForCausalLM.from_pretrained(text_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(text_dir)
    lines = TEXTS.splitlines()
    batch = tokenizer(lines, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    # perplexity: the mean next-token cross-entropy over pairs of real tokens, written out
    total, count = 0.0, 0
    for b in range(len(lines)):
        n = int(batch["attention_mask"][b].sum())
        ids = batch["input_ids"][b, :n]
        total += float(torch.nn.functional.cross_entropy(logits[b, : n - 1], ids[1:], reduction="sum"))
        count += n - 1
    assert f"Next-token perplexity on them: {math.exp(total / count):.4g}." in summary
    first = tokenizer(lines[0], return_tensors="pt")
    generated = model.generate(**first, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    continuation = tokenizer.decode(generated[0, first["input_ids"].shape[1] :], skip_special_tokens=True)
    assert f"Greedy continuation of the first text: {TH.markdown_literal(continuation)}" in summary
    # the ledger table is objective_ledger's on the same batch; the SRR panel holds layer_srr's numbers
    ledger = hf_tdiag.objective_ledger(model, batch)
    assert [(int(r[0]), r[1]) for r in rows] == [(s.layer, s.step) for s in ledger.steps]
    assert [float(r[3]) for r in rows] == pytest.approx([s.before for s in ledger.steps], rel=1e-3)
    srr = hf_tdiag.layer_srr(model, dict(batch), progress=False)
    panel = next(ax for ax in srr_fig.axes if ax.get_title().startswith("SRR"))
    assert list(panel.get_lines()[0].get_ydata()) == pytest.approx(
        [srr.embeddings["mean"]["srr"]] + srr.mean["output"]["srr"], rel=1e-6
    )  # float32 forwards of two loaded copies: the last bits differ
    assert isinstance(attention, Figure) and isinstance(ledger_fig, Figure)
    assert "layer 1" in attention.axes[0].get_title()
    n_first = int(batch["attention_mask"][0].sum())
    assert attention.axes[0].images[0].get_array().shape == (n_first, n_first)  # real tokens of the first text
    # the axes read as text: each token decoded on its own (BPE's "Ġfor" is "for"), never a raw byte-level symbol
    ticks = [t.get_text() for t in attention.axes[0].get_xticklabels()]
    decoded = [tokenizer.decode([i]).strip(" ") or "␣" for i in batch["input_ids"][0, :n_first].tolist()]
    raw = tokenizer.convert_ids_to_tokens(batch["input_ids"][0, :n_first].tolist())  # what the axes showed before
    assert ticks == decoded and not any("Ġ" in t or "Ċ" in t for t in ticks)
    assert sum(t.startswith("Ġ") for t in raw) >= 3 and "f" in ticks and "Ġf" in raw


def test_text_tab_refuses_bad_input(text_dir, tmp_path):
    from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor

    for texts, message in (("   \n ", "at least one line"), ("\n".join(["x y z"] * 17), "at most 16 lines")):
        with pytest.raises(gr.Error) as excinfo:
            TH.text_tab(text_dir, texts)
        assert message in html.unescape(excinfo.value.message)
    with pytest.raises(gr.Error) as excinfo:
        TH.text_tab(text_dir, TEXTS, layer=7)
    assert "block number 1..2" in html.unescape(excinfo.value.message)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10)
    CrateForImageClassification(cfg).save_pretrained(tmp_path / "vision")
    CrateImageProcessor.for_config(cfg).save_pretrained(tmp_path / "vision")
    with pytest.raises(gr.Error) as excinfo:
        TH.text_tab(str(tmp_path / "vision"), TEXTS)
    assert "needs a text model" in html.unescape(excinfo.value.message)


@pytest.mark.slow
def test_default_text_model_is_trained_once_and_cached(tmp_path):
    from transformers import AutoModelForCausalLM

    from hf_tdiag.gradio_app.default_text_model import ensure_default_text_model, is_complete

    small = dict(steps=3, hidden_size=16, layers=1, heads=2, vocab_size=300, block_size=32, batch_size=4)
    folder = ensure_default_text_model(cache=tmp_path, **small)
    assert is_complete(folder) and folder.parent == tmp_path
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_default_text_model(cache=tmp_path, **small) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # not trained again
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.model_type == "crate_text" and model.config.num_hidden_layers == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".") and p.is_dir()] == []  # no work dir left
    with pytest.raises(TypeError, match="unknown setting"):
        ensure_default_text_model(cache=tmp_path, epochs=3)


@pytest.mark.parametrize(
    "text, shown",
    [
        ("\n\no", "` '\\n\\no' `"),  # newlines visible, not a paragraph break
        (" *a* <b>", "` ' *a* <b>' `"),  # no emphasis, no HTML: a code span shows its text as is
        ("x`y", "`` 'x`y' ``"),  # a fence longer than the backticks inside
        ("a``b`", "``` 'a``b`' ```"),
    ],
)
def test_continuation_is_shown_literally(text, shown):
    assert TH.markdown_literal(text) == shown
    assert TH.shown_continuation(text) == shown  # text that is not only whitespace is shown as it is


def test_a_whitespace_only_continuation_says_what_it_is():
    assert TH.shown_continuation("\n\n\n") == "only whitespace: 3 newlines (` '\\n\\n\\n' `)"
    assert TH.shown_continuation(" \n") == "only whitespace: 1 space, 1 newline (` ' \\n' `)"
    assert TH.shown_continuation("").startswith("no text")
