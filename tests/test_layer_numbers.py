"""Every user-facing layer number is a block number 1..L (README "Layer numbers"): Schatten tables and figures,
attention figures, the Space's layer boxes."""

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel


@pytest.fixture(scope="module")
def bert_report():
    from hf_tdiag.diagnostics.schatten import spectrum_bounds

    torch.manual_seed(0)
    model = BertModel(
        BertConfig(
            vocab_size=30,
            max_position_embeddings=8,
            hidden_size=16,
            num_hidden_layers=3,
            num_attention_heads=2,
            intermediate_size=24,
        )
    ).eval()
    return spectrum_bounds(model, p_grid_m=4)


def test_schatten_records_and_tables_number_blocks_1_to_L(bert_report):
    L = bert_report.num_layers
    assert sorted({m.layer for m in bert_report.matrices}) == list(range(1, L + 1))
    headers, rows = bert_report.breakdown_tables()["layers"]
    assert headers[0] == "layer" and [r[0] for r in rows] == [1, 2, 3]
    # row ℓ carries block ℓ's gain and α (the 0-based arrays at ℓ - 1)
    for r in rows:
        assert r[1] == pytest.approx(float(bert_report.layer_gains[r[0] - 1]))
        assert r[2] == pytest.approx(float(bert_report.alpha[r[0] - 1]))


def test_schatten_figures_label_blocks_1_to_L(bert_report):
    from hf_tdiag.viz import schatten as VS
    from hf_tdiag.viz.schatten import optimal_p_heatmap

    fig = VS.plot_optimal_p(bert_report)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "2", "3"]
    fig = VS.plot_spectral_decay(bert_report)
    bar = fig.axes[-1]  # the layer colour bar
    assert [t.get_text() for t in bar.get_yticklabels()] == ["1", "2", "3"]
    fig = optimal_p_heatmap(bert_report)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["1", "2", "3"]


def test_space_layer_boxes_take_block_numbers_and_negative_from_the_end():
    from hf_tdiag.gradio_app.handlers import _block_number

    assert [_block_number(v, 4) for v in (None, -1, -4, 1, 4)] == [4, 4, 1, 1, 4]
    assert _block_number(0, 4) == 0  # refused by the tabs: blocks are 1..L


def test_attention_svm_block_index_is_block_number_minus_one():
    from transformers import ViTConfig, ViTModel

    from hf_tdiag.diagnostics.attention_svm import block_index

    vit = ViTModel(
        ViTConfig(
            image_size=16,
            patch_size=8,
            hidden_size=16,
            num_hidden_layers=3,
            num_attention_heads=2,
            intermediate_size=32,
        )
    )
    assert [block_index(vit, b) for b in (1, 2, 3)] == [0, 1, 2]
    for bad in (0, 4, -1):
        with pytest.raises(ValueError, match="layer"):
            block_index(vit, bad)
    assert np.isscalar(block_index(vit, np.int64(2)))
