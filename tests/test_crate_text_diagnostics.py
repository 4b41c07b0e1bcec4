"""Attention-SVM and Schatten proxies on text CRATE models, against quantities computed here from the model's own
tensors: the causal head's selections and probabilities against the model's own attention maps, the head matrix
against U_kᵀU_k/√p, the SVM's constraints over each query's prefix, and each analysed matrix's spectral norm
against torch.linalg on the weights."""

import pytest
import torch
import torch.nn.functional as F

import hf_tdiag
from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM, CrateTextForMaskedLM

D_MODEL, HEADS, P = 16, 2, 8


def _model(causal=True, block="crate"):
    preset = "crate-gpt-12l" if causal else "crate-bert-base"
    config = CrateTextConfig.from_preset(
        preset, block=block, vocab_size=40, hidden_size=D_MODEL, num_hidden_layers=2, num_attention_heads=HEADS,
        max_position_embeddings=16, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = (CrateTextForCausalLM if causal else CrateTextForMaskedLM)(config).eval()
    with torch.no_grad():
        for layer in model.crate.layer:
            layer.attention.qkv.weight.mul_(6.0)  # peaked attention, so most queries select one token
    return model


def _batch():
    ids = torch.randint(1, 40, (2, 10), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_attention_svm_on_a_causal_text_crate_head():
    model, batch = _model(), _batch()
    layer, head = 2, 1
    report = hf_tdiag.attention_svm_diagnostic(model, batch, layer, head, max_queries=None)
    assert report.causal and report.family == "crate_text"
    with torch.no_grad():
        out = model.crate(**batch, output_hidden_states=True, output_attentions=True)
    block = model.crate.layer[layer - 1]
    U = block.attention.qkv.weight.detach().double()[head * P : (head + 1) * P]  # U_kᵀ (p, d)
    assert torch.allclose(report.W_head.double(), U.T @ U / P**0.5, atol=1e-10)
    probs = out.attentions[layer - 1][:, head].double()  # the model's own (B, N, N) maps
    seqs, positions = report.query_index[:, 0], report.query_index[:, 1]
    assert bool((batch["attention_mask"][seqs, positions] == 1).all()) and bool((positions > 0).all())
    assert len(positions) == int(batch["attention_mask"].sum()) - 2  # every real token but position 0
    assert torch.equal(report.selected, probs[seqs, positions].argmax(-1))
    assert torch.allclose(report.max_probs.double(), probs[seqs, positions].max(-1).values, atol=1e-6)
    assert bool((report.selected <= positions).all())  # a causal head never selects a future token
    # the SVM solution separates each query's selection from every other token of its prefix by a margin >= 1
    ln = block.layernorm_before
    X = F.layer_norm(out.hidden_states[layer - 1], (D_MODEL,), ln.weight, ln.bias, ln.eps).double()
    W = report.svm.W.double()
    for s, q, a in zip(seqs.tolist(), positions.tolist(), report.selected.tolist()):
        gaps = [(X[s, a] - X[s, t]) @ W @ X[s, q] for t in range(q + 1) if t != a]
        assert min(gaps) >= 1 - 1e-4


@pytest.mark.parametrize("causal", [True, False])
def test_schatten_matrices_of_a_square_block_text_crate(causal):
    model = _model(causal)
    report = hf_tdiag.schatten_bounds(model)
    by_key = {(m.layer, m.head, m.type): m for m in report.matrices}
    for i, layer in enumerate(model.crate.layer, start=1):
        W = layer.attention.qkv.weight.detach().double()
        O = layer.attention.out_proj.weight.detach().double()
        for h in range(HEADS):
            Uh = W[h * P : (h + 1) * P]
            qk = torch.linalg.matrix_norm(Uh.T @ Uh, ord=2)  # W_Q,hᵀ W_K,h with W_Q = W_K = U_kᵀ
            v = torch.linalg.matrix_norm(Uh.T @ O[:, h * P : (h + 1) * P].T, ord=2)
            assert by_key[(i, h, "qk")].spectral_norm == pytest.approx(float(qk), rel=1e-9)
            assert by_key[(i, h, "v")].spectral_norm == pytest.approx(float(v), rel=1e-9)
        D = layer.ista.weight.detach().double()
        assert by_key[(i, None, "ista")].spectral_norm == pytest.approx(float(torch.linalg.matrix_norm(D, ord=2)))
    assert report.schatten_bound > 0 and report.edelman_bound > 0


def test_schatten_reads_crate_lm_block_as_a_tied_two_matrix_ffn():
    """CRATE-LM's block x ↦ D z₁(Dᵀx): M_in = D (the map x ↦ Dᵀx, weight Dᵀ) and M_out = Dᵀ (the decoding z ↦ Dz),
    both the one ISTA parameter; their spectra are D's."""
    from hf_tdiag.probes.describe import describe

    model = _model(causal=True, block="crate-lm")
    for h, layer in zip(describe(model).layers, model.crate.layer):
        assert h.ista is None and h.ffn_in is layer.ista
        assert h.ffn_out.weight.data_ptr() == layer.ista.weight.data_ptr()  # a view, no copy
        assert h.ffn_out.weight.shape == (D_MODEL, 4 * D_MODEL) and not list(h.ffn_out.parameters())
    report = hf_tdiag.schatten_bounds(model)
    by_key = {(m.layer, m.head, m.type): m for m in report.matrices}
    for i, layer in enumerate(model.crate.layer, start=1):
        sigma = torch.linalg.svdvals(layer.ista.weight.detach().double())
        for kind, shape in (("m_in", (D_MODEL, 4 * D_MODEL)), ("m_out", (4 * D_MODEL, D_MODEL))):
            m = by_key[(i, None, kind)]
            assert tuple(m.shape) == shape
            assert m.spectral_norm == pytest.approx(float(sigma[0]), rel=1e-9)
            assert m.frobenius_norm == pytest.approx(float(sigma.norm()), rel=1e-9)
    assert sum(1 for m in report.matrices if m.type == "ista") == 0
