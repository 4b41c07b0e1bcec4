"""The concept bound's formulas that live in hf_tdiag.measures.concepts.alpha / .chain / .lipschitz, each against a
hand-worked example or a naive numpy reference (docs/concept_bound.md §2, §6–§8)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hf_tdiag.measures.concepts import Reconstruction, realized_ratio
from hf_tdiag.measures.concepts.alpha import (
    Norm,
    alpha,
    alpha_postnorm,
    alpha_prenorm,
    gamma_max,
    smallest_token_scale_sq,
    token_scale,
    value_output_gain,
)
from hf_tdiag.measures.concepts.chain import (
    head_input_deviation,
    layernorm_matrix_norm,
    layernorm_readout_certified,
    pooler_readout_certified,
    postnorm_block_certified,
    prenorm_block_certified,
    suffix_gain,
    token_radii,
)

F64 = torch.float64


def test_alpha_by_hand():
    # γ_max²/(2√p s²) ‖X‖ Σ = 4 · 3/(2·2) · 5 / 0.5 = 30
    assert alpha(2.0, 4, 3.0, 5.0, 0.5) == pytest.approx(30.0, rel=1e-15)
    out = alpha(1.0, 1, 2.0, torch.tensor([1.0, 2.0], dtype=F64), torch.tensor([1.0, 4.0], dtype=F64))
    assert out.tolist() == pytest.approx([1.0, 0.5], rel=1e-15)  # 2/2 · x / s²


def test_gamma_max_and_value_output_gain_by_hand():
    assert gamma_max(torch.tensor([0.5, -2.0, 1.0])) == 2.0 and gamma_max(None) == 1.0
    heads = [
        (torch.diag(torch.tensor([2.0, 1.0])), torch.diag(torch.tensor([3.0, 0.5]))),  # 2 · 3
        (torch.tensor([[0.0, 4.0], [0.0, 0.0]]), torch.eye(2)),  # 4 · 1
    ]
    assert value_output_gain(heads) == pytest.approx(10.0, rel=1e-15)
    assert value_output_gain([]) == 0


def test_token_scales_by_hand():
    Z = torch.tensor([[[1.0, -1.0], [3.0, 1.0]]], dtype=F64)  # both tokens: centred (1, -1), ‖·‖ = √2
    assert token_scale(Z, 0.0)[0].tolist() == pytest.approx([1.0, 1.0])  # √(var z) = 1
    assert token_scale(Z, 0.0, centred=False)[0].tolist() == pytest.approx([1.0, math.sqrt(5.0)])  # √(mean z²)
    # min_t (max(m_t − r_t, 0)²/d + ε): token 0 moves √2/2 → (√2/2)²/2 = 0.25; token 1 untouched → 1
    e = torch.tensor([[math.sqrt(2) / 2, 0.0]], dtype=F64)
    assert smallest_token_scale_sq(Z, e, 0.01).tolist() == pytest.approx([0.26], rel=1e-12)
    # a radius beyond the spread leaves only ε
    assert smallest_token_scale_sq(Z, torch.tensor([[5.0, 0.0]], dtype=F64), 0.01).tolist() == pytest.approx([0.01])


def test_alpha_postnorm_by_hand():
    Z = torch.tensor([[[3.0, 0.0], [0.0, 1.0]]], dtype=F64)  # ‖Z‖_op = 3
    e = torch.tensor([[0.3, 0.4]], dtype=F64)  # ‖e‖ = 0.5
    cert, est = alpha_postnorm(Z, e, head_dim=4, gain=2.0)  # 2/(2·2) = 0.5
    assert cert.tolist() == pytest.approx([0.5 * 3.5], rel=1e-12)
    assert est.tolist() == pytest.approx([0.5 * 3.0], rel=1e-12)


def _naive_alpha_prenorm(Z, X, e, gamma, beta, eps, p, gain):
    """§7 written out with numpy, one input at a time."""
    Z, X, e, g = Z.numpy(), X.numpy(), e.numpy(), np.abs(gamma.numpy()).max()
    d, T = Z.shape[-1], Z.shape[-2]
    cert, est = [], []
    for z, x, r in zip(Z, X, e):
        c = z - z.mean(-1, keepdims=True)
        m = np.linalg.norm(c, axis=-1)
        s2_min = (np.maximum(m - r, 0) ** 2 / d + eps).min()
        s2_med = np.median(c.var(-1) + eps) if T % 2 else np.sort(c.var(-1) + eps)[(T - 1) // 2]  # torch's lower median
        lip = g / np.sqrt(np.maximum(m - r, 0) ** 2 / d + eps)
        moved = np.minimum(lip * r, 2 * g * np.sqrt(d))
        x_op = np.linalg.norm(x, 2)
        cap = np.sqrt(T) * (g * np.sqrt(d) + np.linalg.norm(beta.numpy()))
        x_sup = min(x_op + np.linalg.norm(moved), cap)
        cert.append(g**2 * gain / (2 * np.sqrt(p)) * x_sup / s2_min)
        est.append(g**2 * gain / (2 * np.sqrt(p)) * x_op / s2_med)
    return np.array(cert), np.array(est)


@pytest.mark.parametrize("scale", [0.05, 3.0])  # a small radius, and one where ‖X‖_op's cap binds
def test_alpha_prenorm_against_a_naive_reference(scale):
    g = torch.Generator().manual_seed(0)
    Z = torch.randn(3, 5, 4, generator=g, dtype=F64) * 2 + 0.5
    gamma, beta = torch.rand(4, generator=g, dtype=F64) + 0.5, torch.randn(4, generator=g, dtype=F64) * 0.2
    X = torch.nn.functional.layer_norm(Z, (4,), gamma, beta, 1e-5)
    e = torch.rand(3, 5, generator=g, dtype=F64) * scale
    cert, est = alpha_prenorm(Z, X, e, Norm(gamma, beta, 1e-5), head_dim=2, gain=1.7)
    ref_c, ref_e = _naive_alpha_prenorm(Z, X, e, gamma, beta, 1e-5, 2, 1.7)
    np.testing.assert_allclose(cert.numpy(), ref_c, rtol=1e-10)
    np.testing.assert_allclose(est.numpy(), ref_e, rtol=1e-10)
    assert bool((est <= cert * (1 + 1e-12)).all())


def test_token_radii_by_hand():
    A = torch.zeros(1, 2, 2)
    A_hat = torch.tensor([[[3.0, 4.0], [0.0, 1.0]]])
    e = token_radii(A, A_hat, torch.tensor([1, 2]), 3)
    assert e.dtype == F64 and e.tolist() == [[0.0, 5.0, 1.0]]  # CLS untouched, then ‖â_t − a_t‖


# two tokens with centred norm √2 each (d = 2) and ε = 0.75: with every token's radius √2/2 each LayerNorm's
# constant is 1/√((√2/2)²/2 + 0.75) = 1 and its deviation bound min(1 · √2/2, 2√2) = √2/2
Z2 = torch.tensor([[[1.0, -1.0], [2.0, 0.0]]], dtype=F64)
LN = Norm(torch.ones(2, dtype=F64), torch.zeros(2, dtype=F64), 0.75)
E2 = torch.full((1, 2), math.sqrt(2) / 2, dtype=F64)  # ‖e‖₂ = 1
NO_ATTENTION = {  # zero weights: L_attn = 0 and no token moves through the attention
    "W_q": torch.zeros(2, 2, dtype=F64),
    "W_k": torch.zeros(2, 2, dtype=F64),
    "W_v": torch.zeros(2, 2, dtype=F64),
    "W_o": torch.zeros(2, 2, dtype=F64),
    "b_q": None,
    "b_k": None,
    "num_heads": 1,
    "scaling": 0.5**0.5,
}


def test_prenorm_block_by_hand():
    # residual branch with L_f = 2: L = (1 + 0·1)(1 + 2·1) = 3; e' = e + 2·√2/2 = 1.5√2 (under the cap 3·‖e‖ = 3)
    lip, e_out = prenorm_block_certified(E2, Z2, Z2, Z2, LN, LN, NO_ATTENTION, 2.0, residual=True)
    assert lip.tolist() == pytest.approx([3.0], rel=1e-12)
    assert e_out[0].tolist() == pytest.approx([1.5 * math.sqrt(2)] * 2, rel=1e-12)
    # CRATE's ISTA (no residual): L = 1 · 2 · 1 = 2; e' = 2 · √2/2 = √2 (under the cap 2)
    lip, e_out = prenorm_block_certified(E2, Z2, Z2, Z2, LN, LN, NO_ATTENTION, 2.0, residual=False)
    assert lip.tolist() == pytest.approx([2.0], rel=1e-12)
    assert e_out[0].tolist() == pytest.approx([math.sqrt(2)] * 2, rel=1e-12)
    # a branch constant 10: L = 1 + 10 = 11, e' = √2/2 + 10·√2/2 per token
    lip, e_out = prenorm_block_certified(E2, Z2, Z2, Z2, LN, LN, NO_ATTENTION, 10.0, residual=True)
    assert lip.tolist() == pytest.approx([11.0]) and e_out[0].tolist() == pytest.approx([5.5 * math.sqrt(2)] * 2)
    # a radius per input is a Frobenius ball: every token may move that far
    lip_ball, _ = prenorm_block_certified(
        torch.tensor([math.sqrt(2) / 2], dtype=F64), Z2, Z2, Z2, LN, LN, NO_ATTENTION, 2.0, residual=True
    )
    assert lip_ball.tolist() == pytest.approx([3.0], rel=1e-12)


def test_postnorm_block_by_hand():
    # L = L_LN₁(e)(1 + 0) L_LN₂((1 + L_f) e½)(1 + L_f) with L_f = 0: 1 · 1; e' = LN₂'s deviation √2/2
    lip, e_out = postnorm_block_certified(E2, Z2, Z2, Z2, LN, LN, NO_ATTENTION, 0.0)
    assert lip.tolist() == pytest.approx([1.0], rel=1e-12)
    assert e_out[0].tolist() == pytest.approx([math.sqrt(2) / 2] * 2, rel=1e-12)
    # L_f = 1: (1 + 1) e½ = √2 > the centred norm, so L_LN₂ = 1/√0.75 and L = 2/√0.75
    lip, _ = postnorm_block_certified(E2, Z2, Z2, Z2, LN, LN, NO_ATTENTION, 1.0)
    assert lip.tolist() == pytest.approx([2.0 / math.sqrt(0.75)], rel=1e-12)


def test_layernorm_matrix_norm_by_hand():
    # √T (γ_max √d + ‖β‖) = √4 (2·√9 + 5) = 22
    norm = Norm(torch.tensor([1.0, -2.0, 0.5]), torch.tensor([3.0, 4.0, 0.0]), 1e-5)
    assert layernorm_matrix_norm(norm, 4, 9) == pytest.approx(22.0)


def test_pooler_readout_by_hand():
    lip, moved = pooler_readout_certified(torch.diag(torch.tensor([3.0, 1.0])), torch.tensor([0.1, 1.0]))
    assert lip.tolist() == [3.0, 3.0]
    assert moved.tolist() == pytest.approx([0.3, 2 * math.sqrt(2)])  # capped at 2√d: tanh outputs in [-1, 1]


def test_layernorm_readout_by_hand_for_cls_and_mean_pooling():
    Z = torch.tensor([[[1.0, -1.0], [5.0, 5.0], [2.0, 0.0], [0.0, 0.0]]], dtype=F64)
    e = torch.tensor([[math.sqrt(2) / 2, 9.0, 9.0, 9.0]], dtype=F64)
    lip, moved = layernorm_readout_certified(Z, e, "cls", LN)  # the CLS token, its own radius: 1 and √2/2
    assert lip.tolist() == pytest.approx([1.0]) and moved.tolist() == pytest.approx([math.sqrt(2) / 2])
    # mean pooling: pooled (2, 1) has centred norm √2/2, the mean radius 6.93 leaves only ε; factor 1/√4
    lip, moved = layernorm_readout_certified(Z, e, "mean", LN)
    assert lip.tolist() == pytest.approx([0.5 / math.sqrt(0.75)], rel=1e-12)
    assert moved.tolist() == pytest.approx([2 * math.sqrt(2)], rel=1e-12)  # the 2γ√d cap of a LayerNorm


def test_suffix_gain_and_head_input_deviation_by_hand():
    l_blocks = torch.tensor([[2.0, 3.0], [1.0, 0.5]], dtype=F64)
    gain = suffix_gain(l_blocks)
    assert gain.tolist() == [6.0, 0.5]
    assert suffix_gain(torch.ones(2, 0, dtype=F64)).tolist() == [1.0, 1.0]  # no suffix block
    # Δ = min(Δ_readout, L_readout Π L_j δ_rec): min(10, 2·6·0.5 = 6), min(0.1, 1·0.5·4 = 2)
    dev = head_input_deviation(torch.tensor([10.0, 0.1]), torch.tensor([2.0, 1.0]), gain, torch.tensor([0.5, 4.0]))
    assert dev.tolist() == pytest.approx([6.0, 0.1])


def test_realized_ratio_by_hand():
    Z = torch.randn(3, 4, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    Z_hat = Z.clone()
    Z_hat[1] += 0.1
    Z_hat[2, 0] += torch.tensor([3.0, 4.0], dtype=F64)
    # f = 2·x on inputs 1 and 2 (ratio 2); input 0 does not move (ratio 0, not NaN)
    assert realized_ratio(2 * Z_hat, 2 * Z, Z_hat, Z).tolist() == pytest.approx([0.0, 2.0, 2.0], rel=1e-12)


def test_reconstruction_estimator_checks_its_map():
    A = torch.ones(2, 3, 4)
    est = Reconstruction(lambda A: 0.5 * A)
    assert torch.equal(est.inverse_transform(est.transform(A)), 0.5 * A) and est.fit(A) is est
    with pytest.raises(TypeError, match="fn"):
        Reconstruction(torch.ones(2))
    with pytest.raises(ValueError, match=r"fn: expected fn\(A\) to return a tensor of shape \(2, 3, 4\), got \(3, 4\)"):
        Reconstruction(lambda A: A[0]).transform(A)
    with pytest.raises(ValueError, match="got list"):
        Reconstruction(lambda A: [1]).transform(A)


# ----------------------------------------------------------------------- random blocks against §6 composed by hand


def _pieces(seed=0, B=2, T=3, d=4, K=2):
    """Random data states, LayerNorms with γ ≠ 1 and β ≠ 0, and attention weights (nn.Linear layout)."""
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(B, T, d, generator=g, dtype=F64) * 2

    def norm():
        return Norm(torch.rand(d, generator=g, dtype=F64) + 0.5, torch.randn(d, generator=g, dtype=F64) * 0.3, 1e-5)

    attention = {name: torch.randn(K * 2, d, generator=g, dtype=F64) for name in ("W_q", "W_k", "W_v")}
    attention.update(W_o=torch.randn(d, K * 2, generator=g, dtype=F64), b_q=torch.randn(K * 2, generator=g, dtype=F64))
    attention.update(b_k=torch.randn(K * 2, generator=g, dtype=F64), num_heads=K, scaling=0.5**0.5)
    return Z, norm(), norm(), attention


def _ln_out(Z, norm):
    return torch.nn.functional.layer_norm(Z, (Z.shape[-1],), norm.weight, norm.bias, norm.eps)


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("scale", [0.01, 50.0])  # 50: the ‖X‖_F cap of LayerNorm outputs binds in L_attn
def test_prenorm_block_is_section_6_composed_by_hand(residual, scale):
    from hf_tdiag.measures.concepts.certified import (
        attention_deviation,
        attention_lipschitz,
        layernorm_deviation,
        layernorm_lipschitz,
    )

    Z, ln1, ln2, att = _pieces()
    X, Y = _ln_out(Z, ln1), Z + 0.3
    e = torch.rand(2, 3, generator=torch.Generator().manual_seed(5), dtype=F64) * scale
    lip, e_out = prenorm_block_certified(e, Z, X, Y, ln1, ln2, att, 1.7, residual=residual)
    # by hand: L_LN₁(e), e_X; L_attn on ‖e_X‖ with the cap √T (γ_max √d + ‖β‖); e½ = e + Δ_attn; L_LN₂(e½), e_Y
    l1, e_x = layernorm_lipschitz(Z, e, ln1.weight, ln1.eps), layernorm_deviation(Z, e, ln1.weight, ln1.eps)
    cap = math.sqrt(3) * (float(ln1.weight.abs().max()) * 2 + float(ln1.bias.norm()))
    w = {k: v for k, v in att.items() if k != "b_k"}
    l_att = attention_lipschitz(X, e_x.norm(dim=-1), **w, x_norm_cap=cap)
    e_mid = e + attention_deviation(X, e_x, **att)
    l2, e_y = layernorm_lipschitz(Y, e_mid, ln2.weight, ln2.eps), layernorm_deviation(Y, e_mid, ln2.weight, ln2.eps)
    if residual:
        ref_lip, ref_e = (1 + l_att * l1) * (1 + 1.7 * l2), e_mid + 1.7 * e_y
    else:
        ref_lip, ref_e = (1 + l_att * l1) * 1.7 * l2, 1.7 * e_y
    ref_e = torch.minimum(ref_e, (ref_lip * e.norm(dim=-1))[:, None])
    torch.testing.assert_close(lip, ref_lip, rtol=1e-12, atol=0)
    torch.testing.assert_close(e_out, ref_e, rtol=1e-12, atol=0)
    if scale > 1:  # the cap is what bounds L_attn here
        assert bool((attention_lipschitz(X, e_x.norm(dim=-1), **w) > l_att * (1 + 1e-6)).all())


def test_postnorm_block_is_section_6_composed_by_hand_with_its_input_cap():
    from hf_tdiag.measures.concepts.certified import (
        attention_deviation,
        attention_lipschitz,
        layernorm_deviation,
        layernorm_lipschitz,
    )

    Z, ln1, ln2, att = _pieces(seed=1)
    Y1, Y2 = Z + 0.2, Z - 0.1
    e = torch.rand(2, 3, generator=torch.Generator().manual_seed(6), dtype=F64) * 40
    lip, e_out = postnorm_block_certified(e, Z, Y1, Y2, ln1, ln2, att, 0.9, input_cap=3.0)
    w = {k: v for k, v in att.items() if k != "b_k"}
    l_att = attention_lipschitz(Z, e.norm(dim=-1), **w, x_norm_cap=3.0)
    assert bool((attention_lipschitz(Z, e.norm(dim=-1), **w) > l_att * (1 + 1e-6)).all())  # the cap binds
    e_half = e + attention_deviation(Z, e, **att)
    l1, e_mid = (
        layernorm_lipschitz(Y1, e_half, ln1.weight, ln1.eps),
        layernorm_deviation(Y1, e_half, ln1.weight, ln1.eps),
    )
    l2 = layernorm_lipschitz(Y2, 1.9 * e_mid, ln2.weight, ln2.eps)
    ref_e = layernorm_deviation(Y2, 1.9 * e_mid, ln2.weight, ln2.eps)
    ref_lip = l1 * (1 + l_att) * l2 * 1.9
    torch.testing.assert_close(lip, ref_lip, rtol=1e-12, atol=0)
    torch.testing.assert_close(e_out, torch.minimum(ref_e, (ref_lip * e.norm(dim=-1))[:, None]), rtol=1e-12, atol=0)


def test_readouts_and_token_radii_on_batches():
    # token radii of a non-zero A: the difference, not the sum
    A = torch.ones(2, 2, 3)
    A_hat = A.clone()
    A_hat[1, 0] += torch.tensor([0.0, 3.0, 4.0])
    assert token_radii(A, A_hat, torch.tensor([0, 2]), 3).tolist() == [[0.0, 0.0, 0.0], [5.0, 0.0, 0.0]]
    # BERT's pooler: W_p (out 3, in 2): the cap is 2√(out features)
    _, moved = pooler_readout_certified(torch.tensor([[10.0, 0.0], [0.0, 1.0], [0.0, 0.0]]), torch.tensor([1.0]))
    assert moved.tolist() == pytest.approx([2 * math.sqrt(3)])
    # mean pooling on two inputs with γ ≠ 1: each input's pooled token and mean radius, against a naive loop
    g = torch.Generator().manual_seed(2)
    Z = torch.randn(2, 4, 3, generator=g, dtype=F64)
    e = torch.rand(2, 4, generator=g, dtype=F64) * 0.2
    norm = Norm(torch.tensor([0.5, 2.0, 1.0], dtype=F64), None, 1e-3)
    lip, moved = layernorm_readout_certified(Z, e, "mean", norm)
    for i in range(2):
        p = Z[i].mean(0)
        m, r = float((p - p.mean()).norm()), float(e[i].mean())
        L = 2.0 / math.sqrt(max(m - r, 0) ** 2 / 3 + 1e-3)
        assert float(lip[i]) == pytest.approx(L / 2, rel=1e-12)  # the pooling factor 1/√4
        assert float(moved[i]) == pytest.approx(min(L * r, 2 * 2.0 * math.sqrt(3)), rel=1e-12)


def test_a_radius_per_input_is_every_token_moving_that_far():
    Z, ln1, ln2, att = _pieces(seed=3)
    r = torch.tensor([0.05, 0.2], dtype=F64)
    X = _ln_out(Z, ln1)
    ball = prenorm_block_certified(r, Z, X, Z, ln1, ln2, att, 1.2, residual=True)
    tokens = prenorm_block_certified(r[:, None].expand(2, 3), Z, X, Z, ln1, ln2, att, 1.2, residual=True)
    for got, ref in zip(ball, tokens):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
