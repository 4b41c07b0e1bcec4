"""SchattenReport.matrix_rows: the one per-matrix table the report page and the Space both show."""

import torch

import hf_tdiag
from hf_tdiag import CrateConfig, CrateForImageClassification
from hf_tdiag.gradio_app.handlers import BOUNDS_COLUMNS


def test_rows_follow_the_matrices_and_mark_whole_layer_matrices():
    torch.manual_seed(0)
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_hidden_layers=1))
    report = hf_tdiag.schatten_bounds(model, progress=False)
    rows = report.matrix_rows(no_head="—")
    assert len(rows) == len(report.matrices) and all(len(r) == len(BOUNDS_COLUMNS) for r in rows)
    for row, m in zip(rows, report.matrices):
        assert row[:4] == [m.layer, "—" if m.head is None else m.head, m.type, m.rank]
        assert row[4] == m.spectral_norm and row[7] == m.min_contribution
    ista = next(m for m in report.matrices if m.type == "ista")  # the block's dictionary: one per layer, no head
    weight = model.crate.encoder.layer[0].ista.weight.detach().double()
    assert abs(ista.spectral_norm - float(torch.linalg.matrix_norm(weight, 2))) <= 1e-6 * ista.spectral_norm
    assert any(r[1] == "—" for r in rows) and any(isinstance(r[1], int) for r in rows)
    assert [r[1] for r in report.matrix_rows()] == ["" if m.head is None else m.head for m in report.matrices]
