"""``hf-tdiag report`` on a causal text CRATE with ``--texts``: every section runs or says why not; the summary's
perplexity, the SRR and the ledger against direct computations on the same tokenized texts; concept fidelity refused
with its reason."""

import json
import math

import pytest
import torch

from hf_tdiag.cli import main as cli_main
from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM

pytestmark = pytest.mark.slow

LINES = ["The for statement iterates over a sequence.", "A def statement creates a function object.",
         "Exceptions are raised when an error is detected."]  # fmt: skip


@pytest.fixture(scope="module")
def clm_dir(tmp_path_factory):
    from pydoc_data.topics import topics

    from hf_tdiag.text_corpus import train_tokenizer

    tokenizer = train_tokenizer([topics["for"], topics["function"], topics["exceptions"]], 300)
    config = CrateTextConfig.from_preset(
        "crate-lm-12l", vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("report_clm")
    CrateTextForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_report_on_a_text_crate(clm_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_tdiag

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(LINES) + "\n")
    out = tmp_path / "report"
    assert cli_main(["report", str(clm_dir), "--texts", str(texts), "--output-dir", str(out)]) == 0
    data = json.loads((out / "report.json").read_text())
    sections = data["sections"]
    assert {k: s["status"] for k, s in sections.items()} == {
        "summary": "ok", "srr": "ok", "schatten": "ok", "concept_fidelity": "skipped", "attention_svm": "ok", "objective_ledger": "ok"
    }  # fmt: skip
    assert "does not cover text CRATE models" in sections["concept_fidelity"]["note"]
    model = AutoModelForCausalLM.from_pretrained(clm_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(clm_dir)
    batch = tokenizer(LINES, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    nll, count = 0.0, 0
    for b in range(len(LINES)):
        n = int(batch["attention_mask"][b].sum())
        nll += float(torch.nn.functional.cross_entropy(logits[b, : n - 1], batch["input_ids"][b, 1:n], reduction="sum"))
        count += n - 1
    numbers = sections["summary"]["numbers"]
    assert numbers["next_token_perplexity"] == pytest.approx(math.exp(nll / count), rel=1e-5)
    assert numbers["causal"] is True and numbers["num_kv_heads"] == 2
    ledger = hf_tdiag.objective_ledger(model, dict(batch))
    steps = sections["objective_ledger"]["numbers"]["objective_ledger"]["steps"]
    assert [(s["layer"], s["step"]) for s in steps] == [(s.layer, s.step) for s in ledger.steps]
    assert [s["before"] for s in steps] == pytest.approx([s.before for s in ledger.steps], rel=1e-5)
    srr = hf_tdiag.layer_srr(model, dict(batch), progress=False)
    assert sections["srr"]["numbers"]["mean"]["output"]["srr"] == pytest.approx(srr.mean["output"]["srr"], rel=1e-5)
    with pytest.raises(ValueError, match="does not cover text CRATE models"):
        hf_tdiag.concept_fidelity(model, LINES, 1, 2, tokenizer=tokenizer)
