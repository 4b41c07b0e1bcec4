"""The KL bound's formula (hf_tdiag.measures.concepts.bound) against hand-worked numbers, in float64, with every
bad constant named: the mutation run found these checks missing (issue 22)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hf_tdiag.measures.concepts.bound import kl_bound, kl_bound_chain, kl_divergence


def test_kl_divergence_by_hand_on_one_row_and_on_a_batch():
    # σ(0, 0) = (1/2, 1/2), σ(0, log 3) = (1/4, 3/4): KL = ½ log 2 + ½ log(2/3)
    expected = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    one = kl_divergence(torch.tensor([0.0, 0.0]), torch.tensor([0.0, math.log(3)]))
    assert one.shape == () and one.dtype == torch.float64
    assert float(one) == pytest.approx(expected, abs=1e-7)
    # a batch of rows of three classes: each row's KL computed naively with numpy
    rng = np.random.default_rng(0)
    p, q = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    sp = np.exp(p) / np.exp(p).sum(1, keepdims=True)
    sq = np.exp(q) / np.exp(q).sum(1, keepdims=True)
    naive = (sp * np.log(sp / sq)).sum(1)
    got = kl_divergence(torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32))
    assert got.shape == (4,) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), naive, rtol=1e-6)


def _naive_bound(w, lb, ls, n, d_rec, alpha, g, d_gram, lr=1.0):
    return 0.5 * (w * lr) ** 2 * lb ** (2 * ls) * (math.sqrt(n) * d_rec + alpha * g * d_gram) ** 2


def test_kl_bound_by_hand_with_the_default_readout_and_one_token():
    out = kl_bound(2.0, 1.5, 2, 1, 0.3, 0.5, 4.0, 0.1)
    # ½·2²·1.5⁴·(1·0.3 + 0.5·4·0.1)² = 2·5.0625·0.25 = 2.53125
    assert float(out["bound"]) == pytest.approx(2.53125, rel=1e-12)
    assert float(out["rec_term"]) == pytest.approx(0.3) and float(out["gram_term"]) == pytest.approx(0.2)
    assert float(out["constant"]) == pytest.approx(2 * 5.0625)
    assert float(out["bound_rec_only"]) == pytest.approx(10.125 * 0.09)
    assert float(out["bound_gram_only"]) == pytest.approx(10.125 * 0.04)
    with_readout = kl_bound(2.0, 1.5, 2, 1, 0.3, 0.5, 4.0, 0.1, l_readout=3.0)
    assert float(with_readout["bound"]) == pytest.approx(9 * 2.53125, rel=1e-12)


def test_kl_bound_is_computed_in_float64_for_float32_per_input_values():
    d_rec = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float32)
    g = torch.tensor([3.0, 4.0, 5.0], dtype=torch.float32)
    d_gram = torch.tensor([0.01, 0.02, 0.03], dtype=torch.float32)
    out = kl_bound(1.1, 1.01, 3, 197, d_rec, 0.7, g, d_gram)
    for key in ("bound", "rec_term", "gram_term", "bound_rec_only", "bound_gram_only"):
        assert out[key].dtype == torch.float64, key
    naive = [
        _naive_bound(1.1, 1.01, 3, 197, float(a), 0.7, float(b), float(c))
        for a, b, c in zip(d_rec.double(), g.double(), d_gram.double(), strict=True)
    ]
    np.testing.assert_allclose(out["bound"].numpy(), naive, rtol=1e-13)


def test_kl_bound_chain_by_hand():
    assert float(kl_bound_chain(2.0, 0.5)) == pytest.approx(0.5)  # ½ (2·0.5)²
    chain = kl_bound_chain(torch.tensor([1.0, 3.0]), 2.0)
    assert chain.dtype == torch.float64 and chain.tolist() == pytest.approx([2.0, 18.0])


GOOD = dict(
    w_c_op=1.0, l_block=1.0, n_suffix_blocks=1, n_tokens=4, delta_rec=0.1, alpha=1.0, gram_norm=1.0, delta_gram=0.1
)


@pytest.mark.parametrize("name", ["w_c_op", "l_block", "alpha", "l_readout"])
@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_kl_bound_names_a_bad_constant(name, bad):
    with pytest.raises(ValueError, match=rf"^{name}: expected finite non-negative"):
        kl_bound(**{**GOOD, name: bad})


def test_kl_bound_token_count_and_suffix_length_are_checked():
    with pytest.raises(ValueError, match=r"^n_tokens: expected >= 1, got 0"):
        kl_bound(**{**GOOD, "n_tokens": 0})
    with pytest.raises(ValueError, match=r"^n_suffix_blocks: expected >= 0, got -1"):
        kl_bound(**{**GOOD, "n_suffix_blocks": -1})
    kl_bound(**{**GOOD, "n_suffix_blocks": 0})  # the last layer: no suffix block


@pytest.mark.parametrize(
    "args, named", [((-1.0, 1.0), "w_c_op"), ((1.0, -1.0), "head_input_deviation"), ((float("nan"), 1.0), "w_c_op")]
)
def test_kl_bound_chain_names_a_bad_constant(args, named):
    with pytest.raises(ValueError, match=rf"^{named}: expected finite non-negative"):
        kl_bound_chain(*args)


@pytest.mark.parametrize("which", ["logits_p", "logits_q"])
def test_kl_divergence_names_bad_logits(which):
    good = torch.zeros(2, 3)
    bad = torch.tensor([[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]])
    args = {"logits_p": good, "logits_q": good, which: bad}
    with pytest.raises(ValueError, match=rf"\b{which}\b"):
        kl_divergence(**args)
