"""The trained-head Att-SVM diagnostic on small CRATE, ViT and BERT models built from configs."""

import math

import pytest
import torch

pytest.importorskip("cvxpy")

from transformers import BertConfig, BertModel, ViTConfig, ViTModel  # noqa: E402

from hf_tdiag.diagnostics.attention_svm import attention_svm_diagnostic  # noqa: E402
from hf_tdiag.measures.attention_svm import att_svm  # noqa: E402


def _vit(**kw):
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        attn_implementation="eager",
        **kw,
    )
    torch.manual_seed(0)
    return ViTModel(cfg).eval()


def _bert():
    cfg = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = BertModel(cfg).eval()
    with torch.no_grad():  # non-zero query bias so the bias-augmented path is exercised
        model.encoder.layer[0].attention.self.query.bias.normal_(0, 0.5)
    return model


def test_vit_selection_input_and_head_matrix():
    model = _vit()
    x = torch.randn(2, 3, 32, 32)
    diag = attention_svm_diagnostic(model, x, 2, 2, max_queries=12)  # block 2 = model.layers[1]
    # independent: the block's LayerNorm output and the model's own attention probabilities
    out = model(pixel_values=x, output_attentions=True, output_hidden_states=True)
    block = model.layers[1]
    ln = block.layernorm_before(out.hidden_states[1]).double()
    attn = out.attentions[1][:, 2].double()  # (B, N, N)
    qi = diag.query_index
    assert torch.equal(diag.selected, attn.argmax(-1)[qi[:, 0], qi[:, 1]])
    assert torch.allclose(diag.max_probs, attn.max(-1).values[qi[:, 0], qi[:, 1]], atol=1e-5)
    p = 12
    Wq = block.attention.q_proj.weight[2 * p : 3 * p].double()
    Wk = block.attention.k_proj.weight[2 * p : 3 * p].double()
    assert torch.allclose(diag.W_head[:, :48], Wk.T @ Wq / math.sqrt(p))
    # the SVM was solved on exactly these tokens: recompute W_mm from scratch with the general solver
    ref = att_svm(
        ln[qi[:, 0]],
        (torch.cat([ln, torch.ones(2, ln.shape[1], 1, dtype=ln.dtype)], 2) if diag.include_bias else ln)[
            qi[:, 0], qi[:, 1]
        ],
        diag.selected,
    )
    assert diag.svm.objective == pytest.approx(ref.objective, rel=1e-6)
    assert diag.svm.duality_gap < 1e-8
    assert 0 < diag.margin_ratio <= 1 + 1e-9
    assert (diag.head_margins >= 0).all()
    assert diag.one_hot_fraction == pytest.approx(float((diag.max_probs >= 0.9).double().mean()))


def test_head_set_to_its_own_max_margin_solution_scores_one():
    model = _vit()
    x = torch.randn(2, 3, 32, 32)
    layer, head, p = 1, 1, 12
    first = attention_svm_diagnostic(model, x, layer + 1, head, max_queries=10, include_bias=False)
    assert first.svm.feasible and first.correlation < 0.9
    W_mm = first.svm.W  # rank ≤ 10 queries ≤ head_dim 12: write it as W_Kᵀ W_Q / √p
    U, s, Vh = torch.linalg.svd(W_mm)
    r = p
    scale = 50.0 * math.sqrt(p)
    Kt = U[:, :r] * (s[:r] * scale).sqrt()
    Qt = Vh[:r].T * (s[:r] * scale).sqrt()
    attn = model.layers[layer].attention
    with torch.no_grad():
        attn.k_proj.weight[head * p : (head + 1) * p] = Kt.T.float()
        attn.q_proj.weight[head * p : (head + 1) * p] = Qt.T.float()
        attn.q_proj.bias.zero_()
        attn.k_proj.bias.zero_()
    second = attention_svm_diagnostic(model, x, layer + 1, head, max_queries=10, include_bias=False)
    assert torch.equal(second.query_index, first.query_index)
    assert torch.equal(second.selected, first.selected)
    assert second.correlation == pytest.approx(1.0, abs=1e-5)
    assert second.margin_ratio == pytest.approx(1.0, abs=1e-4)
    assert second.one_hot_fraction == 1.0  # margins ≥ 50 in logits


def test_bert_padding_and_query_bias():
    model = _bert()
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    am = torch.ones(2, 9, dtype=torch.long)
    am[1, 6:] = 0
    diag = attention_svm_diagnostic(model, {"input_ids": ids, "attention_mask": am}, 1, 1, max_queries=None)
    assert diag.family == "bert" and diag.include_bias
    assert diag.W_head.shape == (32, 33)
    # every real token is a query, padded ones are not; padded tokens carry no constraint
    assert diag.query_index.shape[0] == 9 + 6
    rows = diag.query_index[:, 0] == 1
    assert torch.isnan(diag.svm.margins[rows][:, 6:]).all()
    assert diag.svm.num_constraints == 9 * 8 + 6 * 5
    # selections agree with the model's own (masked) attention; post-norm BERT: the head input is the block input
    out = model(input_ids=ids, attention_mask=am, output_attentions=True)
    attn = out.attentions[0][:, 1]
    qi = diag.query_index
    assert torch.equal(diag.selected, attn.argmax(-1)[qi[:, 0], qi[:, 1]])


def test_crate_head_matrix_is_u_ut():
    crate = pytest.importorskip("hf_tdiag.models.crate")
    cfg = crate.CrateConfig(
        image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_labels=3
    )
    torch.manual_seed(0)
    model = crate.CrateForImageClassification(cfg).eval()
    x = torch.randn(2, 3, 16, 16)
    diag = attention_svm_diagnostic(model, x, 2, 3, max_queries=16)  # block 2 = encoder.layer[1]
    assert diag.family == "crate" and not diag.include_bias
    U = model.crate.encoder.layer[1].attention.qkv.weight[3 * 8 : 4 * 8].T.double()
    assert torch.allclose(diag.W_head, U @ U.T / math.sqrt(8))
    out = model(pixel_values=x, output_attentions=True)
    attn = out.attentions[1][:, 3].double()
    qi = diag.query_index
    assert torch.equal(diag.selected, attn.argmax(-1)[qi[:, 0], qi[:, 1]])
    assert diag.svm.feasible and diag.svm.duality_gap < 1e-8
    assert 0 < diag.margin_ratio <= 1 + 1e-9


def test_cls_queries_and_bad_arguments():
    model = _vit()
    x = torch.randn(3, 3, 32, 32)
    diag = attention_svm_diagnostic(model, x, 1, 0, queries="cls")
    assert diag.query_index[:, 1].tolist() == [0, 0, 0]
    L = len(model.layers)
    with pytest.raises(ValueError, match=rf"^layer: expected a block number 1..{L}, got {L + 1}$"):
        attention_svm_diagnostic(model, x, L + 1, 0)
    with pytest.raises(
        ValueError, match=rf"^layer: expected a block number 1..{L}, got 0$"
    ):  # blocks are numbered 1..L
        attention_svm_diagnostic(model, x, 0, 0)
    with pytest.raises(ValueError, match="head"):
        attention_svm_diagnostic(model, x, 1, 4)
    with pytest.raises(ValueError, match="queries"):
        attention_svm_diagnostic(model, x, 1, 0, queries="middle")
    with pytest.raises(ValueError, match="one_hot_threshold"):
        attention_svm_diagnostic(model, x, 1, 0, one_hot_threshold=0.0)
    with pytest.raises(ValueError, match="model: 'not a model' is not an existing folder and not a valid Hub id"):
        attention_svm_diagnostic("not a model", x, 1, 0)  # a string is a model path
    with pytest.raises(TypeError, match="model"):
        attention_svm_diagnostic(3, x, 1, 0)
    s = diag.to_dict()
    assert len(s["head_margins"]) == 3 and s["svm"]["feasible"]
