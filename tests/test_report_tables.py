"""The report contract's tables: ``to_pandas()`` of the SRR, Schatten and attention-SVM reports (typed columns,
blocks numbered 1..L) checked against the reports' own numbers and against identities of the math; ``from_json``
round trips."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import BertConfig, BertModel, ViTConfig, ViTModel

from hf_tdiag import CrateConfig, CrateForImageClassification, layer_srr, schatten_bounds
from hf_tdiag.diagnostics.attention_svm import attention_svm_diagnostic
from hf_tdiag.diagnostics.report import read_json_text, typed_frame
from hf_tdiag.diagnostics.srr import TERMS, SRRReport


def _crate():
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", variant="crate", num_labels=10, num_hidden_layers=3)
    return CrateForImageClassification(cfg).eval()


def _dtypes(frame):
    return {name: str(dtype) for name, dtype in frame.dtypes.items()}


def test_srr_table_rows_columns_and_the_srr_identity():
    torch.manual_seed(1)
    lam = 0.7
    report = layer_srr(_crate(), torch.rand(5, 1, 8, 8), lam=lam, progress=False)
    frame = report.to_pandas()
    assert _dtypes(frame) == {
        "layer": "Int64",
        "state": "string",
        "num_samples": "Int64",
        **{t: "float64" for t in TERMS},
        **{f"{t}_std": "float64" for t in TERMS},
    }
    # the embeddings Z^0 as layer 0, then every state's blocks 1..L
    assert frame.loc[0, "state"] == "embeddings" and frame.loc[0, "layer"] == 0
    for state in report.states:
        rows = frame[frame.state == state]
        assert rows.layer.tolist() == [1, 2, 3]
        assert rows.srr.tolist() == report.per_layer("srr", state)
        assert rows.Rc_std.tolist() == report.std[state]["Rc"]
    # per sample srr = Rc - R + lam * sparsity, so the means obey it too
    assert np.allclose(frame.srr, frame.Rc - frame.R + lam * frame.sparsity, rtol=0, atol=1e-9)
    assert (frame.num_samples == 5).all()


def test_srr_report_json_round_trip_from_text_and_file(tmp_path):
    torch.manual_seed(2)
    report = layer_srr(_crate(), torch.rand(3, 1, 8, 8), progress=False)
    path = tmp_path / "srr.json"
    text = report.to_json(str(path))
    for source in (text, str(path)):
        back = SRRReport.from_json(source)
        pd.testing.assert_frame_equal(back.to_pandas(), report.to_pandas())
        assert back.summary() == report.summary()


def test_read_json_text_names_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="path_or_text: expected a report's JSON text"):
        read_json_text(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="path_or_text: not valid JSON"):
        read_json_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object, got list"):
        read_json_text(str(tmp_path / "list.json"))


def test_typed_frame_keeps_dtypes_when_empty_or_missing():
    cols = {"layer": "Int64", "head": "Int64", "x": "float64", "name": "string"}
    empty = typed_frame([], cols)
    assert list(empty.columns) == list(cols) and _dtypes(empty) == cols and len(empty) == 0
    frame = typed_frame([{"layer": 1, "head": None, "x": 2.5, "name": "qk"}], cols)
    assert frame.loc[0, "head"] is pd.NA and frame.loc[0, "x"] == 2.5 and _dtypes(frame) == cols


def test_schatten_table_layers_are_one_based_and_sum_to_the_bound():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    report = schatten_bounds(BertModel(cfg).eval())
    frame = report.to_pandas()
    assert str(frame.layer.dtype) == "Int64" and str(frame["head"].dtype) == "Int64"
    assert str(frame.type.dtype) == "string" and str(frame.p_opt.dtype) == "float64"
    assert sorted(set(frame.layer)) == [1, 2]
    assert len(frame) == len(report.matrices)
    # per-head matrices carry their head, FFN matrices none; 2 layers x (2 heads x {qk, v} + m_in + m_out)
    heads = frame[frame.type.isin(["qk", "v"])]
    assert heads["head"].notna().all() and frame[~frame.type.isin(["qk", "v"])]["head"].isna().all()
    assert len(frame) == 2 * (2 * 2 + 2)
    # B = sum over matrices of their minimal contribution + sqrt(L) (the bound is the sum of the per-matrix minima)
    assert math.isclose(frame.min_contribution.sum() + math.sqrt(2), report.schatten_bound, rel_tol=1e-9)
    # rank and norms against numpy on the stored spectra
    for m, (_, row) in zip(report.matrices, frame.iterrows()):
        assert row["rank"] == len(m.singular_values) and (row["rows"], row["cols"]) == m.shape
        assert math.isclose(row.nuclear_norm, float(np.sum(m.singular_values)), rel_tol=1e-9)


def test_attention_svm_table_one_row_per_query():
    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        attn_implementation="eager",
    )
    model = ViTModel(cfg).eval()
    diag = attention_svm_diagnostic(model, torch.randn(2, 3, 32, 32), 2, 1, max_queries=9)
    frame = diag.to_pandas()
    assert _dtypes(frame) == {
        "layer": "Int64",
        "head": "Int64",
        "sequence": "Int64",
        "position": "Int64",
        "selected": "Int64",
        "head_margin": "float64",
        "svm_margin": "float64",
        "max_prob": "float64",
    }
    assert len(frame) == diag.head_margins.numel() == 9
    assert (frame.layer == 2).all() and (frame["head"] == 1).all()
    assert frame.position.tolist() == diag.query_index[:, 1].tolist()
    # W_mm meets its constraints with equality at the support: min_t (x_a - x_t)^T W_mm z = 1, so the normalized
    # margins' minimum over the queries is 1 / ||W_mm|| = the SVM margin
    assert diag.svm.feasible
    assert frame.svm_margin.min() == pytest.approx(diag.svm_margin, rel=1e-4)
    assert frame.max_prob.between(0, 1).all()
    assert frame.head_margin.min() == pytest.approx(float(diag.head_margins.min()))


def _vit():
    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        attn_implementation="eager",
    )
    return ViTModel(cfg).eval()


def test_every_diagnostic_returns_a_report_with_the_whole_contract():
    import hf_tdiag
    from hf_tdiag.diagnostics.report import ReportContract

    torch.manual_seed(3)
    crate, x = _crate(), torch.rand(6, 1, 8, 8)
    reports = [
        hf_tdiag.layer_srr(crate, x, progress=False),
        hf_tdiag.schatten_bounds(crate),
        hf_tdiag.concept_fidelity(crate, x, 2, 3, power_iters=3, progress=False),
        hf_tdiag.attention_svm_diagnostic(_vit(), torch.randn(2, 3, 32, 32), 2, 1, max_queries=5),
    ]
    expected = [
        hf_tdiag.SRRReport,
        hf_tdiag.SchattenReport,
        hf_tdiag.ConceptFidelityReport,
        hf_tdiag.AttentionSVMReport,
    ]
    for report, cls in zip(reports, expected):
        assert type(report) is cls and isinstance(report, ReportContract)
        summary = report.summary()
        assert summary and all(isinstance(v, (int, float, str, bool, dict, list, type(None))) for v in summary.values())
        text = report.to_json()
        back = cls.from_json(text)
        assert back.to_json() == text
        pd.testing.assert_frame_equal(back.to_pandas(), report.to_pandas())
        assert back.summary() == report.summary()
        layers = report.to_pandas()["layer"]
        assert str(layers.dtype) == "Int64" and layers.min() >= 0


def test_concept_report_table_holds_the_report_numbers_and_sweeps_number_layers():
    import hf_tdiag

    torch.manual_seed(4)
    crate, x = _crate(), torch.rand(6, 1, 8, 8)
    one = hf_tdiag.concept_fidelity(crate, x, 1, 3, power_iters=3, progress=False, return_tensors=True)
    assert "tensors" not in one and one.tensors["A_hat"].shape == one.tensors["A"].shape
    row = one.to_pandas().iloc[0]
    assert row["layer"] == 1 and row["n_concepts"] == 3 and row["kl"] == one["kl"]
    assert row["bound_certified"] == one["bound_certified"]
    # the certified bound holds for every input, so its mean is at least the mean KL
    assert row["bound_certified"] >= row["kl"] and one.summary()["frac_kl_below_bound_certified"] == 1.0
    sweep = hf_tdiag.concept_fidelity(crate, x, None, 3, layers=[0, 3], power_iters=3, progress=False, bounds=False)
    frame = sweep.to_pandas()
    assert frame.layer.tolist() == [0, 3] and frame.bound_certified.isna().all()
    assert frame.kl.tolist() == [sweep["per_layer"][ell]["kl"] for ell in (0, 3)]
    assert sweep.summary()["kl_max_over_layers"] == max(frame.kl)
    back = hf_tdiag.ConceptFidelityReport.from_json(sweep.to_json())
    assert sorted(back["per_layer"]) == [0, 3] and back.is_sweep


def test_schatten_json_of_format_1_reads_with_one_based_layers_and_new_names():
    import json

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    report = schatten_bounds(BertModel(cfg).eval())
    old = report.to_dict()
    del old["format_version"]
    old["ours"], old["edelman"] = old.pop("schatten_bound"), old.pop("edelman_bound")
    for m in old["matrices"]:
        m["layer"] -= 1
    back = type(report).from_json(json.dumps(old))
    assert back.schatten_bound == report.schatten_bound and back.edelman_bound == report.edelman_bound
    assert [m.layer for m in back.matrices] == [m.layer for m in report.matrices]
    assert not hasattr(report, "ours") and not hasattr(report, "edelman")  # one name per number: no aliases
    with pytest.raises(ValueError, match="format_version"):
        type(report).from_dict(dict(report.to_dict(), format_version=99))


def test_attention_svm_report_round_trip_keeps_the_matrices_when_asked():
    from hf_tdiag import AttentionSVMReport

    diag = attention_svm_diagnostic(_vit(), torch.randn(2, 3, 32, 32), 1, 0, max_queries=4)
    back = AttentionSVMReport.from_json(diag.to_json(include_matrices=True))
    assert torch.equal(back.W_head, diag.W_head.double()) and torch.allclose(back.svm.W, diag.svm.W.double())
    assert back.svm.num_active == diag.svm.num_active and back.svm.query_margins().tolist() == pytest.approx(
        diag.svm.query_margins().tolist()
    )
    assert AttentionSVMReport.from_json(diag.to_json()).W_head is None
