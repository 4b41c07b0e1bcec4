"""Semi-NMF concepts, Gram loss, KL bound, Hungarian matching: checks against independent computations."""

import itertools
import math

import numpy as np
import pytest
import torch

from hf_tdiag.measures.concepts import (
    ClassifierSupervisedSemiNMF,
    SemiNMF,
    fidelity_errors,
    gram_error,
    gram_lemma_rhs,
    gram_loss,
    gram_loss_grad,
    kl_bound,
    kl_divergence,
    lstsq_dictionary,
    match_concepts,
    mu_update_codes,
    nnls_codes,
    semi_nmf_objective,
    truncated_svd_error,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _naive_gram_loss(A, H):
    """Per image, explicit N×N Grams in float64."""
    out = []
    for a, h in zip(A.double(), H.double()):
        G = a @ a.T
        Gh = h @ h.T
        out.append(((G - Gh) ** 2).sum() / (G**2).sum())
    return torch.stack(out)


# ----------------------------------------------------------------------------- MU updates


def test_mu_updates_never_increase_objective_and_keep_codes_nonnegative():
    g = torch.Generator().manual_seed(3)
    A = torch.randn(120, 15, generator=g, dtype=torch.float64)
    U = torch.rand(120, 6, generator=g, dtype=torch.float64) + 0.1
    W = lstsq_dictionary(A, U)
    prev = float(semi_nmf_objective(A, U, W))
    for _ in range(60):
        U = mu_update_codes(A, U, W)
        assert bool((U >= 0).all())
        obj = float(((A - U @ W.T) ** 2).sum())  # naive objective
        assert obj <= prev * (1 + 1e-12)
        prev = obj
        W = lstsq_dictionary(A, U)
        obj = float(((A - U @ W.T) ** 2).sum())
        assert obj <= prev * (1 + 1e-12)
        prev = obj


def _naive_mu_step(A, U, W):
    """Ding–Li–Jordan eq. 10 written out: U ∘ √(([AW]⁺ + U[WᵀW]⁻) / ([AW]⁻ + U[WᵀW]⁺)), X⁺ = (|X|+X)/2."""
    AW, WtW = A @ W, W.T @ W
    plus, minus = (AW.abs() + AW) / 2, (AW.abs() - AW) / 2
    g_plus, g_minus = (WtW.abs() + WtW) / 2, (WtW.abs() - WtW) / 2
    return U * torch.sqrt((plus + U @ g_minus) / (minus + U @ g_plus))


def test_mu_code_step_is_eq_10_with_its_square_root():
    def scalar(v):
        return torch.tensor([[v]], dtype=torch.float64)

    # by hand, one row, one feature, one concept: A = 2, W = 1, U = 8 -> U · √((2 + 0) / (0 + 8·1)) = 8 · 1/2 = 4
    assert float(mu_update_codes(scalar(2.0), scalar(8.0), scalar(1.0))) == pytest.approx(4.0)
    # A = -3, W = 1 ([AW]⁻ = 3), U = 1/3: U · √((0 + 0) / (3 + 1/3)) = 0 — a negative correlation drives the code to 0
    assert float(mu_update_codes(scalar(-3.0), scalar(1 / 3), scalar(1.0))) == 0.0
    # random data, signed W (both parts of WᵀW non-zero): the library step and the streamed pass equal the naive one
    from hf_tdiag.measures.concepts.updates import mu_pass

    g = torch.Generator().manual_seed(11)
    A = torch.randn(37, 7, generator=g, dtype=torch.float64)
    U = torch.rand(37, 4, generator=g, dtype=torch.float64) + 0.05
    W = torch.randn(7, 4, generator=g, dtype=torch.float64)
    ref = _naive_mu_step(A, U, W)
    torch.testing.assert_close(mu_update_codes(A, U, W), ref, rtol=1e-10, atol=1e-12)
    streamed = U.clone()
    UtA, UtU, dot = mu_pass(A, streamed, W, chunk=5)  # 8 chunks, the last one short
    torch.testing.assert_close(streamed, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(UtA, ref.T @ A, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(UtU, ref.T @ ref, rtol=1e-10, atol=1e-12)
    assert dot == pytest.approx(float(((A @ W) * ref).sum()), rel=1e-10)


def test_lstsq_dictionary_is_the_exact_minimizer():
    g = torch.Generator().manual_seed(4)
    A = torch.randn(50, 9, generator=g, dtype=torch.float64)
    U = torch.rand(50, 4, generator=g, dtype=torch.float64)
    W = lstsq_dictionary(A, U)
    ref = torch.linalg.lstsq(U, A).solution.T  # min_W ‖A − U Wᵀ‖ independently
    assert torch.allclose(W, ref, atol=1e-10)


def test_fit_history_is_monotone_in_the_mu_phase_and_codes_nonnegative():
    g = torch.Generator().manual_seed(5)
    A = torch.randn(200, 12, generator=g, dtype=torch.float64)
    m = SemiNMF(5, max_iter=80).fit(A)
    rec = [r for r, p in zip(m.history_["rec_loss"], m.history_["phase"]) if p == "mu"]
    assert len(rec) == 80
    assert all(b <= a * (1 + 1e-10) for a, b in zip(rec, rec[1:]))
    assert bool((m.codes_ >= 0).all())
    # history value = naive objective of the returned factors, relative to ‖A‖²
    ref = float(((A - m.codes_ @ m.components_) ** 2).sum() / (A**2).sum())
    assert m.history_["rec_loss"][-1] == pytest.approx(ref, rel=1e-9)
    assert m.reconstruction_err_ == pytest.approx(math.sqrt(ref * float((A**2).sum())), rel=1e-9)


def test_planted_factors_are_recovered():
    g = torch.Generator().manual_seed(1)
    k, n, d = 4, 400, 30
    labels = torch.arange(n) % k
    U0 = torch.nn.functional.one_hot(labels, k).double() * (1 + torch.rand(n, 1, generator=g, dtype=torch.float64))
    W0 = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64))[0] * 3
    A = U0 @ W0.T
    m = SemiNMF(k, max_iter=300, init="nndsvd").fit(A)
    assert m.reconstruction_err_ / float(A.norm()) < 1e-8
    match = match_concepts(m.components_, W0.T)
    assert float(match["cosine"].min()) > 0.9999
    # codes match the planted ones once permuted and rescaled
    U = m.codes_[:, match["rows"]]
    Up = U0[:, match["cols"]]
    scale = (U * Up).sum(0) / (Up * Up).sum(0)
    assert torch.allclose(U, Up * scale, atol=1e-3 * float(U.abs().max()))


def test_kmeans_init_recovers_planted_clusters_with_a_correlated_dictionary():
    g = torch.Generator().manual_seed(2)
    k, n, d = 4, 400, 30
    labels = torch.arange(n) % k
    U0 = torch.nn.functional.one_hot(labels, k).double() * (1 + torch.rand(n, 1, generator=g, dtype=torch.float64))
    W0 = torch.randn(d, k, generator=g, dtype=torch.float64)
    A = U0 @ W0.T
    m = SemiNMF(k, max_iter=300, init="kmeans").fit(A)
    assert m.reconstruction_err_ / float(A.norm()) < 1e-6
    pred = m.codes_.argmax(1)
    best = max(sum(int(p[int(l)] == int(q)) for l, q in zip(labels, pred)) for p in itertools.permutations(range(k)))
    assert best == n
    assert float(match_concepts(m.components_, W0.T)["cosine"].min()) > 0.9


def test_svd_init_starts_at_the_rank_k_minus_1_optimum():
    g = torch.Generator().manual_seed(18)
    A = torch.randn(80, 12, generator=g, dtype=torch.float64)
    m = SemiNMF(5, max_iter=20, init="svd").fit(A)
    assert m.history_["phase"][0] == "init"
    a2 = float((A**2).sum())
    floor_k1 = truncated_svd_error(A, 4) ** 2 / a2
    floor_k = truncated_svd_error(A, 5) ** 2 / a2
    # U = [M + shift, 1] spans the rank-(k−1) SVD scores, and the least-squares W can only do better
    assert floor_k <= m.history_["rec_loss"][0] <= floor_k1 * (1 + 1e-12)
    # MU then improves further, never below the rank-k floor
    assert floor_k <= m.reconstruction_err_**2 / a2 < m.history_["rec_loss"][0]


def test_transform_reproduces_fitted_codes_and_solves_nnls():
    g = torch.Generator().manual_seed(6)
    A = torch.randn(30, 10, 16, generator=g, dtype=torch.float64)
    m = SemiNMF(6, max_iter=50, encode_tol=1e-10).fit(A)
    assert m.codes_.shape == (30, 10, 6)
    assert m.components_.shape == (6, 16)
    # the same procedure on the same dictionary (BLAS round-off aside: MKL is not bitwise reproducible)
    assert torch.allclose(m.transform(A), m.codes_, atol=1e-7 * float(m.codes_.max()))
    # KKT of min_{U≥0} ‖A − U Wᵀ‖² with W fixed, checked independently
    U = m.codes_.reshape(-1, 6)
    W = m.components_.T
    grad = (U @ W.T - A.reshape(-1, 16)) @ W
    scale = float(grad.abs().max())
    assert bool((U >= 0).all())
    assert float(grad.min()) > -1e-8 * scale
    assert float((U * grad).abs().max()) < 1e-8 * scale * float(U.max())
    # new data: transform gives the NNLS solution too (compare against scipy's active-set NNLS)
    from scipy.optimize import nnls

    B = torch.randn(5, 16, generator=g, dtype=torch.float64)
    codes = m.transform(B)
    for row, c in zip(B, codes):
        ref, _ = nnls(W.numpy(), row.numpy(), maxiter=1000)
        assert np.allclose(c.numpy(), ref, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


def test_transform_reproduces_codes_with_gram_weight():
    g = torch.Generator().manual_seed(7)
    A = torch.randn(12, 8, 10, generator=g, dtype=torch.float64)
    m = SemiNMF(4, gram_weight=2.0, max_iter=30, refine_iter=20, encode_tol=1e-10).fit(A)
    # the same procedure on the same dictionary (BLAS round-off aside: MKL is not bitwise reproducible)
    tol = 1e-5 * float(m.codes_.max())
    assert torch.allclose(m.transform(A), m.codes_, atol=tol)
    again = SemiNMF(4, gram_weight=2.0, max_iter=30, refine_iter=20, encode_tol=1e-10).fit_transform(A)
    assert torch.allclose(again, m.codes_, atol=tol)


def test_joint_refinement_is_monotone_reports_both_losses_and_lowers_gram_loss():
    g = torch.Generator().manual_seed(8)
    A = torch.randn(20, 12, 24, generator=g, dtype=torch.float64)
    plain = SemiNMF(5, max_iter=60).fit(A)
    m = SemiNMF(5, gram_weight=5.0, max_iter=60, refine_iter=40).fit(A)
    h = m.history_
    idx = [i for i, p in enumerate(h["phase"]) if p == "refine"]
    assert len(idx) >= 5
    obj = [h["objective"][i] for i in idx]
    assert all(b <= a + 1e-12 for a, b in zip(obj, obj[1:]))
    for i in idx:
        assert math.isfinite(h["rec_loss"][i]) and math.isfinite(h["gram_loss"][i])
        assert h["objective"][i] == pytest.approx(h["rec_loss"][i] + 5.0 * h["gram_loss"][i], rel=1e-9)
    # the reported losses are the naive ones of the returned factors
    H = m.inverse_transform(m.codes_)
    assert h["gram_loss"][-1] == pytest.approx(float(_naive_gram_loss(A, H).mean()), rel=1e-9)
    assert float(gram_loss(A, H).mean()) < float(gram_loss(A, plain.inverse_transform(plain.codes_)).mean())
    assert bool((m.codes_ >= 0).all())


# ----------------------------------------------------------------------------- Gram loss


@pytest.mark.parametrize("n_tokens,d", [(6, 9), (11, 4)])  # N ≤ d and N > d branches
def test_gram_loss_and_gradient_match_naive(n_tokens, d):
    g = torch.Generator().manual_seed(9)
    A = torch.randn(3, n_tokens, d, generator=g, dtype=torch.float64)
    H = A + 0.3 * torch.randn(3, n_tokens, d, generator=g, dtype=torch.float64)
    ref = _naive_gram_loss(A, H)
    assert torch.allclose(gram_loss(A, H), ref, rtol=1e-10)
    loss, grad = gram_loss_grad(A, H)
    assert torch.allclose(loss, ref, rtol=1e-10)
    Hr = H.clone().requires_grad_(True)
    _naive_gram_loss(A, Hr).sum().backward()
    assert torch.allclose(grad, Hr.grad, rtol=1e-8, atol=1e-12)
    # central finite differences on one coordinate
    eps = 1e-6
    E = torch.zeros_like(H)
    E[1, 2, 3] = eps
    fd = (_naive_gram_loss(A, H + E).sum() - _naive_gram_loss(A, H - E).sum()) / (2 * eps)
    assert float(grad[1, 2, 3]) == pytest.approx(float(fd), rel=1e-5)
    # single image (N, d) input
    assert float(gram_loss(A[0], H[0])) == pytest.approx(float(ref[0]), rel=1e-10)


def test_gram_loss_is_scale_free_and_blind_to_rotations():
    g = torch.Generator().manual_seed(10)
    A = torch.randn(2, 7, 5, generator=g, dtype=torch.float64)
    Q = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=torch.float64))[0]
    assert (
        float(gram_loss(A, A @ Q).max()) < 1e-12
    )  # ÂÂᵀ = AAᵀ for a rotation (N > d: expanded form, float64 round-off)
    H = A + 0.1 * torch.randn(2, 7, 5, generator=g, dtype=torch.float64)
    assert torch.allclose(gram_loss(10 * A, 10 * H), gram_loss(A, H), rtol=1e-10)


def test_gram_lemma_holds_on_random_data():
    g = torch.Generator().manual_seed(11)
    for scale in (0.01, 1.0, 100.0):
        for noise in (1e-3, 0.1, 1.0, 10.0):
            A = scale * torch.randn(8, 10, 6, generator=g, dtype=torch.float64)
            H = A + noise * scale * torch.randn(8, 10, 6, generator=g, dtype=torch.float64)
            lhs = gram_error(A, H)
            naive = torch.stack([((a @ a.T - h @ h.T) ** 2).sum().sqrt() for a, h in zip(A, H)])
            assert torch.allclose(lhs, naive, rtol=1e-9)
            delta = (A - H).flatten(1).norm(dim=1)
            rhs = 2 * A.flatten(1).norm(dim=1) * delta + delta**2
            assert torch.allclose(gram_lemma_rhs(A, H), rhs, rtol=1e-12)
            assert bool((lhs <= rhs * (1 + 1e-12)).all())


def test_fidelity_errors_against_direct_formulas():
    g = torch.Generator().manual_seed(12)
    A = torch.randn(4, 6, 8, generator=g)
    H = A + 0.2 * torch.randn(4, 6, 8, generator=g)
    e = fidelity_errors(A, H)
    Ad, Hd = A.double(), H.double()
    assert torch.allclose(e["delta_rec"], (Ad - Hd).flatten(1).norm(dim=1))
    assert torch.allclose(e["delta_rec_rel"], (Ad - Hd).flatten(1).norm(dim=1) / Ad.flatten(1).norm(dim=1))
    assert torch.allclose(e["delta_gram"], _naive_gram_loss(A, H).sqrt())
    assert torch.allclose(e["gram_norm"], torch.stack([(a @ a.T).norm() for a in Ad]))


# ----------------------------------------------------------------------------- KL and the bound


def test_kl_divergence_matches_definition_and_is_zero_for_equal_logits():
    g = torch.Generator().manual_seed(13)
    p = torch.randn(5, 7, generator=g)
    q = torch.randn(5, 7, generator=g)
    P, Q = torch.softmax(p.double(), -1), torch.softmax(q.double(), -1)
    ref = (P * (P.log() - Q.log())).sum(-1)
    assert torch.allclose(kl_divergence(p, q), ref, rtol=1e-10)
    assert bool((kl_divergence(p, p) == 0).all())


def test_kl_bound_formula_by_hand():
    out = kl_bound(
        w_c_op=2.0,
        l_block=1.5,
        n_suffix_blocks=2,
        n_tokens=16,
        delta_rec=0.5,
        alpha=0.1,
        gram_norm=30.0,
        delta_gram=0.2,
        l_readout=3.0,
    )
    # ½ (2·3)² · 1.5⁴ · (4·0.5 + 0.1·30·0.2)² = 18 · 5.0625 · 2.6² = 615.94...
    assert float(out["bound"]) == pytest.approx(0.5 * 36 * 1.5**4 * (2.0 + 0.6) ** 2)
    assert float(out["rec_term"]) == pytest.approx(2.0)
    assert float(out["gram_term"]) == pytest.approx(0.6)
    assert float(out["bound_rec_only"]) == pytest.approx(0.5 * 36 * 1.5**4 * 4.0)
    with pytest.raises(ValueError, match="alpha"):
        kl_bound(1.0, 1.0, 1, 4, 0.1, float("nan"), 1.0, 0.1)


# ----------------------------------------------------------------------------- matching and SVD floor


def test_hungarian_matching_against_brute_force():
    g = torch.Generator().manual_seed(14)
    D = torch.randn(5, 12, generator=g, dtype=torch.float64)
    perm = [3, 0, 4, 1, 2]
    D2 = D[perm] * torch.tensor([[2.0], [0.5], [1.0], [3.0], [1.5]], dtype=torch.float64)
    m = match_concepts(D, D2)
    assert m["mean_cosine"] == pytest.approx(1.0)
    assert [perm[c] for c in m["cols"]] == m["rows"]
    E = torch.randn(5, 12, generator=g, dtype=torch.float64)
    cos = torch.nn.functional.normalize(D, dim=1) @ torch.nn.functional.normalize(E, dim=1).T
    best = max(sum(float(cos[i, p[i]]) for i in range(5)) for p in itertools.permutations(range(5)))
    assert match_concepts(D, E)["mean_cosine"] == pytest.approx(best / 5)


def test_truncated_svd_error_is_eckart_young():
    g = torch.Generator().manual_seed(15)
    A = torch.randn(40, 9, generator=g, dtype=torch.float64)
    s = np.linalg.svd(A.numpy(), compute_uv=False)
    assert truncated_svd_error(A, 3) == pytest.approx(float(np.sqrt((s[3:] ** 2).sum())), rel=1e-8)
    m = SemiNMF(3, max_iter=100).fit(A)
    assert m.reconstruction_err_ >= truncated_svd_error(A, 3) * (1 - 1e-9)


# ----------------------------------------------------------------------------- classifier-supervised fit


def test_classifier_supervised_fit_lowers_kl_through_the_suffix():
    g = torch.Generator().manual_seed(16)
    A = torch.randn(24, 6, 10, generator=g)
    Wc = torch.randn(10, 4, generator=g) * 3

    def suffix(P):
        return torch.tanh(P).mean(1) @ Wc

    plain = SemiNMF(3, max_iter=50).fit(A)
    sup = ClassifierSupervisedSemiNMF(3, kl_weight=10.0, supervised_iter=60, lr=0.05, max_iter=50, batch_size=10).fit(
        A, suffix
    )
    target = suffix(A)
    kl_plain = float(kl_divergence(target, suffix(plain.inverse_transform(plain.codes_))).mean())
    kl_sup = float(kl_divergence(target, suffix(sup.inverse_transform(sup.codes_))).mean())
    assert kl_sup < 0.7 * kl_plain
    kls = [v for v, p in zip(sup.history_["kl"], sup.history_["phase"]) if p == "supervised"]
    assert len(kls) == 60 and kls[-1] < kls[0]
    assert bool((sup.codes_ >= 0).all())
    with pytest.raises(TypeError, match="suffix"):
        ClassifierSupervisedSemiNMF(3).fit(A, None)


# ----------------------------------------------------------------------------- input checks


def test_bad_inputs_raise_clear_errors():
    A = torch.randn(10, 4, 6)
    with pytest.raises(ValueError, match="n_concepts"):
        SemiNMF(7).fit(A)  # more concepts than d = 6
    with pytest.raises(ValueError, match="n_concepts"):
        SemiNMF(5).fit(torch.randn(3, 6))  # more concepts than rows
    with pytest.raises(ValueError, match="images, N, d"):
        SemiNMF(2, gram_weight=1.0).fit(torch.randn(20, 6))
    bad = A.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        SemiNMF(2).fit(bad)
    with pytest.raises(TypeError, match="floating"):
        SemiNMF(2).fit(torch.ones(5, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="not fitted"):
        SemiNMF(2).transform(A)
    with pytest.raises(ValueError, match="init"):
        SemiNMF(2, init="pca")
    with pytest.raises(ValueError, match="gram_weight"):
        SemiNMF(2, gram_weight=-1.0)
    m = SemiNMF(2, max_iter=5).fit(A)
    with pytest.raises(ValueError, match="features"):
        m.transform(torch.randn(3, 5))
    with pytest.raises(ValueError, match="A_hat"):
        gram_loss(A, A[:, :3])


def test_nnls_codes_matches_scipy():
    from scipy.optimize import nnls

    g = torch.Generator().manual_seed(17)
    W = torch.randn(8, 3, generator=g, dtype=torch.float64)
    A = torch.randn(6, 8, generator=g, dtype=torch.float64)
    U = nnls_codes(A, W, tol=1e-13, max_iter=20000)
    for row, u in zip(A, U):
        ref, _ = nnls(W.numpy(), row.numpy())
        assert np.allclose(u.numpy(), ref, atol=1e-8)


# ----------------------------------------------------------------------------- the Ding–Li–Jordan step itself


def _naive_mu_step(A, U, W):
    """Ding, Li & Jordan (2010) eq. 10 written element by element: U_ik ← U_ik √(num_ik / den_ik)."""
    AW, WtW = A @ W, W.T @ W
    pos = lambda M: (M.abs() + M) / 2  # noqa: E731
    neg = lambda M: (M.abs() - M) / 2  # noqa: E731
    out = torch.empty_like(U)
    for i in range(U.shape[0]):
        for k in range(U.shape[1]):
            num = pos(AW)[i, k] + sum(U[i, j] * neg(WtW)[j, k] for j in range(U.shape[1]))
            den = neg(AW)[i, k] + sum(U[i, j] * pos(WtW)[j, k] for j in range(U.shape[1]))
            out[i, k] = U[i, k] * math.sqrt(float(num) / float(den))
    return out


def test_one_mu_step_is_the_square_root_update():
    g = torch.Generator().manual_seed(21)
    A = torch.randn(9, 5, generator=g, dtype=torch.float64)
    U = torch.rand(9, 3, generator=g, dtype=torch.float64) + 0.1
    W = lstsq_dictionary(A, U)
    ref = _naive_mu_step(A, U, W)
    assert torch.allclose(mu_update_codes(A, U, W), ref, rtol=1e-12, atol=1e-14)
    # without the square root the step differs (it is the same direction, twice as far in log scale)
    assert not torch.allclose(mu_update_codes(A, U, W), U * (ref / U) ** 2, rtol=1e-3)


def test_the_fit_runs_the_square_root_update_in_its_mu_phase():
    """The first MU iteration of fit() against the naive step from the same start (the streamed code path)."""
    from hf_tdiag.measures.concepts.init import initial_codes

    g = torch.Generator().manual_seed(22)
    A = torch.randn(30, 6, generator=g, dtype=torch.float64)
    m = SemiNMF(3, max_iter=1, init="random", random_state=4).fit(A)
    U0 = initial_codes(A, 3, "random", 4)
    W0 = lstsq_dictionary(A, U0)
    U1 = _naive_mu_step(A, U0, W0)
    ref = float(((A - U1 @ W0.T) ** 2).sum() / (A**2).sum())
    assert m.history_["phase"][:2] == ["init", "mu"]
    assert m.history_["rec_loss"][1] == pytest.approx(ref, rel=1e-10)
    W1 = lstsq_dictionary(A, U1)
    assert m.history_["rec_loss"][2] == pytest.approx(float(((A - U1 @ W1.T) ** 2).sum() / (A**2).sum()), rel=1e-10)


def test_objective_and_dictionary_step_by_hand_ridge_dtype_and_a_singular_gram():
    # ‖A − U Wᵀ‖²_F with A = [1, 2], U = [1], W = [1, 1]ᵀ: (1 − 1)² + (2 − 1)² = 1
    one = torch.tensor([[1.0]])
    assert float(semi_nmf_objective(torch.tensor([[1.0, 2.0]]), one, torch.tensor([[1.0], [1.0]]))) == 1.0
    g = torch.Generator().manual_seed(21)
    A = torch.randn(30, 6, generator=g, dtype=torch.float64)
    U = torch.rand(30, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 5.0, 10.0], dtype=torch.float64)
    # ridge r: W = Aᵀ U (UᵀU + r·mean(diag UᵀU)·I)⁻¹, written out
    G = U.T @ U
    for ridge in (0.0, 0.1):
        expected = torch.linalg.solve(
            G + ridge * float(G.diagonal().mean()) * torch.eye(3, dtype=torch.float64), U.T @ A
        ).T
        torch.testing.assert_close(lstsq_dictionary(A, U, ridge=ridge), expected, rtol=1e-10, atol=1e-12)
    # float32 in, float32 out (solved in float64)
    W32 = lstsq_dictionary(A.float(), U.float())
    assert W32.dtype == torch.float32
    torch.testing.assert_close(W32.double(), lstsq_dictionary(A, U), rtol=1e-4, atol=1e-5)
    # a concept no row uses (a zero code column): UᵀU is singular, the plain Cholesky fails and the jittered one
    # gives the minimum-norm least-squares dictionary (that concept's atom 0)
    Us = torch.cat([U[:, :2], torch.zeros(30, 1, dtype=torch.float64)], dim=1)
    min_norm = (torch.linalg.pinv(Us) @ A).T
    got = lstsq_dictionary(A, Us)
    torch.testing.assert_close(got, min_norm, rtol=1e-8, atol=1e-10)
    assert float(got[:, 2].abs().max()) == 0.0


def test_a_suffix_returning_a_model_output_is_read_through_its_logits():
    from transformers.modeling_outputs import SequenceClassifierOutput

    g = torch.Generator().manual_seed(5)
    A = torch.randn(8, 4, 6, generator=g)
    Wc = torch.randn(6, 3, generator=g)

    def suffix(P):
        return torch.tanh(P).mean(1) @ Wc

    kw = dict(kl_weight=5.0, supervised_iter=4, max_iter=5, batch_size=4)
    plain = ClassifierSupervisedSemiNMF(2, **kw).fit(A, suffix)
    wrapped = ClassifierSupervisedSemiNMF(2, **kw).fit(A, lambda P: SequenceClassifierOutput(logits=suffix(P)))
    torch.testing.assert_close(wrapped.components_, plain.components_, rtol=0, atol=0)
    np.testing.assert_array_equal(wrapped.history_["kl"], plain.history_["kl"])  # NaN outside the supervised phase


def test_a_one_concept_svd_start_is_the_constant_code():
    from hf_tdiag.measures.concepts.init import initial_codes

    A = torch.randn(7, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    U = initial_codes(A, 1, "svd")  # rank k − 1 = 0: U = [1], W = the mean row reproduces the rank-0 fit
    torch.testing.assert_close(U, torch.ones(7, 1, dtype=torch.float64), rtol=0, atol=0)
