"""The text CRATE page's results table quotes benchmarks/results/crate_lm_pydoc.json (the three recipe runs): every
row's parameters, perplexities and accuracies are that file's, at the digits the page prints."""

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS = {"CRATE-CLM": "crate-clm", "GPT-2": "gpt2", "CRATE-MLM": "crate-mlm", "BERT": "bert"}


def test_results_table_is_the_recorded_runs():
    summary = json.loads((REPO / "benchmarks/results/crate_lm_pydoc.json").read_text(encoding="utf-8"))["summary"]
    page = (REPO / "docs/guide/text_crate.md").read_text(encoding="utf-8")
    seen = set()
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        label = cells[0].split(" ")[0].rstrip(",") if cells else ""
        if label not in ROWS or len(cells) != 5 or not re.fullmatch(r"[\d,]+", cells[1]):
            continue
        s = summary[ROWS[label]]
        assert int(cells[1].replace(",", "")) == s["parameters"], line
        assert cells[2] == f"{s['val_perplexity_before_mean']:.1f}", line
        ppl = f"{s['val_perplexity_after_mean']:.1f} ({s['val_perplexity_after_min']:.1f}–{s['val_perplexity_after_max']:.1f})"
        acc = f"{s['val_accuracy_mean']:.3f} ({s['val_accuracy_min']:.3f}–{s['val_accuracy_max']:.3f})"
        assert (cells[3], cells[4]) == (ppl, acc), line
        seen.add(label)
    assert seen == set(ROWS)
