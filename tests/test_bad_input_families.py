"""Bad inputs of issue 29 by family, each a clear one-line error naming the input (and the limit, where there is one)
before any work, or handled correctly (checked against an independent computation):

* sequence length beyond the model's positions (BERT, RoBERTa's offset, GPT-2): CLI, evaluate module, direct API;
* NaN/inf in a weight: named by its parameter name, from the CLI, the evaluate module and the direct API;
* absurd sizes that would end in an allocation failure: refused with the bytes needed before allocating;
* text inputs: one string instead of a list, non-strings, empty texts, a texts file that is missing, binary,
  empty or a folder.

The Space handlers' family is in tests/test_space_bad_inputs.py."""

from __future__ import annotations

import evaluate
import pytest
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertTokenizerFast,
    GPT2Config,
    GPT2LMHeadModel,
    RobertaConfig,
    RobertaModel,
)

import hf_tdiag
from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor, layer_srr
from hf_tdiag._model_limits import check_allocation, position_limit
from hf_tdiag.cli import main as cli_main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a cat dog sat on mat ran fast red".split()]
LONG = " ".join(["the cat sat on the mat"] * 4)  # 24 words: 26 tokens with [CLS] and [SEP]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A BERT with 16 positions and its tokenizer."""
    folder = tmp_path_factory.mktemp("bert16")
    (folder / "vocab.txt").write_text("\n".join(WORDS))
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(WORDS),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=16,
        num_labels=2,
    )
    BertForSequenceClassification(cfg).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def srr_module():
    return evaluate.load(hf_tdiag.metric_path("srr"))


def _cli(argv, capsys):
    try:
        code = cli_main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip().splitlines()[-1] if err.strip() else ""


# ----------------------------------------------------------------------------------------- sequence length


def _runs(model, n):
    try:
        with torch.no_grad():
            model(input_ids=torch.full((1, n), 5))
        return True
    except (IndexError, RuntimeError, ValueError):
        return False


@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2"])
def test_the_position_limit_is_where_the_models_own_forward_stops(family):
    """The limit read from the position table against the model itself: it runs on ``limit`` tokens, not one more
    (RoBERTa's positions start after its padding index, so 18 entries hold 16 tokens)."""
    common = dict(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    if family == "bert":
        model, want = BertForSequenceClassification(BertConfig(max_position_embeddings=12, **common)), 12
    elif family == "roberta":
        model, want = RobertaModel(RobertaConfig(max_position_embeddings=18, pad_token_id=1, **common)), 16
    else:
        model, want = GPT2LMHeadModel(GPT2Config(vocab_size=20, n_embd=8, n_layer=1, n_head=2, n_positions=10)), 10
    limit, table = position_limit(model.eval())
    assert limit == want and table.endswith(("position_embeddings", "wpe"))
    assert _runs(model, limit) and not _runs(model, limit + 1)


def test_cli_texts_beyond_the_positions_are_refused_before_measuring(bert_dir, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text(f"the cat\n{LONG}\n")
    code, err = _cli(["srr", bert_dir, "--texts", texts, "--output-dir", tmp_path / "out"], capsys)
    assert code == 1
    assert f"--texts '{texts}': text 2 ('the cat sat on the mat the ...'): 26 tokens" in err, err
    assert "reads at most 16 token positions (embeddings.position_embeddings); pass --max-length 16" in err
    assert not (tmp_path / "out" / "srr.json").exists()


@pytest.mark.slow  # measures and draws the figure (~2 s)
def test_cli_the_flag_the_message_names_makes_it_work(bert_dir, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text(f"the cat\n{LONG}\n")
    code, _ = _cli(["srr", bert_dir, "--texts", texts, "--max-length", "16", "--output-dir", tmp_path / "out"], capsys)
    assert code == 0


def test_attention_svm_texts_beyond_the_positions_are_refused(bert_dir, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text(f"{LONG}\n")
    argv = ["attention-svm", bert_dir, "--texts", texts, "--layer", "1", "--output-dir", tmp_path / "o"]
    code, err = _cli(argv, capsys)
    assert code == 1 and "26 tokens" in err and "reads at most 16 token positions" in err, err
    model = BertForSequenceClassification.from_pretrained(bert_dir).eval()
    with pytest.raises(ValueError, match="inputs: input_ids: 26 tokens, but .* at most 16"):
        hf_tdiag.attention_svm_diagnostic(model, {"input_ids": torch.full((1, 26), 5)}, 1, 0, progress=False)


def test_report_texts_beyond_the_positions_are_refused(bert_dir, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text(f"{LONG}\n")
    code, err = _cli(["report", bert_dir, "--texts", texts, "-o", tmp_path / "r.html"], capsys)
    assert code == 1 and "reads at most 16 token positions" in err and "cut its lines to at most 16 tokens" in err


def test_evaluate_module_texts_beyond_the_positions(bert_dir, srr_module):
    with pytest.raises(ValueError, match=r"texts: text 1 .*26 tokens, but .* at most 16 .*pass max_length=16"):
        srr_module.compute(model=str(bert_dir), texts=[LONG], progress=False)


def test_direct_api_input_ids_beyond_the_positions(bert_dir):
    model = BertForSequenceClassification.from_pretrained(bert_dir).eval()
    batch = {"input_ids": torch.full((2, 20), 5), "attention_mask": torch.ones(2, 20, dtype=torch.long)}
    with pytest.raises(ValueError, match="inputs: input_ids: 20 tokens, but .* at most 16 token positions"):
        layer_srr(model, batch, progress=False)
    batch = {k: v[:, :16] for k, v in batch.items()}  # at the limit: measured
    assert layer_srr(model, batch, progress=False).num_samples == 2


def test_concept_texts_beyond_the_positions(bert_dir):
    model = BertForSequenceClassification.from_pretrained(bert_dir).eval()
    tok = BertTokenizerFast.from_pretrained(bert_dir)
    with pytest.raises(ValueError, match=r"texts \(every text cut .*\): 26 tokens, .*max_tokens \(--max-tokens\)"):
        hf_tdiag.concept_fidelity(model, [LONG, LONG], 1, 2, tokenizer=tok, progress=False)


# ----------------------------------------------------------------------------------------- NaN / inf weights


@pytest.fixture(scope="module")
def nan_crate(tmp_path_factory):
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2)
    model = CrateForImageClassification(cfg).eval()
    with torch.no_grad():
        model.crate.encoder.layer[1].ista.weight[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    folder = tmp_path_factory.mktemp("nan_crate")
    model.save_pretrained(folder)
    CrateImageProcessor.for_config(cfg).save_pretrained(folder)
    return folder, model


NAN_NAME = "weight 'crate.encoder.layer.1.ista.weight'"


def test_nan_weight_is_named_by_the_cli(nan_crate, tmp_path, capsys):
    for argv in (
        ["srr", nan_crate[0], "--dataset", "digits", "--max-samples", "4", "--output-dir", tmp_path / "srr"],
        ["concept-fidelity", nan_crate[0], "--dataset", "digits", "--max-samples", "4", "--output-dir", tmp_path / "c"],
    ):
        code, err = _cli(argv, capsys)
        assert code == 1 and NAN_NAME in err and "3 NaN/inf entries" in err and str(nan_crate[0]) in err, err


def test_nan_weight_is_named_by_the_api_and_the_evaluate_module(nan_crate, srr_module):
    folder, model = nan_crate
    pixels = torch.zeros(2, 1, 8, 8)
    with pytest.raises(ValueError, match=NAN_NAME.replace(".", r"\.")):
        layer_srr(model, pixels, progress=False)
    with pytest.raises(ValueError, match=NAN_NAME.replace(".", r"\.")):
        hf_tdiag.concept_fidelity(model, pixels, 1, 2, progress=False)
    with pytest.raises(ValueError, match=NAN_NAME.replace(".", r"\.")):
        srr_module.compute(model=str(folder), pixel_values=pixels, progress=False)


def test_finite_weights_whose_sum_overflows_pass_and_an_inf_buffer_is_named():
    from hf_tdiag._model_limits import check_finite_weights

    module = torch.nn.Linear(4, 4)
    with torch.no_grad():
        module.weight.fill_(3e38)  # finite, but their float32 sum is inf: the exact check must clear them
    check_finite_weights(module)
    module.register_buffer("scale", torch.tensor([1.0, float("inf")]))
    with pytest.raises(ValueError, match="model: buffer 'scale' of 'Linear' has 1 NaN/inf entries of 2"):
        check_finite_weights(module)


# ----------------------------------------------------------------------------------------- absurd sizes


def test_a_batch_whose_states_cannot_fit_is_refused_before_it_runs(nan_crate):
    """10⁸ digits images as one batch (a broadcast view: no memory behind it) would need terabytes of token states."""
    torch.manual_seed(0)
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
    huge = torch.zeros(1, 1, 8, 8).expand(10**8, 1, 8, 8)
    with pytest.raises(
        ValueError, match=r"inputs: a batch of 100,000,000 inputs of \d+ tokens would need [\d.]+ TiB, more "
    ):
        layer_srr(model, huge, batch_size=10**8, progress=False)


def test_training_a_model_that_cannot_fit_is_refused_before_building_it(tmp_path, capsys):
    out = tmp_path / "run"
    code, err = _cli(
        [
            "train",
            "--output-dir",
            out,
            "--hidden-size",
            "1000000",
            "--num-attention-heads",
            "1",
            "--max-train-samples",
            "8",
        ],
        capsys,
    )
    assert code == 1 and "training this model (" in err and "parameters" in err and "--hidden-size" in err, err
    assert "TiB, more than the" in err
    assert not any(out.glob("*.safetensors"))


def test_an_allocation_beyond_the_memory_is_refused_with_the_bytes():
    with pytest.raises(ValueError, match=r"the codes would need 7\.3 TiB, more than the .* available; pass fewer"):
        check_allocation(10**12, 8, "the codes", "pass fewer")
    check_allocation(10, 8, "ten floats", "never")  # what fits passes


# ----------------------------------------------------------------------------------------- text inputs

TEXT_CASES = [
    # (id, texts, error type, message)
    ("one string", "the cat sat", TypeError, "texts: expected a list of strings, got one string; pass texts=[...]"),
    ("an int", ["the cat", 3], TypeError, "texts[1]: expected a string, got int"),
    ("None", [None], TypeError, "texts[0]: expected a string, got NoneType"),
    ("empty text", ["the cat", ""], ValueError, "texts[1]: the text is empty"),
    ("blank text", ["  \t"], ValueError, "texts[0]: the text is empty"),
    ("bytes", [b"the cat"], TypeError, "texts[0]: expected a string, got bytes"),
]


@pytest.mark.parametrize("texts, error, message", [c[1:] for c in TEXT_CASES], ids=[c[0] for c in TEXT_CASES])
def test_evaluate_module_text_inputs(bert_dir, srr_module, texts, error, message):
    with pytest.raises(error) as err:
        srr_module.compute(model=str(bert_dir), texts=texts, progress=False)
    assert message in str(err.value)


@pytest.mark.parametrize("texts, error, message", [c[1:] for c in TEXT_CASES[1:]], ids=[c[0] for c in TEXT_CASES[1:]])
def test_concept_text_inputs(bert_dir, texts, error, message):
    model = BertForSequenceClassification.from_pretrained(bert_dir).eval()
    tok = BertTokenizerFast.from_pretrained(bert_dir)
    with pytest.raises(error) as err:
        hf_tdiag.concept_fidelity(model, texts, 1, 2, tokenizer=tok, progress=False)
    assert message in str(err.value)


@pytest.mark.slow  # a fresh evaluate module (~1 s)
def test_a_stored_empty_text_is_refused_at_compute(bert_dir):
    module = evaluate.load(hf_tdiag.metric_path("srr"))
    module.add(text="")
    with pytest.raises(ValueError, match=r"texts\[0\]: the text is empty"):
        module.compute(model=str(bert_dir), progress=False)


TEXT_FILE_CASES = [
    # (id, how the file is made, message)
    ("missing", None, "texts: '{path}' does not exist; expected a text file with one input per line"),
    ("binary", bytes(range(256)), "texts: '{path}' is not UTF-8 text"),
    ("empty", b"", "texts: '{path}' has no non-empty lines"),
    ("blank lines", b"  \n\t\n\n", "texts: '{path}' has no non-empty lines"),
    ("a folder", "dir", "texts: '{path}' is a folder; expected a text file with one input per line"),
]


@pytest.mark.parametrize("command", ["srr", "attention-svm", "report", "concept-fidelity"])
@pytest.mark.parametrize("content, message", [c[1:] for c in TEXT_FILE_CASES], ids=[c[0] for c in TEXT_FILE_CASES])
def test_cli_texts_files(bert_dir, tmp_path, capsys, command, content, message):
    path = tmp_path / "texts.txt"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    argv = [command, bert_dir, "--texts", path]
    argv += ["-o", tmp_path / "r.html"] if command == "report" else ["--output-dir", tmp_path / "out"]
    if command == "attention-svm":
        argv += ["--layer", "1"]
    code, err = _cli(argv, capsys)
    assert code == 1 and message.format(path=path) in err, err
