"""The diagnostics on CRATE-α, CRATE-MAE's encoder and ToST, against independent computations.

* Schatten proxies: CRATE-α's matrices formed from its state dict by parameter name (QK_h = U_h U_hᵀ, Ṽ_h,
  M_in = D, M_out = D₁ᵀ) and run through the dense reference of ``test_schatten_reference``; ToST is refused.
* Attention-as-SVM: the head's recomputed attention equals the model's own eager attention probabilities, its
  matrix is ``U_k U_kᵀ/√p`` from the ``qkv`` weight, and ``W_mm`` satisfies the constraints on the head's input
  ``LN₁(Z^{ℓ−1})`` computed here from the hidden states; ToST is refused.
* Concept fidelity: the readout and head reproduce the model's logits from its last hidden state; the CRATE-α
  sparse-coding Lipschitz constant equals the formula from dense norms and bounds realised ratios; ToST is refused.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_schatten_reference import dense_reference_from_matrices

import hf_tdiag
from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification
from hf_tdiag.models.crate_mae import CrateMAEConfig, CrateMAEForImageClassification
from hf_tdiag.models.tost import TostConfig, TostForImageClassification


def _alpha(seed=0, **overrides):
    torch.manual_seed(seed)
    config = CrateAlphaConfig.from_preset("crate-alpha-digits", num_labels=10, **overrides)
    return CrateAlphaForImageClassification(config).eval()


def _mae(seed=0):
    torch.manual_seed(seed)
    return CrateMAEForImageClassification(CrateMAEConfig.from_preset("crate-mae-digits", num_labels=10)).eval()


def _tost(seed=0):
    torch.manual_seed(seed)
    return TostForImageClassification(TostConfig.from_preset("tost-digits", num_labels=10)).eval()


def _images(n=4, seed=1):
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- Schatten proxies


def _alpha_matrices(model, num_heads):
    """Row-vector matrices of every block from the state dict, by CRATE-α's parameter names (float64 numpy)."""
    sd = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    layers, i = [], 0
    while f"crate_alpha.encoder.layer.{i}.attention.qkv.weight" in sd:
        pre = f"crate_alpha.encoder.layer.{i}."
        U, W_o = sd[pre + "attention.qkv.weight"], sd[pre + "attention.out_proj.weight"]
        p = U.shape[0] // num_heads
        rows = [slice(h * p, (h + 1) * p) for h in range(num_heads)]
        layers.append(
            {
                "qk": [U[r].T @ U[r] for r in rows],  # W_Q,hᵀ W_K,h with W_Q = W_K = U
                "v": [U[r].T @ W_o.T[r] for r in rows],  # W_V,hᵀ (W_O)ᵀ[rows of h]
                "m_in": sd[pre + "sparse_coding.D"],  # x ↦ x D  (d × 4d)
                "m_out": sd[pre + "sparse_coding.D1"].T,  # a ↦ a D₁ᵀ  (4d × d)
            }
        )
        i += 1
    return layers


def test_crate_alpha_schatten_matches_dense_reference():
    model = _alpha()
    with torch.no_grad():  # a rank-deficient dictionary and a zero head: the thresholds must agree too
        model.crate_alpha.encoder.layer[1].sparse_coding.D[:10] = 0.0  # rank 54
        model.crate_alpha.encoder.layer[2].attention.qkv.weight[:16] = 0.0
    rep = hf_tdiag.schatten_bounds(model)
    ref = dense_reference_from_matrices(_alpha_matrices(model, 4))
    assert rep.family == "crate-alpha" and rep.intermediate_size == 256
    assert [m.type for m in rep.matrices[:10]] == ["qk"] * 4 + ["v"] * 4 + ["ista_d", "ista_d1"]
    assert {m.type: m.shape for m in rep.matrices} == {"qk": (64, 64), "v": (64, 64), "ista_d": (64, 256),
                                                       "ista_d1": (256, 64)}  # fmt: skip
    assert rep.schatten_bound == pytest.approx(ref["ours"], rel=1e-9)
    assert rep.edelman_bound == pytest.approx(ref["edelman"], rel=1e-9)
    np.testing.assert_allclose([m.min_contribution for m in rep.matrices], ref["mins"], rtol=1e-9)
    np.testing.assert_allclose([m.rank for m in rep.matrices], ref["rank"])
    np.testing.assert_allclose(rep.alpha, ref["alpha"], rtol=1e-9)
    assert rep.by_type("ista_d")[1].rank == 54 and rep.by_type("ista_d")[0].rank == 64
    assert rep.by_type("qk")[8].rank == 0 and rep.by_type("v")[8].rank == 0  # layer 3, head 0
    frame = rep.to_pandas()
    assert set(frame["type"]) == {"qk", "v", "ista_d", "ista_d1"}


def test_schatten_bounds_refuses_tost_and_says_why():
    with pytest.raises(ValueError, match="TSSA.*not softmax attention"):
        hf_tdiag.schatten_bounds(_tost())


# ----------------------------------------------------------------------------- attention as SVM


def _check_head(model, encoder_layers, layer, head, x):
    """The diagnostic's attention, head matrix and SVM constraints against the model's own computation."""
    diag = hf_tdiag.attention_svm_diagnostic(model, x, layer, head, max_queries=24)
    with torch.no_grad():
        out = model(pixel_values=x, output_hidden_states=True, output_attentions=True)
    block = encoder_layers[layer - 1]
    probs = out.attentions[layer - 1][:, head].double()  # (B, N, N), the model's eager path
    qi = diag.query_index
    own = probs[qi[:, 0], qi[:, 1]]
    torch.testing.assert_close(diag.max_probs.double(), own.max(-1).values, rtol=1e-5, atol=1e-6)
    assert torch.equal(diag.selected, own.argmax(-1))
    p = block.attention.head_dim
    U = block.attention.qkv.weight.detach().double()[head * p : (head + 1) * p]  # U_kᵀ (p, d)
    torch.testing.assert_close(diag.W_head.double(), U.T @ U / math.sqrt(p), rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        X = block.layernorm_before(out.hidden_states[layer - 1]).double()  # the head's input tokens
    W = diag.svm.W.double()
    for (b, q), alpha in zip(qi.tolist(), diag.selected.tolist()):
        gaps = (X[b, alpha] - X[b]) @ W @ X[b, q]  # (x_α − x_t)ᵀ W x_q
        others = torch.arange(X.shape[1]) != alpha
        assert float(gaps[others].min()) >= 1 - 1e-5
    corr = float((diag.W_head.double() * W).sum() / (diag.W_head.double().norm() * W.norm()))
    assert diag.summary()["correlation"] == pytest.approx(corr, rel=1e-9)
    return diag


def test_attention_svm_on_crate_alpha_and_crate_mae_encoder():
    x = _images(2)
    alpha = _alpha()
    d1 = _check_head(alpha, alpha.crate_alpha.encoder.layer, 4, 1, x)
    assert d1.family == "crate-alpha"
    mae = _mae()
    d2 = _check_head(mae, mae.crate_mae.encoder, 2, 0, x)
    assert d2.family == "crate-mae"


def test_attention_svm_refuses_tost_and_says_why():
    with pytest.raises(ValueError, match="TSSA.*no softmax attention"):
        hf_tdiag.attention_svm_diagnostic(_tost(), _images(2), 1, 0)


# ----------------------------------------------------------------------------- concept fidelity


@pytest.mark.parametrize("make", [_alpha, _mae], ids=["crate-alpha", "crate-mae"])
def test_concept_readout_reproduces_the_logits(make):
    from hf_tdiag.probes.concept_model import concept_model_parts

    model = make()
    cm = concept_model_parts(model)
    x = _images(3)
    with torch.no_grad():
        out = model(pixel_values=x, output_hidden_states=True)
        logits = cm.head(cm.readout(out.hidden_states[-1]))
    assert len(out.hidden_states) == cm.num_layers + 1 and cm.num_prefix == 1 and cm.num_patches == 16
    torch.testing.assert_close(logits, out.logits, rtol=1e-5, atol=1e-6)
    assert cm.certified and cm.family == model.config.model_type


def test_sparse_coding_lipschitz_is_the_formula_and_bounds_the_step():
    from hf_tdiag.measures.concepts.certified import sparse_coding_lipschitz

    coder = _alpha().crate_alpha.encoder.layer[0].sparse_coding
    D, D1, eta = coder.D.detach().double(), coder.D1.detach().double(), coder.step_size
    nrm = lambda m: float(np.linalg.norm(m.numpy(), 2))  # noqa: E731
    expected = nrm(D1) * eta * nrm(D) * (1 + nrm(torch.eye(D.shape[1], dtype=torch.float64) - eta * D.T @ D))
    lip = sparse_coding_lipschitz(coder.D, coder.D1, eta)
    assert lip == pytest.approx(expected, rel=1e-10)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 64, generator=g)
    y = x + 1e-2 * torch.randn(64, 64, generator=g)
    with torch.no_grad():
        ratio = (coder(y) - coder(x)).norm(dim=-1) / (y - x).norm(dim=-1)
    assert float(ratio.max()) <= lip


@pytest.mark.parametrize("make", [_alpha, _mae], ids=["crate-alpha", "crate-mae"])
def test_concept_fidelity_runs_and_its_certified_constants_bound_the_realised_ones(make):
    model = make()
    x = _images(6, seed=2)
    rep = hf_tdiag.concept_fidelity(model, x, layer=2, concepts=3, power_iters=4, progress=False, return_tensors=True)
    with torch.no_grad():
        A = model(pixel_values=x, output_hidden_states=True).hidden_states[2][:, 1:]  # patch tokens of layer 2
    A_hat = rep.tensors["A_hat"]
    torch.testing.assert_close(torch.as_tensor(rep["per_image"]["delta_rec"], dtype=torch.float64),
                               (A_hat.double() - A.double()).flatten(1).norm(dim=1), rtol=1e-6, atol=1e-8)  # fmt: skip
    cert, est = rep["constants_certified"], rep["constants_estimated"]
    realized = np.max(np.asarray(est["l_block_realized"]), axis=1)  # per suffix block, max over inputs
    assert len(cert["l_block_per_block"]) == 2
    assert np.all(np.asarray(cert["l_block_per_block"]) >= realized)
    assert rep["frac_kl_below_bound_certified"] == 1.0


def test_concept_fidelity_refuses_tost_and_says_why():
    with pytest.raises(ValueError, match="does not apply to ToST"):
        hf_tdiag.concept_fidelity(_tost(), _images(2), layer=1, concepts=2, progress=False)
