"""The architecture adapter finds the right modules in ViT, BERT-like and DistilBERT models."""

import pytest
import torch
from transformers import (
    BertConfig,
    BertModel,
    DistilBertConfig,
    DistilBertModel,
    RobertaConfig,
    RobertaForSequenceClassification,
    ViTConfig,
    ViTForImageClassification,
)

from hf_tdiag.probes.describe import describe


def _small(cls, **kw):
    return cls(**kw)


def test_vit_is_pre_norm_and_exposes_projections():
    cfg = ViTConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, image_size=16, patch_size=8
    )
    model = ViTForImageClassification(cfg)
    arch = describe(model)
    assert arch.family == "vit" and arch.pre_norm
    assert arch.num_layers == 3 and arch.num_heads == 4 and arch.head_dim == 8
    layer = arch.encoder_layers[1]  # transformers v5 ViT: layers[i].attention.q_proj/k_proj/v_proj/o_proj, mlp.fc1/fc2
    h = arch.layers[1]
    assert h.query is layer.attention.q_proj
    assert h.key is layer.attention.k_proj
    assert h.value is layer.attention.v_proj
    assert h.attn_output is layer.attention.o_proj
    assert h.ffn_in is layer.mlp.fc1
    assert h.ffn_out is layer.mlp.fc2
    assert h.attention_norm is layer.layernorm_before
    assert h.projection_weight("key").shape == (32, 32)


@pytest.mark.parametrize("cls,cfg_cls", [(BertModel, BertConfig), (RobertaForSequenceClassification, RobertaConfig)])
def test_bert_like_is_post_norm(cls, cfg_cls):
    cfg = cfg_cls(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=50)
    model = cls(cfg)
    arch = describe(model)
    assert arch.family == "bert" and not arch.pre_norm
    layer = arch.encoder_layers[0]
    h = arch.layers[0]
    assert h.attention_norm is None
    assert h.query is layer.attention.self.query
    assert h.attn_output is layer.attention.output.dense
    assert h.ffn_in is layer.intermediate.dense
    assert h.ffn_out is layer.output.dense
    assert h.head_dim == 16


def test_distilbert_naming():
    cfg = DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=50)
    model = DistilBertModel(cfg)
    arch = describe(model)
    layer = arch.encoder_layers[1]
    h = arch.layers[1]
    assert arch.num_layers == 2 and h.num_heads == 4
    assert h.query is layer.attention.q_lin and h.value is layer.attention.v_lin
    assert h.attn_output is layer.attention.out_lin
    assert h.ffn_in is layer.ffn.lin1 and h.ffn_out is layer.ffn.lin2


def test_unsupported_models_get_clear_errors():
    with pytest.raises(TypeError, match="model"):
        describe("bert-base-uncased")
    mlp = torch.nn.Sequential(torch.nn.Linear(3, 3))
    with pytest.raises(ValueError, match="unsupported architecture 'Sequential'"):
        describe(mlp)
    mlp.config = BertConfig(hidden_size=3, num_attention_heads=1, num_hidden_layers=1)
    with pytest.raises(ValueError, match=r"unsupported architecture 'bert'.*named by role \(query: query \| q_lin"):
        describe(mlp)


def _tiny_crate(variant="crate"):
    from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification

    cfg = CrateConfig(
        image_size=8, patch_size=4, num_channels=1, hidden_size=8, num_hidden_layers=2, num_attention_heads=2
    )
    cfg.variant = variant
    return CrateForImageClassification(cfg)


@pytest.mark.parametrize("variant", ["crate", "crate-c", "crate-n", "crate-t", "crate-fix"])
def test_crate_roles_are_the_blocks_own_modules(variant):
    model = _tiny_crate(variant)
    desc = describe(model)
    assert (desc.family, desc.projection_layout, desc.attention, desc.causal) == ("crate", "shared", "mssa", False)
    assert desc.layers_path == "crate.encoder.layer" and desc.base_model is model.crate
    for i, block in enumerate(model.crate.encoder.layer):
        h = desc.layers[i]
        assert h.query is h.key is h.value is block.attention.qkv and h.attn_output is block.attention
        assert h.ista is block.ista and h.ffn_in is None and h.ffn_out is None
        assert h.attention_norm is block.layernorm_before and h.ffn_norm is block.layernorm_after
        torch.testing.assert_close(h.output_weight(), block.attention.output_matrix())
        assert all(model.get_submodule(path) is h.module(role) for role, path in h.paths.items())


def test_bert_post_norms_and_paths():
    model = BertModel(BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32))
    desc = describe(model)
    block = model.encoder.layer[1]
    h = desc.layers[1]
    assert h.attention_norm is None and h.ffn_norm is None  # post-norm: nothing normalises the block's input
    assert h.attention_post_norm is block.attention.output.LayerNorm and h.ffn_post_norm is block.output.LayerNorm
    assert h.paths["ffn_out"] == "encoder.layer.1.output.dense" and h.path == "encoder.layer.1"
    assert all(model.get_submodule(path) is h.module(role) for role, path in h.paths.items())
    with pytest.raises(ValueError, match="role: expected one of"):
        h.module("intermediate")


def test_decoder_roles_are_the_blocks_own_modules():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=8, vocab_size=32))
    desc = describe(gpt2)
    block = gpt2.transformer.h[1]
    h = desc.layers[1]
    assert (desc.family, desc.projection_layout, desc.attention, desc.causal) == ("gpt2", "fused", "causal", True)
    W = block.attn.c_attn.weight  # Conv1D (d, 3d): the query is its first d columns
    assert torch.equal(h.query.weight, W[:, :16].T) and torch.equal(h.value.bias, block.attn.c_attn.bias[32:])
    assert h.attn_output is block.attn.c_proj and h.ffn_in is block.mlp.c_fc and h.ffn_norm is block.ln_2
    assert desc.final_norm is gpt2.transformer.ln_f
    assert desc.decoder_layout() is desc.decoder and desc.decoder.refs[1]["query"].name == h.paths["query"] + ".weight"
    llama = LlamaForCausalLM(
        LlamaConfig(
            num_hidden_layers=2,
            hidden_size=16,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=24,
            vocab_size=32,
        )
    )
    desc = describe(llama)
    block = llama.model.layers[0]
    h = desc.layers[0]
    assert (desc.family, desc.num_kv_heads, desc.rotary, h.num_kv_heads) == ("llama", 2, True, 2)
    assert h.ffn_gate is block.mlp.gate_proj and h.ffn_in is block.mlp.up_proj and h.ffn_out is block.mlp.down_proj
    assert h.attention_norm is block.input_layernorm and h.ffn_norm is block.post_attention_layernorm
    assert desc.final_norm is llama.model.norm
    assert all(llama.get_submodule(path) is h.module(role) for role, path in h.paths.items())
    with pytest.raises(ValueError, match="not a supported decoder"):
        describe(BertModel(BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2))).decoder_layout()


def test_register_checks_roles_and_family_names():
    from hf_tdiag.probes.describe import ROLE_TABLE, Adapter, adapters, register

    order = [a.order for a in adapters()]
    names = [a.name for a in adapters()]
    assert order == sorted(order) and names[-1] == "encoders"  # the catch-all is tried last
    assert names.index("crate") < names.index("gpt2") and {"llama", "gpt2", "crate"} <= set(names)
    with pytest.raises(ValueError, match=r"roles \['intermediate'\] are not in ROLES"):
        register(Adapter("x", {"x": {"intermediate": ("fc",)}}, lambda m: None, "nothing"))
    with pytest.raises(ValueError, match="family 'bert' is already registered by 'encoders'"):
        register(Adapter("x", {"bert": {"query": ("q",)}}, lambda m: None, "nothing"))
    assert "x" not in ROLE_TABLE and "x" not in [a.name for a in adapters()]
