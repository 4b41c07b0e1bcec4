"""The report's ledger section: its numbers and table are the ObjectiveLedgerReport's on the same inputs (a tiny
CRATE-α and a tiny ToST), its per-step values are the objectives recomputed here, and a model without white-box
blocks gets the section skipped with the reason."""

from __future__ import annotations

import pytest
import torch
from transformers import ViTConfig, ViTForImageClassification

import hf_tdiag
from hf_tdiag.measures.coding_rate import compression_rate
from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification
from hf_tdiag.models.tost import TostConfig, TostForImageClassification
from hf_tdiag.report import ReportInputs, build_report

TINY = dict(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)


def _pixels(n=5):
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def _section(model, x):
    report = build_report(model, ReportInputs(x, description="noise"), sections=["objective_ledger"], progress=False)
    return report.section("objective_ledger")


@pytest.mark.parametrize("family", ["crate-alpha", "tost"])
def test_ledger_section_numbers_are_the_ledger_report(family):
    torch.manual_seed(0)
    if family == "crate-alpha":
        model = CrateAlphaForImageClassification(CrateAlphaConfig(**TINY, num_labels=3))
    else:
        model = TostForImageClassification(TostConfig(**TINY, num_class_attention_layers=1, num_labels=3))
    x = _pixels()
    section = _section(model, x)
    assert section.status == "ok", section.note
    expected = hf_tdiag.objective_ledger(model.eval(), x).to_dict()
    got = section.numbers["objective_ledger"]
    assert [(s["layer"], s["step"]) for s in got["steps"]] == [(s["layer"], s["step"]) for s in expected["steps"]]
    for g, e in zip(got["steps"], expected["steps"]):
        assert g["before"] == pytest.approx(e["before"], rel=1e-6) and g["after"] == pytest.approx(e["after"], rel=1e-6)
        assert g["increased"] == e["increased"]
    table = section.tables[1]
    assert [row[:2] for row in table.rows] == [[s["layer"], s["step"]] for s in expected["steps"]]
    assert [row[3] for row in table.rows] == pytest.approx([s["before"] for s in expected["steps"]], rel=1e-6)
    assert section.tables[0].rows[1][1] == sum(s["increased"] for s in expected["steps"])
    assert section.figures, "the ledger figure is drawn"


def test_ledger_section_mssa_values_are_the_coding_rates_of_the_states():
    torch.manual_seed(1)
    model = CrateAlphaForImageClassification(CrateAlphaConfig(**TINY, num_labels=3)).eval()
    x = _pixels(4)
    section = _section(model, x)
    with torch.no_grad():
        out = model(pixel_values=x, output_hidden_states=True, output_mid_hidden_states=True)
    rows = {(r[0], r[1]): r for r in section.tables[1].rows}
    for ell in (1, 2):
        U = model.crate_alpha.encoder.layer[ell - 1].attention.subspaces()
        with torch.no_grad():
            before = float(compression_rate(out.hidden_states[ell - 1], U, 0.1).mean())
            after = float(compression_rate(out.mid_hidden_states[ell - 1], U, 0.1).mean())
        assert rows[(ell, "mssa")][3] == pytest.approx(before, rel=1e-5)
        assert rows[(ell, "mssa")][4] == pytest.approx(after, rel=1e-5)


def test_ledger_section_is_skipped_for_a_model_without_white_box_blocks():
    torch.manual_seed(0)
    vit = ViTForImageClassification(ViTConfig(**TINY, intermediate_size=32, num_labels=3))
    section = _section(vit, _pixels(2))
    assert section.status == "skipped" and "no white-box blocks" in section.note
