"""Figures plot the numbers they are given: each figure's artists (line data, bar heights, image arrays) against the
data computed independently in the test (numpy SVD of the weights, means and spreads written out, hand tables)."""

import re

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel

from hf_tdiag.viz import schatten as VS
from hf_tdiag.viz import srr as VR
from hf_tdiag.viz.attention_maps import (
    attention_heads_figure,
    attention_layers_figure,
    first_token_attention_figure,
    token_attention_figure,
)
from hf_tdiag.viz.images import predictions_figure


# ---------------------------------------------------------------------------------------------- viz/srr.py
def test_mssa_step_figure_plots_mean_and_spread_of_the_change_in_rc():
    rc_crate = [[5.0, 4.0, 2.5], [7.0, 6.0, 6.5]]  # two seeds, three step sizes
    rc_n = [[1.0, 1.5, 3.0], [2.0, 2.0, 2.0]]
    result = {
        "step_sizes": [0.0, 0.5, 1.0],
        "variants": ["crate", "crate-n"],
        "Rc": {"crate": rc_crate, "crate-n": rc_n},
        "settings": {"num_tokens": 8, "hidden_size": 4, "num_heads": 2, "seeds": [0, 1]},
    }
    fig = VR.plot_mssa_step(result)
    ax = fig.axes[0]
    curves = [line for line in ax.lines if line.get_label() in ("CRATE (learned W)", "CRATE-N (−U)")]
    assert [c.get_label() for c in curves] == ["CRATE (learned W)", "CRATE-N (−U)"]
    # by hand: Rc − Rc(κ=0) per seed, then mean and population std over the seeds
    np.testing.assert_allclose(curves[0].get_xdata(), [0.0, 0.5, 1.0])
    np.testing.assert_allclose(curves[0].get_ydata(), [0.0, -1.0, -1.5])  # seeds: (0, -1, -2.5), (0, -1, -0.5)
    np.testing.assert_allclose(curves[1].get_ydata(), [0.0, 0.25, 1.0])  # seeds: (0, .5, 2), (0, 0, 0)
    bands = [c for c in ax.collections if len(c.get_paths())]
    assert len(bands) == 2
    vertices = bands[0].get_paths()[0].vertices
    at_one = vertices[np.isclose(vertices[:, 0], 1.0), 1]  # the band at κ = 1: mean ± std of (-2.5, -0.5)
    assert at_one.max() == pytest.approx(-1.5 + 1.0) and at_one.min() == pytest.approx(-1.5 - 1.0)
    at_half = bands[1].get_paths()[0].vertices
    at_half = at_half[np.isclose(at_half[:, 0], 0.5), 1]  # CRATE-N at κ = 0.5: (0.5, 0) -> 0.25 ± 0.25
    assert at_half.max() == pytest.approx(0.5) and at_half.min() == pytest.approx(0.0)
    assert "N=8, d=4, K=2, 2 seeds" in ax.get_title()


def test_srr_history_figure_one_line_per_record_with_embeddings_at_zero():
    records = [
        {"step": 0, "embeddings": {"Rc": 9.0, "srr": 1.0}, "output": {"Rc": [8.0, 7.0], "srr": [0.5, 0.25]}},
        {"step": 10, "output": {"Rc": [6.0, 5.0], "srr": [0.2, 0.1]}},
    ]
    fig = VR.plot_srr_history({"history": records}, terms=("Rc", "srr"))
    rc_ax, srr_ax = fig.axes[:2]
    assert [list(line.get_xdata()) for line in rc_ax.lines] == [[0, 1, 2], [1, 2]]
    assert [list(line.get_ydata()) for line in rc_ax.lines] == [[9.0, 8.0, 7.0], [6.0, 5.0]]
    assert [list(line.get_ydata()) for line in srr_ax.lines] == [[1.0, 0.5, 0.25], [0.2, 0.1]]
    # colour by step: the first record at the colormap's start, the last at its end
    from matplotlib import colormaps

    np.testing.assert_allclose(rc_ax.lines[0].get_color(), colormaps["viridis"](0.0))
    np.testing.assert_allclose(rc_ax.lines[1].get_color(), colormaps["viridis"](1.0))
    with pytest.raises(ValueError, match="data: the SRR history has no records"):
        VR.plot_srr_history({"history": []})


def test_probe_vs_srr_figure_plots_both_columns_on_their_axes():
    result = {"layers": [0, 1, 2], "probe_accuracy": [0.5, 0.75, 0.9], "srr": [3.0, 2.0, 2.5]}
    fig = VR.plot_probe_vs_srr(result)
    left, right = fig.axes[:2]
    assert list(left.lines[0].get_xdata()) == [0, 1, 2] and list(left.lines[0].get_ydata()) == [0.5, 0.75, 0.9]
    assert list(right.lines[0].get_ydata()) == [3.0, 2.0, 2.5]


def test_layer_srr_table_prints_the_reports_means():
    from hf_tdiag import CrateConfig, CrateForImageClassification, layer_srr

    torch.manual_seed(0)
    model = CrateForImageClassification(
        CrateConfig.from_preset(
            "crate-digits", hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_labels=3
        )
    ).eval()
    report = layer_srr(model, torch.randn(6, 1, 8, 8), progress=False)
    text = VR.layer_srr_table(report)
    rows = re.findall(
        r"^\s+(embeddings|layer\s+\d+)\s*: SRR\s+(\S+)\s+R\s+(\S+)\s+Rc\s+(\S+)\s+sparsity\s+(\S+)$", text, re.M
    )
    assert text.splitlines()[0] == "per-layer SRR (output, mean over 6 samples):"
    assert [r[0] for r in rows] == ["embeddings", "layer  1", "layer  2"]
    e = report.embeddings["mean"]
    expected = [[e["srr"], e["R"], e["Rc"], e["sparsity"]]] + [
        [report.mean["output"][k][i] for k in ("srr", "R", "Rc", "sparsity")] for i in range(2)
    ]
    np.testing.assert_allclose([[float(v) for v in r[1:]] for r in rows], expected, atol=5e-5)
    # the SRR column is Rc − R + λ·sparsity of the same row (λ = 1)
    for r in rows:
        srr, R, Rc, sp = (float(v) for v in r[1:])
        assert srr == pytest.approx(Rc - R + sp, abs=2e-4)
    mid = VR.layer_srr_table(report, state="mid")
    assert "embeddings" not in mid and mid.count("layer") == 3


# ---------------------------------------------------------------------------------------------- viz/schatten.py
@pytest.fixture(scope="module")
def bert_report():
    from hf_tdiag.diagnostics.schatten import schatten_bounds

    torch.manual_seed(0)
    model = BertModel(
        BertConfig(
            vocab_size=30,
            max_position_embeddings=8,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=24,
        )
    ).eval()
    return model, schatten_bounds(model, p_grid_m=4)


def _numpy_spectrum(weight: torch.Tensor) -> np.ndarray:
    s = np.linalg.svd(weight.detach().double().numpy(), compute_uv=False)
    return s[s > s[0] * 1e-10]


def test_spectral_decay_figure_is_each_matrix_spectrum_over_its_largest(bert_report):
    model, report = bert_report
    fig = VS.plot_spectral_decay(report)
    types = [t for t in VS.TYPE_LABELS if any(m.type == t for m in report.matrices)]
    assert [ax.get_title() for ax in fig.axes[: len(types)]] == [VS.TYPE_LABELS[t] for t in types]
    for ax, t in zip(fig.axes, types):
        recs = [m for m in report.matrices if m.type == t and m.rank > 0]
        assert len(ax.lines) == len(recs)
        for line, m in zip(ax.lines, recs):
            np.testing.assert_array_equal(line.get_xdata(), np.arange(1, len(m.singular_values) + 1))
            np.testing.assert_allclose(line.get_ydata(), m.singular_values / m.singular_values[0])
    # M_in of layer l is BERT's intermediate dense weight: its spectrum from numpy, independently
    m_in_ax = fig.axes[types.index("m_in")]
    for layer, line in enumerate(m_in_ax.lines):
        s = _numpy_spectrum(model.encoder.layer[layer].intermediate.dense.weight)
        np.testing.assert_allclose(line.get_ydata(), s / s[0], rtol=1e-6)


def test_spectra_init_vs_trained_draws_the_first_report_grey_then_the_second_coloured(bert_report):
    _, report = bert_report
    fig = VS.plot_spectra_init_vs_trained(report, report)
    v_ax = fig.axes[[t for t in VS.TYPE_LABELS if any(m.type == t for m in report.matrices)].index("v")]
    recs = [m for m in report.matrices if m.type == "v" and m.rank > 0]
    assert len(v_ax.lines) == 2 * len(recs)
    grey = v_ax.lines[: len(recs)]
    assert all(line.get_color() == "0.6" for line in grey)
    for line, m in zip(v_ax.lines[len(recs) :], recs):
        assert line.get_color() != "0.6"
        np.testing.assert_allclose(line.get_ydata(), m.singular_values / m.singular_values[0])


def test_optimal_p_figure_dots_are_the_records_and_lines_their_layer_means():
    class Rec:
        def __init__(self, layer, type_, p):
            self.layer, self.type, self.p_opt, self.rank = layer, type_, p, 1

    class Rep:
        num_layers = 2
        model, model_type, hidden_size, num_heads = "hand", "bert", 8, 2
        matrices = [
            Rec(1, "qk", 0.5),
            Rec(1, "qk", 1.5),
            Rec(2, "qk", 2.0),
            Rec(2, "qk", 0.0),
            Rec(1, "v", 0.25),
            Rec(2, "v", 0.75),
        ]

    fig = VS.plot_optimal_p(Rep())
    ax = fig.axes[0]
    qk_dots, v_dots = ax.collections[:2]
    # two types: offsets −0.04 and +0.04 around each layer
    np.testing.assert_allclose(qk_dots.get_offsets(), [[0.96, 0.5], [0.96, 1.5], [1.96, 2.0], [1.96, 0.0]])
    np.testing.assert_allclose(v_dots.get_offsets(), [[1.04, 0.25], [2.04, 0.75]])
    qk_line, v_line = ax.lines[:2]
    np.testing.assert_allclose(qk_line.get_ydata(), [1.0, 1.0])
    np.testing.assert_allclose(v_line.get_ydata(), [0.25, 0.75])
    np.testing.assert_allclose(v_line.get_xdata(), [1.04, 2.04])


def test_contribution_figure_is_the_mean_over_heads_with_its_minimum_marked(bert_report):
    _, report = bert_report
    fig = VS.plot_contribution_vs_p(report)
    types = [t for t in VS.TYPE_LABELS if any(m.type == t for m in report.matrices)]
    qk_ax = fig.axes[types.index("qk")]
    grid = np.asarray(report.p_grid)
    np.testing.assert_allclose(grid, np.arange(0, 9) / 4)
    for layer in range(2):
        heads = [m.contributions for m in report.matrices if m.type == "qk" and m.layer == layer + 1]
        assert len(heads) == 2
        mean = (heads[0] + heads[1]) / 2
        curve, marker = qk_ax.lines[2 * layer], qk_ax.lines[2 * layer + 1]
        np.testing.assert_allclose(curve.get_xdata(), grid)
        np.testing.assert_allclose(curve.get_ydata(), mean)
        k = int(np.argmin(mean))
        np.testing.assert_allclose([marker.get_xdata()[0], marker.get_ydata()[0]], [grid[k], mean[k]])


def test_save_report_figures_writes_the_four_figures(bert_report, tmp_path):
    _, report = bert_report
    paths = VS.save_report_figures(report, str(tmp_path / "figs"), prefix="m_")
    assert list(paths) == ["spectral_decay", "optimal_p", "optimal_p_histogram", "contribution_vs_p"]
    for name, path in paths.items():
        assert path == str(tmp_path / "figs" / f"m_{name}.png")
        with open(path, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------- viz/attention_maps.py, viz/images.py
def _attentions(L=2, K=3, n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(L, K, n, n, generator=g), dim=-1)


def _overlays(fig):
    """The attention map drawn over each panel (the second image of every panel)."""
    return [ax.images[1].get_array() for ax in fig.axes if len(ax.images) == 2]


def test_attention_heads_figure_overlays_each_heads_cls_row_on_the_patch_grid():
    att = _attentions()
    image = np.arange(16.0).reshape(4, 4)
    fig = attention_heads_figure(image, att, grid=(2, 2), layer=2)  # block 2 = att[1]
    maps = _overlays(fig)
    assert len(maps) == 3
    for k in range(3):
        np.testing.assert_allclose(maps[k], att[1, k, 0, 1:].double().numpy().reshape(2, 2))
    base = fig.axes[0].images[0].get_array()
    np.testing.assert_allclose(base, image / 15.0)  # the image rescaled to [0, 1]
    assert [ax.get_title() for ax in fig.axes[:3]] == ["head 0", "head 1", "head 2"]
    assert "layer 2" in fig._suptitle.get_text()
    for bad in (0, 3):
        with pytest.raises(ValueError, match=f"layer: expected a block number 1..2, got {bad}"):
            attention_heads_figure(image, att, grid=(2, 2), layer=bad)


def test_attention_layers_figure_is_the_mean_over_heads_per_layer():
    att = _attentions(L=3, K=2, n=7)  # CLS + 2 register tokens + 2x2 patches: the patches are the last 4 tokens
    fig = attention_layers_figure(np.ones((4, 4)), att, grid=(2, 2))
    maps = _overlays(fig)
    assert len(maps) == 3
    for layer in range(3):
        by_hand = (att[layer, 0, 0, 3:] + att[layer, 1, 0, 3:]).double().numpy() / 2
        np.testing.assert_allclose(maps[layer], by_hand.reshape(2, 2))
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["layer 1", "layer 2", "layer 3"]


def test_token_attention_figures_show_the_head_mean_matrix_and_first_rows():
    att = _attentions(L=2, K=2, n=4)
    tokens = ["[CLS]", "a", "b", "[SEP]"]
    fig = token_attention_figure(tokens, att, layer=2)  # block 2 = att[1]
    np.testing.assert_allclose(fig.axes[0].images[0].get_array(), ((att[1, 0] + att[1, 1]) / 2).double().numpy())
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == tokens
    fig = first_token_attention_figure(tokens, att)
    rows = fig.axes[0].images[0].get_array()
    np.testing.assert_allclose(rows, ((att[:, 0, 0] + att[:, 1, 0]) / 2).double().numpy())
    assert rows.shape == (2, 4)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["1", "2"]
    with pytest.raises(ValueError, match=r"attentions: expected \(layers, heads, 3, 3\)"):
        token_attention_figure(tokens[:3], att, layer=1)


def test_predictions_figure_titles_and_images():
    images = [np.zeros((2, 2)), np.array([[0.0, 2.0], [4.0, 8.0]])]
    fig = predictions_figure(images, ["3", "7"], [0.5, 0.125], truths=["3", "1"])
    assert [ax.get_title() for ax in fig.axes[:2]] == ["3 (0.50)\ntrue 3", "7 (0.12)\ntrue 1"]
    np.testing.assert_allclose(fig.axes[1].images[0].get_array(), [[0.0, 0.25], [0.5, 1.0]])
    with pytest.raises(ValueError, match="images/labels/probs: expected equal non-zero lengths, got 2, 1, 2"):
        predictions_figure(images, ["3"], [0.5, 0.1])
