"""CRATE-MAE's patch-projection gain: the Xavier bound it initializes within, the digits' 2x2 patch content at a third
of the fixed sine-cosine positions' scale at the authors' gain 1 and at their scale at gain 3, the config's checks."""

from __future__ import annotations

import math

import pytest
import torch

from hf_tdiag.models.crate_mae import CrateMAEConfig, CrateMAEModel


def _model(gain=None, **kw):
    torch.manual_seed(0)
    extra = {} if gain is None else {"patch_embedding_gain": gain}
    return CrateMAEModel(CrateMAEConfig.from_preset("crate-mae-digits", hidden_size=112, **extra, **kw))


@pytest.mark.parametrize("gain", [1.0, 3.0])
def test_projection_is_xavier_uniform_at_the_gain(gain):
    w = _model(gain).embeddings.projection.weight.detach().reshape(112, -1)
    bound = gain * math.sqrt(6.0 / (w.shape[1] + w.shape[0]))  # fan_in = C·p² = 4, fan_out = d = 112
    assert float(w.abs().max()) <= bound
    assert float(w.abs().max()) > 0.95 * bound  # 448 uniform draws reach the edge
    assert float(w.std()) == pytest.approx(bound / math.sqrt(3.0), rel=0.1)


def test_default_gain_is_the_authors():
    assert CrateMAEConfig().patch_embedding_gain == 1.0
    assert CrateMAEConfig.from_preset("crate-mae-digits").patch_embedding_gain == 1.0


def _content_to_position_rms(model):
    from sklearn.datasets import load_digits

    x = torch.tensor(load_digits().images[:256], dtype=torch.float32).unsqueeze(1) / 16.0
    x = (x - 0.5) / 0.5  # the digits recipes' [-1, 1] scaling
    with torch.no_grad():
        content = model.embeddings.projection(x).flatten(2).transpose(1, 2)
    positions = model.embeddings.position_embeddings[0, 1:]
    return float(content.pow(2).mean().sqrt() / positions.pow(2).mean().sqrt())


def test_gain_3_gives_small_patches_the_positions_scale():
    assert _content_to_position_rms(_model()) < 0.45  # the authors' gain at 2x2 one-channel patches: a third
    assert 0.7 < _content_to_position_rms(_model(3.0)) < 1.5


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), True, "3"])
def test_config_rejects_a_bad_gain(bad):
    with pytest.raises(ValueError, match="patch_embedding_gain"):
        CrateMAEConfig(patch_embedding_gain=bad)


def test_the_gain_survives_save_and_reload(tmp_path):
    model = _model(2.5)
    model.save_pretrained(tmp_path)
    assert CrateMAEConfig.from_pretrained(tmp_path).patch_embedding_gain == 2.5
