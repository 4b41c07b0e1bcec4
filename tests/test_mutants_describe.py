"""hf_tdiag.probes.describe, the behaviours its mutation run found untested: register's role table, the projection
weights by name, CRATE-α's sparse coding weights only with both modules, an encoder's decoder_layout error."""

import pytest
import torch
from torch import nn
from transformers import ViTConfig, ViTModel

from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaModel
from hf_tdiag.probes import describe as describe_module
from hf_tdiag.probes.describe import ROLE_TABLE, Adapter, adapters, block_lists, describe, register

TINY_VIT = dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, image_size=8,
                patch_size=4, num_channels=1)  # fmt: skip


def test_register_adds_the_adapters_role_table_with_tuples_of_names():
    adapters()  # the built-in adapters first, so that they are not loaded inside the try below
    adapter = Adapter("test-mutants-describe", {"test-family": {"query": ["q", "wq"], "ffn_in": ("fc1",)}},
                      lambda model: None, "nothing")  # fmt: skip
    try:
        assert register(adapter) is adapter
        assert ROLE_TABLE["test-family"] == {"query": ("q", "wq"), "ffn_in": ("fc1",)}
    finally:
        describe_module._ADAPTERS.pop("test-mutants-describe", None)
        ROLE_TABLE.pop("test-family", None)


def test_projection_weight_returns_each_projections_own_weight():
    torch.manual_seed(0)
    model = ViTModel(ViTConfig(**TINY_VIT)).eval()
    (h,) = describe(model).layers
    for source, proj in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        assert h.projection_weight(source) is model.get_submodule(f"layers.0.attention.{proj}").weight
    with pytest.raises(ValueError, match=r"source: expected 'query', 'key' or 'value', got 'output'"):
        h.projection_weight("output")


def test_an_encoders_decoder_layout_error_names_its_class_and_model_type():
    model = ViTModel(ViTConfig(**TINY_VIT))
    with pytest.raises(ValueError, match=r"^model: ViTModel \(model_type 'vit'\) is not a supported decoder"):
        describe(model).decoder_layout()


def test_sparse_coding_weights_need_both_the_dictionary_and_the_decoder():
    torch.manual_seed(0)
    model = CrateAlphaModel(CrateAlphaConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, image_size=8,
                                             patch_size=4, num_channels=1))  # fmt: skip
    (h,) = describe(model).layers
    coder = model.get_submodule("encoder.layer.0.sparse_coding")
    D, D1 = h.sparse_coding_weights()
    assert D is coder.D and D1 is coder.D1
    for role in ("sparse_decoder", "sparse_dictionary"):
        (h,) = describe(model).layers
        setattr(h, role, None)
        assert h.sparse_coding_weights() is None


def test_block_lists_leave_out_empty_module_lists():
    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.empty = nn.ModuleList()
            self.blocks = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])

    model = Toy()
    assert block_lists(model, lambda b: isinstance(b, nn.Linear)) == [("blocks", model.blocks)]


class CausalToy(nn.Module):
    """A causal model no adapter reads: one submodule declaring ``is_causal = True``, no block list."""

    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(2, 2)
        self.attn.is_causal = True


def test_an_unread_causal_model_is_named_as_an_unsupported_decoder():
    with pytest.raises(ValueError, match=r"^model: CausalToy \(model_type 'CausalToy'\) is not a supported decoder"):
        describe(CausalToy())
