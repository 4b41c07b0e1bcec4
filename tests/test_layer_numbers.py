"""Every user-facing layer number is a block number 1..L (README "Layer numbers"): Schatten tables and figures,
attention figures, the Space's layer boxes."""

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel


@pytest.fixture(scope="module")
def bert_report():
    from hf_tdiag.diagnostics.schatten import schatten_bounds

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
    return schatten_bounds(model, p_grid_m=4)


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
    for bad in (0, 5, -5):  # blocks are 1..L, or -L..-1 from the end
        with pytest.raises(
            ValueError, match=rf"^layer: expected a block number 1..4 or -4..-1 from the end, got {bad}$"
        ):
            _block_number(bad, 4)


def _naive_block_number(value, L, embeddings, from_end):
    """The convention written out by listing every accepted number and what it means."""
    accepted = {b: b for b in range(0 if embeddings else 1, L + 1)}
    if from_end:
        accepted.update({-k: L + 1 - k for k in range(1, L + 1)})
    return accepted.get(value)


@pytest.mark.parametrize("embeddings", [False, True])
@pytest.mark.parametrize("from_end", [False, True])
def test_one_layer_number_validator_accepts_exactly_the_documented_numbers(embeddings, from_end):
    from hf_tdiag._validation import block_number

    for L in (1, 2, 5):
        for value in range(-L - 3, L + 4):
            expected = _naive_block_number(value, L, embeddings, from_end)
            if expected is None:
                with pytest.raises(ValueError, match=rf"^depth: expected a block number .*, got {value}$"):
                    block_number(value, L, "depth", embeddings=embeddings, from_end=from_end)
            else:
                assert block_number(value, L, "depth", embeddings=embeddings, from_end=from_end) == expected
    for bad in (1.0, True, "2", None):
        with pytest.raises(TypeError, match="^depth: expected an integer"):
            block_number(bad, 3, "depth")


def test_every_entry_point_reads_layer_numbers_through_the_one_validator():
    """The Space, the concept model, attention-SVM, the attention figures and report section, the command and the
    trainer's SRR regulariser all call ``_validation.block_number``: none compares a layer against L itself."""
    import inspect

    from hf_tdiag.commands import attention_svm as command
    from hf_tdiag.diagnostics import attention_svm
    from hf_tdiag.gradio_app import handlers
    from hf_tdiag.probes import concept_model
    from hf_tdiag.report import attention_section
    from hf_tdiag.training import regularizers
    from hf_tdiag.viz import attention_maps

    for module in (command, attention_svm, handlers, concept_model, attention_section, regularizers, attention_maps):
        source = inspect.getsource(module)
        assert "block_number(" in source, module.__name__
        assert "<= num_layers" not in source and "1 <= layer" not in source and "0 <= layer" not in source, module


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
