"""CRATE (vision) beyond tests/test_crate_blocks.py's block formulas: the embedding dropout in training, the
interpolated positions keeping the model's dtype, and CRATE-fix's fixed output matrix at its documented scale
(mutation survivors of modeling_crate.py, killed here)."""

from __future__ import annotations

import math

import torch

from hf_tdiag.models.crate import CrateConfig, CrateModel


def _config(**kw) -> CrateConfig:
    fields = dict(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=2,
                  num_attention_heads=2, num_labels=3)  # fmt: skip
    return CrateConfig(**{**fields, **kw})


def test_embedding_dropout_drops_in_training_only():
    torch.manual_seed(0)
    model = CrateModel(_config(hidden_dropout_prob=0.5))
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    embeddings = model.embeddings
    model.eval()
    with torch.no_grad():
        clean = embeddings(x)
    model.train()
    torch.manual_seed(3)
    with torch.no_grad():
        dropped = embeddings(x)
    kept = dropped != 0
    assert 0.2 < float(kept.float().mean()) < 0.8  # about half the entries dropped
    torch.testing.assert_close(dropped[kept], 2 * clean[kept])  # the kept ones scaled by 1 / (1 - p)


def test_interpolated_positions_keep_the_models_dtype():
    torch.manual_seed(0)
    model = CrateModel(_config()).to(torch.bfloat16).eval()
    x = torch.randn(1, 1, 12, 12, dtype=torch.bfloat16)
    with torch.no_grad():
        positions = model.embeddings.interpolate_pos_encoding(12, 12)
        out = model(x, interpolate_pos_encoding=True).last_hidden_state
    assert positions.dtype == torch.bfloat16 and positions.shape == (1, 10, 16)
    assert out.dtype == torch.bfloat16 and out.shape == (1, 10, 16)


def test_crate_fix_output_matrix_has_the_documented_scale():
    """normal(0, (K·p)^-1/2): the fixed matrix roughly preserves the norm of the concatenated heads."""
    torch.manual_seed(0)
    model = CrateModel(_config(variant="crate-fix", hidden_size=64, num_attention_heads=4))
    fixed = model.encoder.layer[0].attention.fixed_output
    assert fixed.shape == (64, 64)
    assert abs(float(fixed.std()) - 1 / math.sqrt(64)) < 0.1 / math.sqrt(64)
    assert abs(float(fixed.mean())) < 0.01
