"""Causal and sequence-to-sequence Att-SVM against a naive cvxpy formulation (constraints over prefixes only)."""

import math

import numpy as np
import pytest
import torch

cp = pytest.importorskip("cvxpy")

from hf_tdiag.measures.attention_svm import att_svm, att_svm_self  # noqa: E402

# the reference is solved to 1e-10 (Clarabel may flag such tight runs "inaccurate"; the asserts decide)
pytestmark = pytest.mark.filterwarnings("ignore:Solution may be inaccurate")
TIGHT = dict(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)


def _cvx_seq(X, Q, sel, causal, query_pos=None):
    """min ‖W‖_F over the constraints (x_sel − x_t)ᵀ W q ≥ 1 of every query, written one token at a time."""
    X, Q = X.numpy(), Q.numpy()
    B, T, d = X.shape
    W = cp.Variable((d, Q.shape[2]))
    rows = []
    for b in range(B):
        for k in range(Q.shape[1]):
            if query_pos is not None and (b, k) not in query_pos:
                continue
            a = int(sel[b, k])
            visible = range(k + 1) if causal else range(T)
            rows += [(X[b, a] - X[b, t]) @ W @ Q[b, k] for t in visible if t != a]
    prob = cp.Problem(cp.Minimize(cp.norm(W, "fro")), [cp.hstack(rows) >= 1])
    prob.solve(**TIGHT)
    return prob.value, W.value


def _causal_selection(B, T, g):
    """A random selection per query position k among its prefix 0..k."""
    return torch.stack([torch.randint(0, k + 1, (B,), generator=g) for k in range(T)], dim=1)


@pytest.mark.parametrize("B,T,d,seed", [(2, 5, 6, 0), (3, 4, 5, 1), (1, 7, 8, 2)])
def test_causal_self_attention_matches_cvxpy_over_prefixes(B, T, d, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(B, T, d, generator=g, dtype=torch.float64)
    sel = _causal_selection(B, T, g)
    res = att_svm_self(X, sel, causal=True)
    value, _ = _cvx_seq(X, X, sel, causal=True)
    assert res.feasible
    assert res.objective == pytest.approx(value, rel=1e-8)
    # position 0 sees only itself and is left out; every other query has constraints exactly over t <= q, t != sel
    assert sorted(map(tuple, res.query_index.tolist())) == [(b, q) for b in range(B) for q in range(1, T)]
    for (b, q), kind in zip(res.query_index.tolist(), res.constraint.tolist()):
        expected = [1 if (t <= q and t != int(sel[b, q])) else 0 for t in range(T)]
        assert kind == expected
    ineq = res.constraint == 1
    assert torch.isnan(res.margins[res.constraint == 0]).all()
    assert float(res.margins[ineq].min()) == pytest.approx(1.0, abs=1e-9)
    # the margins are those of the returned W on the visible tokens, recomputed by hand
    for j, (b, q) in enumerate(res.query_index.tolist()):
        for t in range(q + 1):
            if t != int(sel[b, q]):
                m = float((X[b, sel[b, q]] - X[b, t]) @ res.W @ X[b, q])
                assert res.margins[j, t].item() == pytest.approx(m, abs=1e-9)


def test_causal_is_a_different_problem_from_the_full_one():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(2, 6, 7, generator=g, dtype=torch.float64)
    sel = _causal_selection(2, 6, g)
    causal = att_svm_self(X, sel, causal=True)
    full = att_svm_self(X, sel, query_mask=torch.ones(2, 6, dtype=torch.bool).index_fill(1, torch.tensor([0]), False))
    # future tokens add constraints: the full problem's norm is strictly larger
    assert full.objective > causal.objective * (1 + 1e-3)
    value_full, _ = _cvx_seq(X, X, sel, causal=False, query_pos={(b, k) for b in range(2) for k in range(1, 6)})
    assert full.objective == pytest.approx(value_full, rel=1e-8)


def test_sequence_to_sequence_cross_queries_match_cvxpy():
    g = torch.Generator().manual_seed(4)
    B, T, K, d, dz = 2, 6, 4, 5, 3
    X = torch.randn(B, T, d, generator=g, dtype=torch.float64)
    Z = torch.randn(B, K, dz, generator=g, dtype=torch.float64)
    sel = torch.randint(0, T, (B, K), generator=g)
    res = att_svm(X, Z, sel)
    value, _ = _cvx_seq(X, Z, sel, causal=False)
    assert res.W.shape == (d, dz)
    assert res.objective == pytest.approx(value, rel=1e-8)
    assert res.query_index.shape == (B * K, 2)
    # causal sequence-to-sequence: query k compares only tokens 0..k
    sel_c = _causal_selection(B, K, g)
    res_c = att_svm(X, Z, sel_c, causal=True)
    value_c, _ = _cvx_seq(X, Z, sel_c, causal=True, query_pos={(b, k) for b in range(B) for k in range(1, K)})
    assert res_c.objective == pytest.approx(value_c, rel=1e-8)
    assert ((res_c.constraint == 1).sum(1) == res_c.query_index[:, 1]).all()  # k visible competitors at position k


def test_causal_bad_inputs_name_the_argument():
    X = torch.randn(2, 4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="causal"):
        att_svm(X, torch.randn(2, 3, dtype=torch.float64), torch.zeros(2, dtype=torch.long), causal=True)
    future = torch.tensor([[0, 2, 2, 3], [0, 0, 1, 2]])  # query 1 of sequence 0 selects token 2 > 1
    with pytest.raises(ValueError, match="cannot see"):
        att_svm_self(X, future, causal=True)
    with pytest.raises(ValueError, match="at most T"):
        att_svm(X, torch.randn(2, 5, 3, dtype=torch.float64), torch.zeros(2, 5, dtype=torch.long), causal=True)
    with pytest.raises(ValueError, match="selected"):
        att_svm(X, torch.randn(2, 4, 3, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.long))
    assert math.isfinite(att_svm_self(X, torch.tensor([[0, 1, 2, 3], [0, 0, 1, 2]]), causal=True).objective)


def test_single_causal_prefix_equals_the_plain_svm_on_that_prefix():
    """Query q of a causal problem alone is the ordinary Att-SVM on tokens 0..q (hand reduction)."""
    g = torch.Generator().manual_seed(5)
    X = torch.randn(1, 6, 4, generator=g, dtype=torch.float64)
    sel = torch.tensor([[0, 1, 0, 2, 1, 3]])
    qm = torch.zeros(1, 6, dtype=torch.bool)
    qm[0, 3] = True
    res = att_svm_self(X, sel, causal=True, query_mask=qm)
    plain = att_svm(X[:, :4], X[:, 3], torch.tensor([2]))
    assert res.objective == pytest.approx(plain.objective, rel=1e-10)
    assert np.allclose(res.W.numpy(), plain.W.numpy(), atol=1e-10)
