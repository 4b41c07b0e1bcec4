"""``hf-tdiag report`` on decoder LLMs saved sharded with a tokenizer (Llama with 8 Q / 2 KV heads, GPT-2): every
section runs; the numbers equal the public API's and an independent next-token perplexity; concepts use the LM head."""

import json
import math

import pytest
import torch
from decoder_models import TEXTS, build, char_tokenizer, save_sharded
from transformers import AutoModelForCausalLM

import hf_tdiag
from hf_tdiag.cli import main
from hf_tdiag.report import SECTION_ORDER


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


def _folder(tmp_path, family):
    path = save_sharded(build(family), tmp_path / family)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_report_on_a_decoder(tmp_path, texts_file, family):
    path = _folder(tmp_path, family)
    out = tmp_path / "report.html"
    assert main(["report", path, "--texts", str(texts_file), "-o", str(out), "--concepts", "3"]) == 0
    data = json.loads(out.with_suffix(".json").read_text())["sections"]
    # every section runs on a decoder; the objective ledger is for white-box models only and says so
    assert {k: v["status"] for k, v in data.items()} == {
        k: "skipped" if k == "objective_ledger" else "ok" for k in SECTION_ORDER
    }
    assert "white-box" in data["objective_ledger"]["note"] or "CRATE" in data["objective_ledger"]["note"]

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    tok = char_tokenizer()
    summary = data["summary"]["numbers"]
    H_kv = {"llama": 2, "gpt2": 4}[family]
    assert summary["causal"] is True and summary["num_kv_heads"] == H_kv
    # next-token perplexity by hand, one text at a time (no padding)
    nll, count = 0.0, 0
    for text in TEXTS:
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
        nll -= float(logp.gather(1, ids[0, 1:, None]).sum())
        count += ids.shape[1] - 1
    assert summary["next_token_perplexity"] == pytest.approx(math.exp(nll / count), rel=1e-4)

    srr = data["srr"]["numbers"]
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    direct = hf_tdiag.layer_srr(model, dict(batch), progress=False)
    assert srr["summary"]["srr_last_layer"] == pytest.approx(direct.summary()["srr_last_layer"], rel=1e-5)
    assert srr["settings"]["causal"] is True

    concepts = data["concept_fidelity"]["numbers"]
    assert concepts["family"] == ("llama" if family == "llama" else "gpt2") and concepts["modality"] == "text"
    assert "bound_certified" not in concepts and concepts["bound_estimated"] > 0
    assert concepts["head"] == {"fitted": False}  # the LM head, not a fitted one
    assert len(data["concept_fidelity"]["figures"]) == 2
    assert data["attention_svm"]["numbers"]["attention_svm"]["causal"] is True
