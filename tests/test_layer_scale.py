"""Layer scales (``z + γ ⊙ f(z)``: DINOv2's LayerScale, BEiT's λ): the weight-reading diagnostics measure the matrices
the forward applies, ``diag(γ) W``. The check is an identity: the same network with γ folded into its weights (and
γ = 1) computes the same function, so every number read from weights must be the same."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch
from transformers import BeitConfig, BeitModel, Dinov2Config, Dinov2ForImageClassification, Dinov2Model, ViTModel

import hf_tdiag
from hf_tdiag.probes.describe import describe

TINY = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, image_size=16,
            patch_size=8)  # fmt: skip


def _blocks(model):
    return describe(model).blocks


def _gammas(model, pairs):
    """Random γ's with entries both above and below 1 in size, and of both signs."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in _blocks(model):
            for name in pairs:
                p = layer.get_parameter(name)
                p.copy_((torch.rand(p.shape, generator=g) * 3 + 0.2) * torch.where(torch.rand(p.shape) < 0.3, -1, 1))
    return model


def _folded(model, branches):
    """The same function with γ folded into each branch's last Linear (weight and bias) and γ set to 1."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for layer in _blocks(out):
            for gamma_name, linear_name in branches:
                gamma, linear = layer.get_parameter(gamma_name), layer.get_submodule(linear_name)
                linear.weight.mul_(gamma[:, None])
                linear.bias.mul_(gamma)
                gamma.fill_(1.0)
    return out


DINO = (("layer_scale1.lambda1", "attention.o_proj"), ("layer_scale2.lambda1", "mlp.fc2"))
BEIT = (("lambda_1", "attention.o_proj"), ("lambda_2", "mlp.fc2"))


def _dinov2():
    torch.manual_seed(0)
    return _gammas(Dinov2Model(Dinov2Config(**TINY)).eval(), [g for g, _ in DINO])


def _beit():
    torch.manual_seed(0)
    return _gammas(BeitModel(BeitConfig(**TINY, layer_scale_init_value=0.1)).eval(), [g for g, _ in BEIT])


def test_describe_finds_each_branchs_layer_scale():
    dino, beit = _dinov2(), _beit()
    for model, names in ((dino, DINO), (beit, BEIT)):
        for h, block in zip(describe(model).layers, _blocks(model)):
            assert h.layer_scale("attention") is block.get_parameter(names[0][0])
            assert h.layer_scale("ffn") is block.get_parameter(names[1][0])
    plain = BeitModel(BeitConfig(**TINY, layer_scale_init_value=0.0))  # BEiT without layer scale: λ is None
    vit = ViTModel(transformers_vit_config())
    for model in (plain, vit):
        assert all(h.layer_scale(b) is None for h in describe(model).layers for b in ("attention", "ffn"))
    with pytest.raises(ValueError, match=r"branch: expected one of \['attention', 'ffn'\], got 'mlp'"):
        describe(dino).layers[0].layer_scale("mlp")


def transformers_vit_config():
    from transformers import ViTConfig

    return ViTConfig(**TINY)


@pytest.mark.parametrize("build,branches", [(_dinov2, DINO), (_beit, BEIT)], ids=["dinov2", "beit"])
def test_schatten_bounds_read_the_scaled_matrices(build, branches):
    model = build()
    folded = _folded(model, branches)
    x = torch.rand(2, 3, 16, 16)
    with torch.no_grad():  # the fold keeps the function
        torch.testing.assert_close(model(x).last_hidden_state, folded(x).last_hidden_state, rtol=1e-5, atol=1e-5)
    got, want = hf_tdiag.schatten_bounds(model), hf_tdiag.schatten_bounds(folded)
    cols = [c for c in want.to_pandas().columns if not c.endswith("_s")]
    pd.testing.assert_frame_equal(got.to_pandas()[cols], want.to_pandas()[cols], rtol=1e-5)
    # the unscaled weights give other numbers: the comparison sees the scale
    with torch.no_grad():
        for layer in _blocks(folded):
            layer.get_parameter(branches[0][0]).mul_(2.0)
    assert not hf_tdiag.schatten_bounds(folded).to_pandas()[cols].equals(want.to_pandas()[cols])


def test_concept_fidelity_folds_the_scale_into_its_certified_constants():
    torch.manual_seed(0)
    model = _gammas(Dinov2ForImageClassification(Dinov2Config(**TINY, num_labels=3)).eval(), [g for g, _ in DINO])
    x = torch.rand(4, 3, 16, 16)
    with pytest.raises(
        ValueError, match=r"classifier reads 32 features, not the CLS token's 16 .*\(model\.dinov2\) with head="
    ):
        hf_tdiag.concept_fidelity(model, x, 1, 2, progress=False)
    head = torch.nn.Linear(16, 3)
    runs = []
    for encoder in (model.dinov2, _folded(model.dinov2, DINO)):
        torch.manual_seed(1)
        runs.append(hf_tdiag.concept_fidelity(encoder, x, 0, 2, head=head, power_iters=3, progress=False))
    got, want = runs
    for key in ("kl", "bound_certified", "bound_certified_chain", "bound_estimated"):
        assert got["per_image"][key] == pytest.approx(want["per_image"][key], rel=1e-5, abs=1e-9), key
