"""Decoder adapters (GPT-2, Llama with GQA, Mistral, Qwen2): families found from the modules, per-head weights with
the right shared K/V head, gated MLP matrices, causal token states; unsupported decoders get a clear error."""

import pytest
import torch
from decoder_models import build, decoder_dirs, decoder_models  # noqa: F401  (fixtures)
from transformers import AutoModelForCausalLM, GPTNeoXConfig

from hf_tdiag.probes.decoders import model_getter
from hf_tdiag.probes.describe import describe
from hf_tdiag.probes.subspaces import subspaces
from hf_tdiag.probes.token_states import token_states


def test_families_and_shapes(decoder_models):
    expect = {  # family, H, H_kv, p, I, gated, norm, rotary, tied
        "gpt2": ("gpt2", 4, 4, 8, 128, False, "layernorm", False, True),
        "llama": ("llama", 8, 2, 8, 96, True, "rmsnorm", True, False),
        "mistral": ("llama", 4, 2, 8, 48, True, "rmsnorm", True, False),
        "qwen2": ("llama", 4, 1, 8, 40, True, "rmsnorm", True, True),
    }
    for name, model in decoder_models.items():
        lay = describe(model).decoder_layout()
        got = (
            lay.family,
            lay.num_heads,
            lay.num_kv_heads,
            lay.head_dim,
            lay.intermediate_size,
            lay.gated,
            lay.norm,
            lay.rotary,
            lay.tied_embeddings,
        )
        assert got == expect[name], name
        assert lay.num_layers == model.config.num_hidden_layers and lay.model_type == name
        # the base model's layout names the same tensors without the head's prefix
        base = describe(model.base_model).decoder_layout()
        assert all(lay.refs[0][r].name.endswith(base.refs[0][r].name) for r in lay.refs[0])


def test_gpt2_fused_weights_sliced_by_hand(decoder_models):
    model = decoder_models["gpt2"]
    lay, get = describe(model).decoder_layout(), model_getter(model)
    c = model.transformer.h[1].attn.c_attn
    W, b = c.weight.detach(), c.bias.detach()  # Conv1D: y = x W + b, W (32, 96)
    assert torch.equal(lay.weight(1, "query", get), W[:, :32].T)
    assert torch.equal(lay.weight(1, "key", get), W[:, 32:64].T)
    assert torch.equal(lay.weight(1, "value", get), W[:, 64:].T)
    assert torch.equal(lay.bias(1, "key", get), b[32:64])
    assert torch.equal(lay.weight(1, "attn_output", get), model.transformer.h[1].attn.c_proj.weight.T)
    assert torch.equal(lay.weight(1, "ffn_in", get), model.transformer.h[1].mlp.c_fc.weight.T)
    h = lay.head(1, 3, get)
    assert (
        h.kv_head == 3
        and torch.equal(h.W_V, W[:, 64 + 24 :].T)
        and torch.equal(h.W_O, model.transformer.h[1].attn.c_proj.weight.T[:, 24:])
    )
    arch = describe(model)
    assert arch.family == "gpt2" and arch.causal and torch.equal(arch.layers[1].key.weight, W[:, 32:64].T)
    U = subspaces(model, "value")
    assert U[1].shape == (4, 32, 8) and torch.equal(U[1][2], W[:, 64 + 16 : 64 + 24])


def test_gqa_sharing_explicit(decoder_models):
    lay = describe(decoder_models["llama"]).decoder_layout()
    assert [lay.kv_head(h) for h in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert lay.query_heads(1) == [4, 5, 6, 7] and lay.group_size == 4
    assert lay.describe()["kv_head_of_query_head"] == [0, 0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="head"):
        lay.kv_head(8)


def test_gqa_heads_use_the_shared_kv_head_the_model_uses():
    """Zero K/V head 1's key rows: exactly the query heads the layout maps to it get uniform attention in the model."""
    model = build("llama")
    model.config._attn_implementation = "eager"
    lay, get = describe(model).decoder_layout(), model_getter(model)
    attn = model.model.layers[0].self_attn
    p = lay.head_dim
    with torch.no_grad():
        attn.k_proj.weight[p : 2 * p] = 0  # K/V head 1
        attn.v_proj.weight[:p] = 0  # V of K/V head 0
    ids = torch.randint(2, 64, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        att = model(input_ids=ids, output_attentions=True).attentions[0][0]  # (H, N, N)
    uniform = torch.tril(torch.ones(7, 7)) / torch.arange(1, 8)[:, None]
    for h in range(8):
        hw = lay.head(0, h, get)
        model_says_uniform = torch.allclose(att[h], uniform, atol=1e-6)
        assert model_says_uniform == (hw.kv_head == 1) == bool((hw.W_K == 0).all())
        assert bool((hw.W_V == 0).all()) == (hw.kv_head == 0)
        assert torch.equal(hw.W_Q, attn.q_proj.weight[h * p : (h + 1) * p])
        assert torch.equal(hw.W_O, attn.o_proj.weight[:, h * p : (h + 1) * p])
    # per-query-head expansion repeats each K/V head for its group (transformers' repeat_kv)
    k = lay.heads(0, "key", get, by_query_head=True)
    assert k.shape == (8, p, 64) and all(torch.equal(k[h], lay.heads(0, "key", get)[h // 4]) for h in range(8))


def test_gated_mlp_and_subspaces(decoder_models):
    model = decoder_models["mistral"]
    lay, get = describe(model).decoder_layout(), model_getter(model)
    mlp = model.model.layers[1].mlp
    assert torch.equal(lay.weight(1, "ffn_gate", get), mlp.gate_proj.weight)
    assert torch.equal(lay.weight(1, "ffn_in", get), mlp.up_proj.weight)
    assert torch.equal(lay.weight(1, "ffn_out", get), mlp.down_proj.weight)
    arch = describe(model)
    assert arch.num_kv_heads == 2 and arch.layers[1].ffn_gate is mlp.gate_proj
    assert [u.shape for u in subspaces(model, "key")] == [(2, 32, 8)] * 2
    assert [u.shape for u in subspaces(model, "query")] == [(4, 32, 8)] * 2


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_causal_token_states_with_padding(decoder_models, family):
    model = decoder_models[family]
    ids = torch.randint(2, 64, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    st = token_states(model, {"input_ids": ids, "attention_mask": mask})
    with torch.no_grad():
        hs = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    L = model.config.num_hidden_layers
    assert st.causal and len(st.block_outputs) == L
    for ell in range(1, L):  # the last hidden state of Transformers' decoders is after the final norm
        assert torch.allclose(st.block_outputs[ell - 1], hs[ell], atol=1e-6)
    assert torch.equal(st.token_mask, mask.bool())
    vis = st.visible_tokens()
    assert vis.shape == (2, 6, 6)
    assert torch.equal(vis[0], torch.tril(torch.ones(6, 6, dtype=torch.bool)))
    assert not vis[1, :, 4:].any() and torch.equal(vis[1, :, :4], torch.tril(torch.ones(6, 6, dtype=torch.bool))[:, :4])
    # causality: changing the last token leaves every earlier state unchanged
    ids2 = ids.clone()
    ids2[0, -1] = (ids2[0, -1] + 1) % 64
    st2 = token_states(model, {"input_ids": ids2, "attention_mask": mask})
    assert torch.allclose(st2.block_outputs[0][0, :-1], st.block_outputs[0][0, :-1], atol=1e-6)
    assert not torch.allclose(st2.block_outputs[0][0, -1], st.block_outputs[0][0, -1])


def test_unsupported_decoder_is_a_clear_error():
    model = AutoModelForCausalLM.from_config(
        GPTNeoXConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=64)
    )
    with pytest.raises(ValueError, match="not a supported decoder.*query_key_value"):
        describe(model)
    with pytest.raises(TypeError, match="model"):
        describe("gpt2")
