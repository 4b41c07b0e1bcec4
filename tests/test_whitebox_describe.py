"""describe() on ToST, CRATE-MAE and CRATE-α: the handles are the models' own modules (CRATE-α's overcomplete
dictionaries D and D₁ through the roles sparse_dictionary / sparse_decoder); SRR reads ToST's U."""

import pytest
import torch

import hf_tdiag
from hf_tdiag.measures.coding_rate import compression_rate
from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification
from hf_tdiag.models.crate_mae import CrateMAEConfig, CrateMAEForImageClassification
from hf_tdiag.models.tost import TostConfig, TostForImageClassification
from hf_tdiag.probes.describe import describe

pytestmark = pytest.mark.slow


def test_handles_are_the_models_own_modules():
    tost = TostForImageClassification(TostConfig.from_preset("tost-digits", num_labels=10))
    mae = CrateMAEForImageClassification(CrateMAEConfig.from_preset("crate-mae-digits", num_labels=10))
    alpha = CrateAlphaForImageClassification(CrateAlphaConfig.from_preset("crate-alpha-digits", num_labels=10))
    for model, blocks, family in ((tost, tost.tost.layer, "tost"), (mae, mae.crate_mae.encoder, "crate-mae"),
                                  (alpha, alpha.crate_alpha.encoder.layer, "crate-alpha")):  # fmt: skip
        desc = describe(model)
        assert desc.family == family and desc.num_layers == 4 and desc.projection_layout == "shared"
        for handle, block in zip(desc.layers, blocks):
            assert handle.query is block.attention.qkv and handle.key is handle.query
            assert handle.output_weight() is block.attention.out_proj.weight
            assert handle.attention_norm is block.layernorm_before
    assert describe(tost).layers[0].ffn_in is tost.tost.layer[0].mlp.fc1 and describe(tost).attention == "tssa"
    assert describe(mae).layers[2].ista is mae.crate_mae.encoder[2].ista
    h = describe(alpha).layers[0]
    coder = alpha.crate_alpha.encoder.layer[0].sparse_coding
    assert h.ffn_in is None and h.ista is None and h.sparse_dictionary is coder and h.sparse_decoder is coder
    D, D1 = h.sparse_coding_weights()
    assert D is coder.D and D1 is coder.D1
    assert h.paths["sparse_decoder"] == "crate_alpha.encoder.layer.0.sparse_coding"


def test_srr_uses_tost_subspaces():
    model = TostForImageClassification(TostConfig.from_preset("tost-digits", num_labels=10)).eval()
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    report = hf_tdiag.layer_srr(model, x, progress=False)
    with torch.no_grad():
        states = model(x, output_hidden_states=True).hidden_states
    weight = model.tost.layer[0].attention.qkv.weight
    U = weight.reshape(4, 16, 64).transpose(1, 2)
    expected = float(compression_rate(states[1], U, 0.1).mean())
    frame = report.to_pandas()
    row = (
        frame[(frame["layer"] == 1) & (frame["state"] == "output")] if "state" in frame else frame[frame["layer"] == 1]
    )
    assert float(row["Rc"].iloc[0]) == pytest.approx(expected, rel=1e-4)
