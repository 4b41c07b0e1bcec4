"""The Att-SVM head diagnostic on causal decoders (GPT-2, Llama with grouped keys and rotary positions),
built from small configs and saved locally, checked against the models' own attention."""

import math

import pytest
import torch

pytest.importorskip("cvxpy")

from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

from hf_tdiag.diagnostics.attention_svm import attention_svm_diagnostic  # noqa: E402
from hf_tdiag.measures.attention_svm import att_svm_self  # noqa: E402


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():  # non-zero attention biases so the bias column is exercised
        model.transformer.h[1].attn.c_attn.bias.normal_(0, 0.3)
    path = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=32,
        intermediate_size=64,
        vocab_size=64,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    path = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def _eager(path):
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


def _own_attention(model, ids, layer, head, mask=None):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    return out, out.attentions[layer][:, head].double()


def test_gpt2_causal_head_against_the_model(gpt2_dir):
    model = _eager(gpt2_dir)
    ids = torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(1))
    diag = attention_svm_diagnostic(model, {"input_ids": ids}, 2, 2, max_queries=None)  # block 2 = attentions[1]
    out, attn = _own_attention(model, ids, 1, 2)
    assert diag.causal and not diag.rotary and diag.family == "gpt2" and diag.include_bias
    qi = diag.query_index
    # every position but 0 of every sequence is a query; the selection is the model's own argmax
    assert sorted(map(tuple, qi.tolist())) == [(b, q) for b in range(3) for q in range(1, 9)]
    assert torch.equal(diag.selected, attn.argmax(-1)[qi[:, 0], qi[:, 1]])
    assert torch.allclose(diag.max_probs, attn.max(-1).values[qi[:, 0], qi[:, 1]], atol=1e-5)
    # constraints exactly over the prefix t <= q, t != selected
    for j, (_, q) in enumerate(qi.tolist()):
        expect = [int(t <= q and t != int(diag.selected[j])) for t in range(9)]
        assert diag.svm.constraint[j].tolist() == expect
    # W_h from the fused Conv1D columns, sliced by hand
    W = model.transformer.h[1].attn.c_attn.weight.double()
    bias = model.transformer.h[1].attn.c_attn.bias.double()
    p = 8
    Wq, Wk, bq = W[:, 2 * p : 3 * p].T, W[:, 32 + 2 * p : 32 + 3 * p].T, bias[2 * p : 3 * p]
    assert torch.allclose(diag.W_head[:, :32], Wk.T @ Wq / math.sqrt(p))
    assert torch.allclose(diag.W_head[:, 32], Wk.T @ bq / math.sqrt(p))
    # the head's margins are its logit gaps: log-probability differences of the model's own attention
    logp = attn.log()
    for j, (b, q) in enumerate(qi.tolist()):
        a = int(diag.selected[j])
        gaps = [float(logp[b, q, a] - logp[b, q, t]) for t in range(q + 1) if t != a]
        assert diag.head_margins[j].item() * float(diag.W_head.norm()) == pytest.approx(min(gaps), rel=1e-4, abs=1e-5)
    # the SVM: the causal Att-SVM on the head's input (ln_1 output) with queries [x, 1]
    X = model.transformer.h[1].ln_1(out.hidden_states[1]).double()
    Z = torch.cat([X, torch.ones(3, 9, 1, dtype=torch.float64)], 2)
    ref = att_svm_self(X, attn.argmax(-1), causal=True, queries=Z)
    assert diag.svm.objective == pytest.approx(ref.objective, rel=1e-6)
    assert 0 < diag.margin_ratio <= 1 + 1e-9


def test_gpt2_padding_is_never_a_constraint(gpt2_dir):
    model = _eager(gpt2_dir)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0  # right padding
    diag = attention_svm_diagnostic(model, {"input_ids": ids, "attention_mask": mask}, 1, 1, max_queries=None)
    qi = diag.query_index
    assert not ((qi[:, 0] == 1) & (qi[:, 1] >= 5)).any()
    rows = qi[:, 0] == 1
    assert (diag.svm.constraint[rows][:, 5:] == 0).all()


def test_llama_grouped_rotary_head_against_the_model(llama_dir):
    model = _eager(llama_dir)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(3))
    head = 3  # key/value head 1 of 2
    diag = attention_svm_diagnostic(model, ids, 2, head, max_queries=None)  # block 2 = layers[1]
    _, attn = _own_attention(model, ids, 1, head)
    assert diag.causal and diag.rotary and diag.family == "llama" and not diag.include_bias
    qi = diag.query_index
    assert torch.equal(diag.selected, attn.argmax(-1)[qi[:, 0], qi[:, 1]])
    assert torch.allclose(diag.max_probs, attn.max(-1).values[qi[:, 0], qi[:, 1]], atol=1e-5)
    attn_mod = model.model.layers[1].self_attn
    Wq = attn_mod.q_proj.weight[3 * 8 : 4 * 8].double()
    Wk = attn_mod.k_proj.weight[1 * 8 : 2 * 8].double()  # shared by query heads 2 and 3
    assert torch.allclose(diag.W_head, Wk.T @ Wq / math.sqrt(8))
    logp = attn.log()
    for j, (b, q) in enumerate(qi.tolist()):
        a = int(diag.selected[j])
        gaps = [float(logp[b, q, a] - logp[b, q, t]) for t in range(q + 1) if t != a]
        assert diag.head_margins[j].item() * float(diag.W_head.norm()) == pytest.approx(min(gaps), rel=1e-4, abs=1e-5)
    assert diag.svm.feasible and diag.svm.duality_gap < 1e-8
    assert diag.summary()["rotary"] is True


def test_causal_diagnostic_rejects_cls_queries(gpt2_dir):
    model = _eager(gpt2_dir)
    ids = torch.randint(0, 64, (1, 6))
    with pytest.raises(ValueError, match="queries"):
        attention_svm_diagnostic(model, ids, 1, 0, queries="cls")
