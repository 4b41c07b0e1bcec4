"""hf_tdiag.probes.block_matrices, the behaviours its mutation run found untested: CRATE-α's matrices (``Dᵀ`` as the
first FFN matrix, ``D₁`` as the second) and its refusal of a block without one of them, and the module paths each
matrix reports (CRATE's computed output matrix, a parameter output matrix, a layer scale ``γ ⊙ W``). Expected
values are the model's own parameters, read by their module paths, and the paths written out by hand."""

import pytest
import torch
from transformers import Dinov2Config, Dinov2Model

from hf_tdiag import CrateConfig, CrateModel
from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaModel
from hf_tdiag.probes.block_matrices import encoder_weights
from hf_tdiag.probes.describe import describe


def _crate_alpha():
    torch.manual_seed(0)
    cfg = CrateAlphaConfig(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, image_size=8, patch_size=4,
                           num_channels=1)  # fmt: skip
    return CrateAlphaModel(cfg).eval()


def test_crate_alpha_reads_d_transposed_and_d1_as_its_ffn_matrices():
    model = _crate_alpha()
    ew = encoder_weights(model)
    assert (ew.family, ew.ffn_in_type, ew.ffn_out_type) == ("crate-alpha", "ista_d", "ista_d1")
    assert (ew.num_layers, ew.hidden_size, ew.intermediate_size, ew.num_heads, ew.head_dim) == (2, 8, 32, 2, 4)
    for i, lw in enumerate(ew.layers):
        p = f"encoder.layer.{i}"
        qkv, out = model.get_submodule(f"{p}.attention.qkv"), model.get_submodule(f"{p}.attention.out_proj")
        coder = model.get_submodule(f"{p}.sparse_coding")
        assert (
            torch.equal(lw.query, qkv.weight) and torch.equal(lw.key, qkv.weight) and torch.equal(lw.value, qkv.weight)
        )
        assert torch.equal(lw.attn_output, out.weight)
        assert lw.ffn_in.shape == (32, 8) and torch.equal(lw.ffn_in, coder.D.T)  # x -> Dᵀx
        assert lw.ffn_out.shape == (8, 32) and torch.equal(lw.ffn_out, coder.D1)  # a -> D₁a
        qkv_name = f"{p}.attention.qkv"
        assert lw.names == {
            "query": qkv_name, "key": qkv_name, "value": qkv_name, "attn_output": f"{p}.attention.out_proj",
            "ffn_in": f"{p}.sparse_coding.D", "ffn_out": f"{p}.sparse_coding.D1",
        }  # fmt: skip


@pytest.mark.parametrize("role", ["sparse_decoder", "attn_output"])
def test_a_crate_alpha_block_without_one_of_its_matrices_is_named(role):
    desc = describe(_crate_alpha())
    setattr(desc.layers[1], role, None)
    with pytest.raises(ValueError, match=rf"block 2 at 'encoder.layer.1' has no {role} module \(accepted names"):
        encoder_weights(desc)


def _crate():
    torch.manual_seed(0)
    cfg = CrateConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, head_dim=3, image_size=8,
                      patch_size=4, num_channels=1)  # fmt: skip
    return CrateModel(cfg).eval()


def test_crate_names_its_computed_output_matrix_and_its_ista_weight():
    model = _crate()  # one layer, 2 heads of width 3: a projection width 6 that is not the hidden size 8
    ew = encoder_weights(model)
    (lw,) = ew.layers
    assert (ew.family, ew.hidden_size, ew.num_heads, ew.head_dim, ew.intermediate_size) == ("crate", 8, 2, 3, 8)
    qkv = model.get_submodule("encoder.layer.0.attention.qkv").weight
    assert lw.query.shape == (6, 8) and torch.equal(ew.heads(0, "query")[1], qkv[3:6])
    attention = model.get_submodule("encoder.layer.0.attention")
    assert torch.equal(lw.attn_output, attention.output_matrix())
    assert torch.equal(lw.ffn_in, model.get_submodule("encoder.layer.0.ista").weight) and lw.ffn_out is None
    assert lw.names["attn_output"] == "encoder.layer.0.attention.output_matrix()"
    assert lw.names["ffn_in"] == "encoder.layer.0.ista.weight"
    # an ISTA block whose output matrix is a parameter (a plain Linear) is named by that module's path alone
    desc = describe(model)
    h = desc.layers[0]
    h.attn_output, h.paths["attn_output"] = attention.out_proj, "encoder.layer.0.attention.out_proj"
    (lw,) = encoder_weights(desc).layers
    assert torch.equal(lw.attn_output, attention.out_proj.weight)
    assert lw.names["attn_output"] == "encoder.layer.0.attention.out_proj"


def test_a_layer_scaled_matrix_is_named_gamma_times_its_module():
    torch.manual_seed(0)
    model = Dinov2Model(Dinov2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                     image_size=16, patch_size=8)).eval()  # fmt: skip
    (lw,) = encoder_weights(model).layers
    p = "encoder.layer.0"
    assert lw.names["attn_output"] == f"{p}.layer_scale1.lambda1 ⊙ {p}.attention.o_proj"
    assert lw.names["ffn_out"] == f"{p}.layer_scale2.lambda1 ⊙ {p}.mlp.fc2"
    assert lw.names["ffn_in"] == f"{p}.mlp.fc1"
