"""Att-SVM / Gen-SVM solvers against cvxpy and hand-checkable identities."""

import math

import numpy as np
import pytest
import torch

cp = pytest.importorskip("cvxpy")

from hf_tdiag.measures.attention_svm import (  # noqa: E402
    att_svm,
    att_svm_self,
    gen_svm_finite_part,
    matrix_correlation,
)


def _instance(n, T, d, seed, dz=None):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, T, d, generator=g, dtype=torch.float64)
    z = torch.randn(n, dz or d, generator=g, dtype=torch.float64)
    sel = torch.randint(0, T, (n,), generator=g)
    return X, z, sel


def _cvx_features(X, z, sel_mask=None, sel=None, token_mask=None):
    """Constraint rows (inequality, equality) as (δ, z) pairs built naively, one token at a time."""
    X, z = X.numpy(), z.numpy()
    n, T, _ = X.shape
    ineq, eq = [], []
    for i in range(n):
        if sel_mask is None:
            r = int(sel[i])
            others = [t for t in range(T) if t != r and (token_mask is None or token_mask[i, t])]
            for t in others:
                ineq.append((X[i, r] - X[i, t], z[i]))
        else:
            O = [t for t in range(T) if sel_mask[i, t]]
            r = O[0]
            for t in O[1:]:
                eq.append((X[i, r] - X[i, t], z[i]))
            for t in range(T):
                if t not in O:
                    ineq.append((X[i, r] - X[i, t], z[i]))
    return ineq, eq


def _cvx_solve(X, z, norm="fro", **kw):
    ineq, eq = _cvx_features(X, z, **kw)
    d, dz = X.shape[2], z.shape[1]
    W = cp.Variable((d, dz))
    cons = [cp.hstack([a @ W @ b for a, b in ineq]) >= 1]
    if eq:
        cons.append(cp.hstack([a @ W @ b for a, b in eq]) == 0)
    obj = cp.norm(W, "fro") if norm == "fro" else cp.normNuc(W)
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL")
    return prob, W


@pytest.mark.parametrize("n,T,d,seed", [(3, 4, 5, 0), (6, 5, 4, 1), (10, 5, 20, 2), (5, 6, 4, 5), (4, 8, 3, 7)])
def test_frobenius_matches_cvxpy(n, T, d, seed):
    X, z, sel = _instance(n, T, d, seed)
    res = att_svm(X, z, sel)
    prob, W = _cvx_solve(X, z, sel=sel)
    if prob.status == "infeasible":
        assert not res.feasible
        return
    assert res.feasible and res.status == "optimal"
    assert res.objective == pytest.approx(prob.value, rel=1e-6)
    assert matrix_correlation(res.W, torch.as_tensor(W.value)) > 1 - 1e-6
    # constraints, recomputed naively from the returned W
    ineq, _ = _cvx_features(X, z, sel=sel)
    margins = np.array([a @ res.W.numpy() @ b for a, b in ineq])
    assert margins.min() >= 1 - 1e-9
    assert res.duality_gap <= 1e-9
    # KKT: W = Σ λ a with λ ≥ 0 supported on tight constraints, and strong duality Σλ = ‖W‖²
    lam = res.dual.numpy()
    assert (lam >= 0).all()
    Xn, zn = X.numpy(), z.numpy()
    W_from_dual = sum(
        lam[i, t] * np.outer(Xn[i, sel[i]] - Xn[i, t], zn[i]) for i in range(n) for t in range(T) if t != sel[i]
    )
    assert np.allclose(W_from_dual, res.W.numpy(), atol=1e-7 * np.abs(res.W.numpy()).max())
    assert lam.sum() == pytest.approx(res.objective**2, rel=1e-7)
    tight = res.margins.numpy()[lam > 1e-9 * lam.max()]
    assert np.allclose(tight, 1.0, atol=1e-7)


def test_dense_and_factored_kernels_agree(monkeypatch):
    X, z, sel = _instance(12, 30, 8, 3)  # m = 348: dense path
    dense = att_svm(X, z, sel)
    from hf_tdiag.measures.attention_svm import kernel

    monkeypatch.setattr(kernel, "DENSE_LIMIT", 0)  # force the matrix-free path
    monkeypatch.setattr(kernel, "DENSE_FLOPS", 0.0)
    factored = att_svm(X, z, sel)
    assert dense.solver.endswith("dense") and factored.solver.endswith("factored")
    assert factored.objective == pytest.approx(dense.objective, rel=1e-8)
    assert matrix_correlation(dense.W, factored.W) > 1 - 1e-10
    monkeypatch.setattr(kernel, "FACE_FLOPS", 0.0)  # every face system by preconditioned CG, none formed
    iterative = att_svm(X, z, sel)
    assert iterative.objective == pytest.approx(dense.objective, rel=1e-8)
    assert matrix_correlation(dense.W, iterative.W) > 1 - 1e-10


def test_hand_worked_single_query():
    # one query z = e1, tokens e1 (selected), 0: constraint (e1 − 0)ᵀ W e1 ≥ 1 → W = e1 e1ᵀ, ‖W‖ = 1
    X = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]], dtype=torch.float64)
    z = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    res = att_svm(X, z, torch.tensor([0]))
    assert res.objective == pytest.approx(1.0, rel=1e-12)
    assert torch.allclose(res.W, torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64), atol=1e-12)
    assert res.margins[0, 1] == pytest.approx(1.0)
    assert math.isnan(float(res.margins[0, 0]))
    assert bool(res.active[0, 1])


def test_infeasible_duplicate_token_and_contradiction():
    X, z, sel = _instance(4, 5, 6, 4)
    X[2, 3] = X[2, int(sel[2])]  # a token equal to the selected one: 0 ≥ 1
    if int(sel[2]) == 3:
        X[2, 4] = X[2, 3]
    res = att_svm(X, z, sel)
    assert not res.feasible and res.W is None and res.status == "infeasible"
    assert res.offending.tolist() == [2]
    assert math.isinf(res.objective)
    # no W: float64 NaN margins, zero duals, no active token; the verdict came before any solver ran
    assert res.margins.dtype == torch.float64 and res.margins.shape == (4, 5) and bool(res.margins.isnan().all())
    assert not bool(res.dual.any()) and not bool(res.active.any())
    assert res.solver.startswith("none") and res.iterations == 0
    # two identical queries over identical tokens that select different tokens: a + (−a) = 0
    X2 = torch.randn(2, 3, 4, dtype=torch.float64)
    X2[1] = X2[0]
    z2 = torch.randn(1, 4, dtype=torch.float64).repeat(2, 1)
    res2 = att_svm(X2, z2, torch.tensor([0, 1]))
    assert not res2.feasible
    assert sorted(res2.offending.tolist()) == [0, 1]
    assert res2.certificate_residual < 1e-6
    assert res2.solver == att_svm(X2[:1], z2[:1], torch.tensor([0])).solver  # the dual solver that found it
    assert res2.margins.dtype == torch.float64 and bool(res2.margins.isnan().all())
    prob, _ = _cvx_solve(X2, z2, sel=torch.tensor([0, 1]))
    assert prob.status == "infeasible"


@pytest.mark.parametrize("seed", [11, 12])
def test_infeasibility_agrees_with_cvxpy_when_underparameterized(seed):
    # d² = 9 unknowns, 40+ constraints: usually infeasible; the verdict must match cvxpy either way
    X, z, sel = _instance(8, 6, 3, seed)
    res = att_svm(X, z, sel)
    prob, _ = _cvx_solve(X, z, sel=sel)
    assert res.feasible == (prob.status == "optimal")
    if not res.feasible:
        assert res.offending is not None and len(res.offending) >= 2


def test_gen_svm_mask_matches_cvxpy():
    X, z, _ = _instance(5, 6, 7, 8)
    mask = torch.zeros(5, 6, dtype=torch.bool)
    mask[:, 0] = True
    mask[1, 3] = True
    mask[3, [2, 4]] = True
    res = att_svm(X, z, mask)
    prob, W = _cvx_solve(X, z, sel_mask=mask)
    assert res.feasible and prob.status == "optimal"
    assert res.objective == pytest.approx(prob.value, rel=1e-6)
    # equalities hold: tokens of a selected set have identical scores
    scores = torch.einsum("ntd,de,ne->nt", X, res.W, z)
    assert torch.allclose(scores[1, 0], scores[1, 3], atol=1e-9)
    assert torch.allclose(scores[3, 2], scores[3, 4], atol=1e-9)
    assert torch.allclose(scores[3, 0], scores[3, 2], atol=1e-9)
    assert (res.constraint == 2).sum() == 3
    gap = scores[3, 0] - scores[3, [1, 3, 5]]
    assert (gap >= 1 - 1e-9).all()


def test_nuclear_matches_cvxpy_and_is_below_frobenius_norm():
    X, z, sel = _instance(4, 4, 5, 9)
    res = att_svm(X, z, sel, norm="nuc")
    prob, W = _cvx_solve(X, z, norm="nuc", sel=sel)
    assert res.norm == "nuc" and res.feasible
    assert res.objective == pytest.approx(prob.value, rel=1e-6)
    assert res.duality_gap < 1e-6
    ineq, _ = _cvx_features(X, z, sel=sel)
    assert min(a @ res.W.numpy() @ b for a, b in ineq) >= 1 - 1e-9
    # the support: the non-selected tokens whose margin (x_sel − x_t)ᵀ W z is 1 at the optimum (there is one)
    Xn, zn, Wn = X.numpy(), z.numpy(), res.W.numpy()
    margin = np.array([[(Xn[i, sel[i]] - Xn[i, t]) @ Wn @ zn[i] for t in range(4)] for i in range(4)])
    tight = (margin <= 1 + 1e-5) & (np.arange(4)[None, :] != sel.numpy()[:, None])
    assert tight.any() and np.array_equal(res.active.numpy(), tight)
    fro = att_svm(X, z, sel)
    # ‖W_nuc‖_* ≤ ‖W_fro‖_* and ‖W_fro‖_F ≤ ‖W_nuc‖_F (each is optimal for its own norm)
    assert res.objective <= float(torch.linalg.matrix_norm(fro.W, "nuc")) + 1e-7
    assert fro.objective <= float(torch.linalg.norm(res.W)) + 1e-7


def test_self_attention_equals_expanded_problem():
    g = torch.Generator().manual_seed(3)
    B, T, d = 2, 5, 6
    X = torch.randn(B, T, d, generator=g, dtype=torch.float64)
    sel = torch.randint(0, T, (B, T), generator=g)
    qmask = torch.ones(B, T, dtype=torch.bool)
    qmask[1, 4] = False
    res = att_svm_self(X, sel, query_mask=qmask)
    idx = res.query_index
    assert idx.shape == (B * T - 1, 2)
    Xe = X[idx[:, 0]]
    ze = X[idx[:, 0], idx[:, 1]]
    ref = att_svm(Xe, ze, sel[idx[:, 0], idx[:, 1]])
    assert res.objective == pytest.approx(ref.objective, rel=1e-8)
    assert matrix_correlation(res.W, ref.W) > 1 - 1e-10
    assert torch.allclose(res.margins.nan_to_num(0), ref.margins.nan_to_num(0), atol=1e-7)


def test_token_mask_drops_padding_constraints():
    X, z, sel = _instance(3, 6, 5, 10)
    sel = torch.tensor([0, 1, 2])
    tm = torch.ones(3, 6, dtype=torch.bool)
    tm[:, 4:] = False
    res = att_svm(X, z, sel, token_mask=tm)
    ref = att_svm(X[:, :4], z, sel)
    assert res.objective == pytest.approx(ref.objective, rel=1e-9)
    assert torch.isnan(res.margins[:, 4:]).all()
    prob, _ = _cvx_solve(X, z, sel=sel, token_mask=tm)
    assert res.objective == pytest.approx(prob.value, rel=1e-6)


def test_finite_part_reproduces_log_ratios():
    X, z, _ = _instance(4, 5, 8, 13)
    mask = torch.zeros(4, 5, dtype=torch.bool)
    mask[:, :2] = True
    mask[2, 2] = True
    logp = torch.log_softmax(torch.randn(4, 5, dtype=torch.float64), dim=1)
    Wf = gen_svm_finite_part(X, z, mask, logp)
    scores = torch.einsum("ntd,de,ne->nt", X, Wf, z)
    for i in range(4):
        O = torch.nonzero(mask[i]).squeeze(1)
        diff = scores[i, O] - scores[i, O[0]]
        want = logp[i, O] - logp[i, O[0]]
        assert torch.allclose(diff, want, atol=1e-8)
    # minimum norm: W_fin lies in the span of the equality features (x_{iO_0} − x_{it}) z_iᵀ, t ∈ O_i
    feats = []
    for i in range(4):
        O = torch.nonzero(mask[i]).squeeze(1)
        for t in O[1:]:
            feats.append(torch.outer(X[i, O[0]] - X[i, t], z[i]).reshape(-1))
    E = torch.stack(feats, 1)
    coef = torch.linalg.lstsq(E, Wf.reshape(-1, 1)).solution
    assert torch.allclose(E @ coef, Wf.reshape(-1, 1), atol=1e-10)


def test_bad_inputs_raise_clear_errors():
    X, z, sel = _instance(3, 4, 5, 0)
    with pytest.raises(ValueError, match="norm"):
        att_svm(X, z, sel, norm="spectral")
    with pytest.raises(ValueError, match="X: expected a 3-D"):
        att_svm(X[0], z, sel)
    with pytest.raises(ValueError, match="z: expected 3 queries"):
        att_svm(X, z[:2], sel)
    with pytest.raises(ValueError, match="selected: token indices"):
        att_svm(X, z, torch.tensor([0, 1, 9]))
    with pytest.raises(TypeError, match="selected"):
        att_svm(X, z, torch.tensor([0.0, 1.0, 2.0]))
    bad = X.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="X: contains NaN"):
        att_svm(bad, z, sel)
    with pytest.raises(TypeError, match="X: expected a torch.Tensor"):
        att_svm([[1.0]], z, sel)
    with pytest.raises(ValueError, match="at least one selected"):
        att_svm(X, z, torch.zeros(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="no inequality"):
        att_svm(X, z, torch.ones(3, 4, dtype=torch.bool))


def test_summary_is_json_friendly():
    import json

    X, z, sel = _instance(3, 4, 5, 0)
    s = att_svm(X, z, sel).summary()
    json.dumps(s)
    assert s["feasible"] and s["num_constraints"] == 9
