"""hf_tdiag.measures.schatten: hand-computed examples for every formula, rank edge cases, invariances, errors."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from hf_tdiag.measures import schatten as S


def _orth(n, seed):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return q


# ----------------------------------------------------------------------------- Schatten powers and ranks


def test_schatten_powers_hand_example():
    sigma = torch.tensor([4.0, 3.0, 0.0], dtype=torch.float64)
    got = S.schatten_powers(sigma, [0.0, 0.5, 1.0, 2.0])
    np.testing.assert_allclose(got.numpy(), [2.0, 2.0 + math.sqrt(3.0), 7.0, 25.0], rtol=1e-15)
    assert float(S.schatten_power(sigma, 0)) == 2.0
    assert float(S.numerical_rank(sigma)) == 2
    assert float(S.spectral_norm(sigma)) == 4.0
    assert float(S.frobenius_norm(sigma)) == pytest.approx(5.0, rel=1e-15)
    assert float(S.nuclear_norm(sigma)) == pytest.approx(7.0, rel=1e-15)
    assert float(S.stable_rank(sigma)) == pytest.approx(25.0 / 16.0, rel=1e-15)


def test_rank_threshold_uses_full_dimension_and_max_sigma_one():
    # τ = 1e-10 · n · max(σ₁, 1)
    assert float(S.rank_threshold(torch.tensor([0.5, 0.1]), rank_tol=1e-10)) == pytest.approx(2e-10, rel=1e-15)
    assert float(S.rank_threshold(torch.tensor([1e3, 0.0]), full_dim=10)) == pytest.approx(1e-6, rel=1e-15)
    # the same small value is kept or dropped depending on the full matrix's min dimension
    sigma = torch.tensor([1.0, 5e-10], dtype=torch.float64)
    assert int(S.numerical_rank(sigma)) == 2  # τ = 2e-10
    assert int(S.numerical_rank(sigma, full_dim=10)) == 1  # τ = 1e-9
    # a value exactly at the threshold is a zero (σ must be strictly greater)
    at = torch.tensor([1.0, 2 * 1e-10], dtype=torch.float64)
    assert int(S.numerical_rank(at)) == 1
    assert float(S.schatten_power(at, 0.25)) == 1.0


def test_zero_matrix_is_rank_zero_for_every_p():
    sigma = S.singular_values(torch.zeros(5, 3))
    assert sigma.shape == (3,)
    powers = S.schatten_powers(sigma, [0.0, 0.1, 1.0, 2.0])
    assert torch.equal(powers, torch.zeros(4, dtype=torch.float64))
    assert float(S.stable_rank(sigma)) == 0.0
    assert float(S.spectral_norm(sigma)) == 0.0
    assert float(S.norm_2_1(torch.zeros(5, 3))) == 0.0


def test_round_off_singular_values_are_exact_zeros_at_small_p():
    """A rank-2 100×100 matrix: the dense SVD's 98 round-off values must not add to Σσᵖ at small p."""
    g = torch.Generator().manual_seed(1)
    u, v = torch.randn(100, 2, generator=g, dtype=torch.float64), torch.randn(2, 100, generator=g, dtype=torch.float64)
    w = u @ v
    sigma = torch.linalg.svdvals(w)
    assert int((sigma > 0).sum()) > 2  # round-off noise is really there
    p = 0.05
    naive = float((sigma**p).sum())
    kept = sigma[:2]
    exact = float((kept**p).sum())
    assert float(S.schatten_power(sigma, p)) == pytest.approx(exact, rel=1e-14)
    assert naive - exact > 98 * 0.1  # what the threshold prevents: ~0.15–0.4 per zero value
    assert int(S.numerical_rank(sigma)) == 2


def test_exactly_low_rank_product_spectrum_and_column_norms():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(3, 40, 6, generator=g, dtype=torch.float64)
    b = torch.randn(3, 6, 30, generator=g, dtype=torch.float64)
    b[1, 4:] = 0.0  # product 1 has rank 4
    a[2] = 0.0  # product 2 is zero
    sigma, cols = S.low_rank_product_spectrum(a, b)
    dense = a @ b
    ref = torch.linalg.svdvals(dense)
    assert sigma.shape == (3, 6)
    np.testing.assert_allclose(
        S.schatten_powers(sigma, [0, 0.3, 1, 2], full_dim=30).numpy(),
        S.schatten_powers(ref, [0, 0.3, 1, 2]).numpy(),
        rtol=1e-12,
    )
    assert S.numerical_rank(sigma, full_dim=30).tolist() == [6, 4, 0]
    np.testing.assert_allclose(cols.numpy(), torch.linalg.vector_norm(dense, dim=-2).numpy(), rtol=1e-12, atol=1e-300)
    # inner width ≥ min(n, m): the product is formed directly
    a2, b2 = torch.randn(5, 8, dtype=torch.float64), torch.randn(8, 7, dtype=torch.float64)
    s2, c2 = S.low_rank_product_spectrum(a2, b2)
    np.testing.assert_allclose(s2.numpy(), torch.linalg.svdvals(a2 @ b2).numpy(), rtol=1e-12)
    np.testing.assert_allclose(c2.numpy(), torch.linalg.vector_norm(a2 @ b2, dim=0).numpy(), rtol=1e-12)


def test_singular_values_auto_matches_svd_for_well_and_ill_conditioned_batches():
    g = torch.Generator().manual_seed(3)
    well = torch.randn(64, 256, generator=g, dtype=torch.float64)  # cond ≈ 3
    u, _ = torch.linalg.qr(torch.randn(256, 64, generator=g, dtype=torch.float64))
    v = _orth(64, 4)
    ill = (u * torch.logspace(0, -12, 64, dtype=torch.float64)) @ v  # cond 1e12, exactly known spectrum
    batch = torch.stack([well.mT, ill])  # (2, 256, 64)
    auto = S.singular_values(batch)
    svd = S.singular_values(batch, method="svd")
    np.testing.assert_allclose(auto.numpy(), svd.numpy(), rtol=1e-11)
    np.testing.assert_allclose(
        auto[1].numpy(), torch.logspace(0, -12, 64, dtype=torch.float64).numpy(), rtol=0, atol=1e-14
    )
    # wide input is handled on its smaller side; transposed (non-contiguous) views give the same values
    # (atol: the SVD's own accuracy ~eps·σ₁; LAPACK rounds the ill-conditioned tail differently at another thread
    # count, and singular_values runs at the thread policy's count, the reference at the test's)
    for view in (well, well.mT, batch.mT, batch[:, ::2]):
        np.testing.assert_allclose(
            S.singular_values(view).numpy(), torch.linalg.svdvals(view).numpy(), rtol=1e-11, atol=1e-14
        )


def test_gram_path_error_at_the_conditioning_limit(monkeypatch):
    """Condition number 1000 (the guard's limit) still takes the Gram path and stays exact to 1e-9 on the proxies."""
    g = torch.Generator().manual_seed(11)
    sigma = torch.logspace(0, -2.99, 96, dtype=torch.float64) * 0.7  # σ_min/σ_max ≈ 1.02e-3, just inside the guard
    u, _ = torch.linalg.qr(torch.randn(384, 96, generator=g, dtype=torch.float64))
    w = (u * sigma) @ _orth(96, 12)
    w = w.float().double()  # float32 weights, as a model's are
    ref = torch.from_numpy(np.linalg.svd(w.numpy(), compute_uv=False))
    calls = []
    svdvals = torch.linalg.svdvals
    monkeypatch.setattr(torch.linalg, "svdvals", lambda x: calls.append(x.shape) or svdvals(x))
    auto = S.singular_values(w)
    assert calls == []  # the Gram eigensolve was used, not the SVD fallback
    np.testing.assert_allclose(auto.numpy(), ref.numpy(), rtol=1e-10, atol=0)
    ps = S.p_grid(12, 96)
    np.testing.assert_allclose(S.schatten_powers(auto, ps).numpy(), S.schatten_powers(ref, ps).numpy(), rtol=1e-12)
    # a little worse conditioned: the guard sends it to the SVD
    worse = (u * torch.logspace(0, -3.2, 96, dtype=torch.float64)) @ _orth(96, 12)
    np.testing.assert_allclose(S.singular_values(worse).numpy(), svdvals(worse).numpy(), rtol=1e-12)
    assert len(calls) == 1


def test_spectra_invariant_under_orthogonal_rotations():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(30, 20, generator=g, dtype=torch.float64)
    w[:, 15:] = w[:, :5] @ torch.randn(5, 5, generator=g, dtype=torch.float64)  # rank 15
    rotated = _orth(30, 6) @ w @ _orth(20, 7)
    ps = S.p_grid(3, 20)
    for method in ("auto", "svd"):
        s0, s1 = S.singular_values(w, method=method), S.singular_values(rotated, method=method)
        np.testing.assert_allclose(S.schatten_powers(s0, ps).numpy(), S.schatten_powers(s1, ps).numpy(), rtol=1e-11)
        assert int(S.numerical_rank(s0)) == int(S.numerical_rank(s1)) == 15
    # per-head product: rotating the head space leaves AB unchanged; rotating outside leaves its spectrum unchanged
    a, b = torch.randn(30, 4, generator=g, dtype=torch.float64), torch.randn(4, 30, generator=g, dtype=torch.float64)
    r = _orth(4, 8)
    s_ab = S.low_rank_product_spectrum(a, b)[0]
    np.testing.assert_allclose(S.low_rank_product_spectrum(a @ r, r.T @ b)[0].numpy(), s_ab.numpy(), rtol=1e-12)
    np.testing.assert_allclose(
        S.low_rank_product_spectrum(_orth(30, 9) @ a, b @ _orth(30, 10))[0].numpy(), s_ab.numpy(), rtol=1e-12
    )


def test_norm_2_1_is_sum_of_column_norms():
    w = torch.tensor([[3.0, 0.0], [4.0, 1.0]])
    assert float(S.norm_2_1(w)) == pytest.approx(6.0, rel=1e-15)
    assert S.norm_2_1(torch.stack([w, 2 * w])).tolist() == pytest.approx([6.0, 12.0])
    assert float(S.norm_2_1(w.T)) == pytest.approx(3.0 + math.sqrt(17.0), rel=1e-15)


# ----------------------------------------------------------------------------- factors, contributions, proxies


def test_p_grid():
    ps = S.p_grid(2, 128)  # m = ⌈2 + ln 128⌉ = ⌈6.85⌉ = 7
    assert ps.shape == (15,)
    np.testing.assert_allclose(ps.numpy(), np.arange(15) / 7, rtol=0, atol=0)
    assert float(ps[-1]) == 2.0
    assert S.p_grid(12, 768).shape == (2 * 19 + 1,)  # ⌈12 + 6.64⌉ = 19
    assert S.p_grid(12, 768, m=4).tolist() == [0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2]


PROP = dict(
    m_in_norm=[1.0, 2.0, 3.0],
    m_out_norm=[1.0, 1.0, 2.0],
    v_norms=[[1.0, 1.0], [1.0, 2.0], [0.5, 1.0]],
    qk_norms=[[0.0, 0.0], [1.0, 0.0], [0.25, 0.0]],
)


def test_propagation_factors_hand_example():
    # f_1 = 2·1·(1·5 + 2·1) = 14, f_2 = 3·2·(0.5·2 + 1·1) = 12  (L_φ = 1)
    alpha = S.propagation_factors(**PROP, L_phi=1.0)
    assert alpha.tolist() == [168.0, 12.0, 1.0]
    alpha = S.propagation_factors(**PROP, L_phi=1.13)
    np.testing.assert_allclose(alpha.numpy(), [168.0 * 1.13**2, 12.0 * 1.13, 1.0], rtol=1e-15)
    assert S.propagation_factors([2.0], [3.0], [[1.0]], [[1.0]]).tolist() == [1.0]  # one layer: empty product


def test_type_factors_hand_example():
    g = S.type_factors(PROP["m_in_norm"], PROP["m_out_norm"], PROP["v_norms"])
    assert g["qk"].tolist() == [[2.0, 2.0], [4.0, 8.0], [6.0, 12.0]]
    assert g["v"].tolist() == [1.0, 2.0, 6.0]
    assert g["m_in"].tolist() == [1.0, 1.0, 2.0]
    assert g["m_out"].tolist() == [1.0, 1.0, 1.0]


def test_contributions_hand_example():
    # σ = [2], N = 4, L = 1: S_p = 2^p
    ps = [0.0, 1.0, 2.0]
    powers = S.schatten_powers(torch.tensor([2.0]), ps)
    c = S.contributions(powers, ps, gamma=1.0, alpha=1.0, num_layers=1, hidden_size=4)
    np.testing.assert_allclose(c.numpy(), [2.0, 2 ** (5 / 3), 4.0], rtol=1e-14)
    c8 = S.contributions(powers, ps, gamma=2.0, alpha=4.0, num_layers=1, hidden_size=4)  # γαL = 8
    np.testing.assert_allclose(c8.numpy(), [2.0, 2 ** (8 / 3), 4**0.25 * 8**0.5 * 4**0.75], rtol=1e-14)
    best, p_opt = S.optimal_contribution(c8, ps)
    assert float(best) == pytest.approx(2.0) and float(p_opt) == 0.0
    # L enters through γαL and the grid; N through N^{(p+1)/(p+2)}
    c_l = S.contributions(powers, ps, gamma=1.0, alpha=1.0, num_layers=3, hidden_size=9)
    np.testing.assert_allclose(
        c_l.numpy(), [3.0, 2 ** (1 / 3) * 3 ** (1 / 3) * 9 ** (2 / 3), 4**0.25 * 3**0.5 * 9**0.75], rtol=1e-14
    )


def test_contributions_zero_spectrum_and_zero_scale():
    ps = [0.0, 0.5, 1.0]
    zero = S.contributions(torch.zeros(3), ps, gamma=5.0, alpha=1.0, num_layers=2, hidden_size=16)
    assert zero.tolist() == [0.0, 0.0, 0.0]
    # γ = 0 (e.g. a zero Ṽ makes γ_QK = 0): p = 0 keeps (rank·N)^{1/2}, any p > 0 gives 0
    powers = S.schatten_powers(torch.tensor([3.0, 1.0]), ps)
    c = S.contributions(powers, ps, gamma=0.0, alpha=7.0, num_layers=2, hidden_size=8)
    assert c[0].item() == pytest.approx(4.0) and c[1:].tolist() == [0.0, 0.0]
    best, p_opt = S.optimal_contribution(c, ps)
    assert float(best) == 0.0 and float(p_opt) == 0.5  # first minimiser on ties


def test_batched_contributions_match_scalar_ones():
    g = torch.Generator().manual_seed(11)
    sigma = torch.rand(2, 3, 5, generator=g, dtype=torch.float64) * 3
    ps = S.p_grid(2, 10)
    gamma = torch.rand(2, 3, generator=g, dtype=torch.float64)
    alpha = torch.tensor([[2.0], [1.0]], dtype=torch.float64)
    batched = S.contributions(S.schatten_powers(sigma, ps, 10), ps, gamma, alpha, 2, 10)
    for i in range(2):
        for j in range(3):
            single = S.contributions(S.schatten_powers(sigma[i, j], ps, 10), ps, gamma[i, j], alpha[i, 0], 2, 10)
            np.testing.assert_allclose(batched[i, j].numpy(), single.numpy(), rtol=1e-15)


def test_spectrum_adaptive_bound_and_edelman_hand_examples():
    assert float(S.spectrum_adaptive_bound([1.0, 2.0, 3.0], num_layers=4)) == 8.0
    # one layer, one head: (1·1·1·8)^{2/3} + (1·1·27)^{2/3} + (1·1)^{2/3} + 8^{2/3} = 4 + 9 + 1 + 4
    xi = S.edelman_layer_terms([1.0], [1.0], [[1.0]], [[8.0]], [[27.0]], [1.0], [8.0])
    assert xi.tolist() == pytest.approx([18.0], rel=1e-14)
    # scale factors: ‖M_out‖ = 8, ‖M_in‖ = 1: heads (8·1·1·1)^{2/3} + (8·1)^{2/3}; (8·1)^{2/3}; 1
    xi2 = S.edelman_layer_terms([1.0], [8.0], [[1.0]], [[1.0]], [[1.0]], [1.0], [1.0])
    assert xi2.tolist() == pytest.approx([4 + 4 + 4 + 1], rel=1e-14)
    # (1 + 8^{2/3}·1 + 1·3)^{3/2} = 8^{3/2}
    assert float(S.edelman_bound([8.0, 1.0], [1.0, 3.0])) == pytest.approx(16 * math.sqrt(2), rel=1e-14)
    # two heads add up
    xi3 = S.edelman_layer_terms([1.0], [1.0], [[1.0, 1.0]], [[8.0, 1.0]], [[27.0, 8.0]], [0.0], [0.0])
    assert xi3.tolist() == pytest.approx([4 + 9 + 1 + 4], rel=1e-14)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: S.schatten_powers(torch.tensor([1.0, float("nan")]), [1.0]), "sigma"),
        (lambda: S.schatten_powers(torch.tensor([1.0]), [-0.5]), "ps"),
        (lambda: S.clean_spectrum(torch.tensor([1.0, -1.0])), "sigma"),
        (lambda: S.singular_values(torch.tensor([1.0, 2.0])), "matrix"),
        (lambda: S.singular_values(torch.tensor([[float("inf")]])), "matrix"),
        (lambda: S.singular_values(torch.eye(2), method="qr"), "method"),
        (lambda: S.low_rank_product_spectrum(torch.ones(3, 2), torch.ones(3, 3)), "left/right"),
        (lambda: S.rank_threshold(torch.ones(3), full_dim=2), "full_dim"),
        (lambda: S.rank_threshold(torch.ones(3), rank_tol=2.0), "rank_tol"),
        (lambda: S.p_grid(0, 10), "num_layers"),
        (lambda: S.p_grid(2, 10, m=0), "m"),
        (lambda: S.propagation_factors([1.0], [1.0, 2.0], [[1.0]], [[1.0]]), "m_in_norm"),
        (lambda: S.propagation_factors([1.0], [1.0], [[1.0]], [[1.0]], L_phi=-1.0), "L_phi"),
        (lambda: S.contributions(torch.ones(2), [0.0, 1.0, 2.0], 1.0, 1.0, 1, 4), "powers"),
        (lambda: S.contributions(torch.ones(2), [0.0, 1.0], -1.0, 1.0, 1, 4), "gamma"),
        (lambda: S.edelman_bound([1.0, 2.0], [1.0]), "alpha/xi"),
        (
            lambda: S.edelman_layer_terms([1.0], [1.0], [[1.0]], [[1.0, 2.0]], [[1.0]], [1.0], [1.0]),
            "edelman_layer_terms",
        ),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError, match="sigma"):
        S.schatten_powers("abc", [1.0])
    with pytest.raises(TypeError, match="matrix"):
        S.singular_values(torch.ones(2, 2, dtype=torch.complex128))


def test_all_finite_matches_the_elementwise_mask():
    """The one-reduction check agrees with torch.isfinite(...).all(), including float64 overflow of the sum."""
    base = torch.randn(50, 7, dtype=torch.float64)
    cases = [base, base.float(), torch.empty(0, 3)]
    for bad in (float("nan"), float("inf"), float("-inf")):
        t = base.clone()
        t[4, 2] = bad
        cases.append(t)
    both = base.clone()
    both[0, 0], both[1, 1] = float("inf"), float("-inf")  # the sum is NaN
    cases.append(both)
    huge = torch.full((4,), 1e308, dtype=torch.float64)  # finite entries, the sum overflows to inf
    cases.append(huge)
    for t in cases:
        assert S.all_finite(t) == bool(torch.isfinite(t).all()), t
    assert S.all_finite(huge)
    with pytest.raises(ValueError, match="NaN or inf"):
        S.singular_values(cases[3])


# ----------------------------------------------------------------------------- (1,1) norm and flip factors


def test_norm_1_1_by_hand():
    w = torch.tensor([[1.0, -2.0, 0.0], [-0.5, 3.0, 4.0]], dtype=torch.float64)
    assert float(S.norm_1_1(w)) == 1 + 2 + 0 + 0.5 + 3 + 4  # Σ|W_ij| = 10.5
    batch = torch.stack([w, -2 * w, torch.zeros(2, 3, dtype=torch.float64)])
    np.testing.assert_array_equal(S.norm_1_1(batch).numpy(), [10.5, 21.0, 0.0])
    # (1,1) ≥ (2,1) ≥ Frobenius, with equality for a single nonzero column
    col = torch.zeros(4, 3, dtype=torch.float64)
    col[2, 1] = -7.0
    assert float(S.norm_1_1(col)) == float(S.norm_2_1(col)) == 7.0
    assert float(S.norm_1_1(w)) > float(S.norm_2_1(w)) > float(torch.linalg.matrix_norm(w))
    with pytest.raises(ValueError, match="matrix"):
        S.norm_1_1(torch.tensor([1.0, 2.0]))


def _argmin_p(powers, ps, scale, N):
    """Brute force with plain floats: the first p minimising (Σσᵖ)^{1/(p+2)} s^{p/(p+2)} N^{(p+1)/(p+2)}."""
    vals = [
        powers[i] ** (1 / (p + 2)) * (scale ** (p / (p + 2)) if p else 1.0) * N ** ((p + 1) / (p + 2))
        for i, p in enumerate(ps)
    ]
    return ps[int(np.argmin(vals))]


@pytest.mark.parametrize("scale", [1e-3, 0.7, 30.0, 1e12])
def test_flip_factors_are_where_the_argmin_changes(scale):
    sigma = torch.tensor([5.0, 2.0, 1.0, 0.3, 0.05], dtype=torch.float64)
    ps = [k / 4 for k in range(9)]
    N = 16
    powers = S.schatten_powers(sigma, ps)
    down, up = (float(x) for x in S.flip_factors(powers, ps, scale, N))
    pw = powers.tolist()
    p_star = _argmin_p(pw, ps, scale, N)
    assert 0.0 <= down <= 1.0 <= up
    if down > 0:  # just below κ↓ a larger p wins, just above it p* still does
        assert _argmin_p(pw, ps, scale * down * (1 - 1e-9), N) > p_star
        assert _argmin_p(pw, ps, scale * down * (1 + 1e-9), N) == p_star
    else:
        assert p_star == ps[-1]
    if math.isfinite(up):
        assert _argmin_p(pw, ps, scale * up * (1 + 1e-9), N) < p_star
        assert _argmin_p(pw, ps, scale * up * (1 - 1e-9), N) == p_star
    else:
        assert p_star == 0.0


def test_flip_factor_of_rank_one_matrix_by_hand():
    """σ = (s₁): c(0) = √N and c(p) = (s₁ s)^{p/(p+2)} N^{(p+1)/(p+2)}, so c(p) < c(0)
    ⟺ (s₁ s)^{p/(p+2)} < N^{1/2 − (p+1)/(p+2)} = N^{−p/(2(p+2))} ⟺ s₁ s < N^{−1/2}, for every p > 0: κ↓ = N^{−1/2}/(s₁ s)."""
    s1, N = 2.0, 9
    ps = [0.0, 0.5, 1.0, 2.0]
    powers = S.schatten_powers(torch.tensor([s1], dtype=torch.float64), ps)
    scale = 10.0
    down, up = S.flip_factors(powers, ps, scale, N)
    assert float(down) == pytest.approx((N**-0.5 / s1) / scale, rel=1e-12)
    assert math.isinf(float(up))
    # a zero matrix never flips (every c is 0): NaN
    zero = S.schatten_powers(torch.zeros(3, dtype=torch.float64), ps)
    assert all(math.isnan(float(x)) for x in S.flip_factors(zero, ps, scale, N))


# ---------------------------------------------------------------------------------------------------------------------
# Every tensor and count argument refused under its own name (a string, a tensor with too few dimensions, a zero count),
# each function otherwise called with valid inputs; full_dim and rank_tol reach every norm. Written against the gaps
# mutation testing found (argument names, min_dim checks and pass-through arguments that no test reached).

L_, H_, P_ = 3, 2, 4
VALID = {
    "singular_values": dict(matrix=torch.randn(4, 3)),
    "low_rank_product_spectrum": dict(left=torch.randn(5, 2), right=torch.randn(2, 4)),
    "rank_threshold": dict(sigma=torch.tensor([3.0, 1.0]), full_dim=2),
    "clean_spectrum": dict(sigma=torch.tensor([3.0, 1.0]), full_dim=2),
    "schatten_power": dict(sigma=torch.tensor([3.0, 1.0]), p=1.0, full_dim=2),
    "schatten_powers": dict(sigma=torch.tensor([3.0, 1.0]), ps=[1.0, 2.0], full_dim=2),
    "numerical_rank": dict(sigma=torch.tensor([3.0, 1.0]), full_dim=2),
    "spectral_norm": dict(sigma=torch.tensor([3.0, 1.0])),
    "frobenius_norm": dict(sigma=torch.tensor([3.0, 1.0]), full_dim=2),
    "nuclear_norm": dict(sigma=torch.tensor([3.0, 1.0]), full_dim=2),
    "norm_2_1": dict(matrix=torch.randn(4, 3)),
    "norm_1_1": dict(matrix=torch.randn(4, 3)),
    "p_grid": dict(num_layers=2, hidden_size=8, m=3),
    "layer_gain": dict(
        m_in_norm=torch.rand(L_) + 1,
        m_out_norm=torch.rand(L_) + 1,
        v_norms=torch.rand(L_, H_) + 1,
        qk_norms=torch.rand(L_, H_) + 1,
        L_phi=1.0,
    ),
    "type_factors": dict(m_in_norm=torch.rand(L_) + 1, m_out_norm=torch.rand(L_) + 1, v_norms=torch.rand(L_, H_) + 1),
    "contributions": dict(
        powers=torch.rand(2, P_) + 1,
        ps=torch.arange(P_, dtype=torch.float64),
        gamma=1.0,
        alpha=torch.ones(2),
        num_layers=2,
        hidden_size=8,
    ),
    "flip_factors": dict(
        powers=torch.rand(2, P_) + 1, ps=torch.arange(P_, dtype=torch.float64), scale=2.0, hidden_size=8
    ),
    "optimal_contribution": dict(curve=torch.rand(2, P_), ps=torch.arange(P_, dtype=torch.float64)),
    "spectrum_adaptive_bound": dict(min_contributions=torch.rand(3), num_layers=4),
    "edelman_layer_terms": dict(
        m_in_norm=torch.rand(L_),
        m_out_norm=torch.rand(L_),
        v_norms=torch.rand(L_, H_),
        qk_norms_2_1=torch.rand(L_, H_),
        v_norms_2_1=torch.rand(L_, H_),
        m_in_norm_2_1=torch.rand(L_),
        m_out_norm_2_1=torch.rand(L_),
    ),
    "edelman_bound": dict(alpha=torch.rand(L_), xi=torch.rand(L_)),
}
COUNTS = {"full_dim", "num_layers", "hidden_size", "m"}
NOT_TENSORS = COUNTS | {"p"}
# tensor arguments that must have at least this many dimensions
MIN_DIM = {
    "matrix": 2,
    "left": 2,
    "right": 2,
    "sigma": 1,
    "m_in_norm": 1,
    "m_out_norm": 1,
    "v_norms": 2,
    "qk_norms": 2,
    "powers": 1,
    "curve": 1,
    "qk_norms_2_1": 2,
    "v_norms_2_1": 2,
    "m_in_norm_2_1": 1,
    "m_out_norm_2_1": 1,
    "alpha": 1,
    "xi": 1,
}
MIN_DIM_BY_FUNCTION = {"contributions": {"alpha": 0}}  # γ and α broadcast to the batch: scalars are fine there

CASES = [(f, a) for f, kw in VALID.items() for a in kw]


def test_the_table_covers_every_public_function_with_tensor_or_count_arguments():
    public = {n for n in S.__all__ if inspect.isfunction(getattr(S, n))}
    untested = (
        public
        - set(VALID)
        - {
            "stable_rank",
            "chunk_rows",
            "streamed_gram",
            "all_finite",
            "streamed_r_factor",
            "streamed_singular_values",
            "propagation_factors",
        }
    )
    assert not untested, untested
    for name, kw in VALID.items():  # the valid calls are valid
        getattr(S, name)(**kw)


@pytest.mark.parametrize("function, arg", CASES)
def test_a_wrong_argument_is_named(function, arg):
    kw = dict(VALID[function])
    if arg in COUNTS:
        kw[arg] = 0
        with pytest.raises(ValueError, match=rf"^{arg}: "):
            getattr(S, function)(**kw)
        return
    if arg == "p":  # schatten_power's exponent: float(p), a bare conversion error (not named; noted for the lead)
        return
    kw[arg] = "not a tensor"
    with pytest.raises(TypeError, match=rf"^{arg}: "):
        getattr(S, function)(**kw)
    need = MIN_DIM_BY_FUNCTION.get(function, {}).get(arg, MIN_DIM.get(arg, 0))
    if need:
        kw[arg] = torch.ones([2] * (need - 1))  # one dimension short
        with pytest.raises(ValueError, match=rf"^{arg}: expected at least {need} dimension"):
            getattr(S, function)(**kw)


def test_full_dim_and_rank_tol_reach_every_norm_by_hand():
    sigma = torch.tensor([[2.0, 0.5, 1e-3], [0.5, 2.0, 0.0]], dtype=torch.float64)
    # τ = rank_tol · n · max(σ₁, 1): n = 3, tol 1e-3 -> τ = 6e-3 keeps 2 and 0.5; n = 300 -> τ = 0.6 keeps 2;
    # the default tol 1e-10 keeps every non-zero value
    cases = [
        (dict(full_dim=3, rank_tol=1e-3), [2.0, 0.5]),
        (dict(full_dim=300, rank_tol=1e-3), [2.0]),
        (dict(full_dim=3), [2.0, 0.5, 1e-3]),
        (dict(), [2.0, 0.5, 1e-3]),
    ]
    for kw, kept in cases:
        second = [v for v in kept if v != 1e-3]  # the second row has no 1e-3 value
        assert S.numerical_rank(sigma, **kw).tolist() == [len(kept), len(second)], kw
        assert S.nuclear_norm(sigma, **kw).tolist() == pytest.approx([sum(kept), sum(second)], rel=1e-15), kw
        fro = [sum(v * v for v in kept) ** 0.5, sum(v * v for v in second) ** 0.5]
        assert S.frobenius_norm(sigma, **kw).tolist() == pytest.approx(fro, rel=1e-15), kw
        assert S.schatten_power(sigma, 3.0, **kw).tolist() == pytest.approx(
            [sum(v**3 for v in kept), sum(v**3 for v in second)], rel=1e-15
        ), kw
        assert S.stable_rank(sigma, **kw).tolist() == pytest.approx([f * f / 4.0 for f in fro], rel=1e-15), kw
        expected_clean = sorted(kept, reverse=True) + [0.0] * (3 - len(kept))
        assert S.clean_spectrum(sigma, **kw)[0].tolist() == pytest.approx(expected_clean, rel=1e-15), kw


def test_layer_gain_and_type_factors_refuse_each_shape_mismatch_alone():
    base = VALID["layer_gain"]
    bad = {
        "m_out_norm": torch.rand(L_ + 1),
        "v_norms": torch.rand(L_ + 1, H_),
        "qk_norms": torch.rand(L_, H_ + 1),
        "m_in_norm": torch.rand(L_, 1),
    }
    for arg, value in bad.items():
        with pytest.raises(ValueError, match="expected shapes"):
            S.layer_gain(**{**base, arg: value})
        if arg != "qk_norms":
            with pytest.raises(ValueError, match="expected shapes"):
                S.type_factors(**{k: v for k, v in {**base, arg: value}.items() if k in VALID["type_factors"]})
    for L_phi in (0.0, -1.0, [1.0, 2.0]):
        with pytest.raises(ValueError, match=r"^L_phi: expected a positive scalar"):
            S.layer_gain(**{**base, "L_phi": L_phi})
    # by hand: f_k = L_φ ‖M_in‖ ‖M_out‖ Σ_h ‖V_h‖ (1 + 4‖QK_h‖)
    f = S.layer_gain([2.0], [3.0], [[1.0, 0.5]], [[0.25, 1.0]], L_phi=0.5)
    assert f.tolist() == pytest.approx([0.5 * 2 * 3 * (1.0 * 2.0 + 0.5 * 5.0)])


def test_edelman_bound_refuses_each_negative_input_alone_and_accepts_zeros_by_hand():
    for alpha, xi in (([-1.0, 1.0], [1.0, 1.0]), ([1.0, 1.0], [1.0, -1e-9])):
        with pytest.raises(ValueError, match=r"^alpha/xi: must be >= 0"):
            S.edelman_bound(alpha, xi)
    assert float(S.edelman_bound([0.0, 0.0], [0.0, 0.0])) == 1.0
    # (1 + Σ α^{2/3} ξ)^{3/2} with α = (8, 0), ξ = (0.5, 3): (1 + 4·0.5)^{3/2} = 3^{3/2}
    assert float(S.edelman_bound([8.0, 0.0], [0.5, 3.0])) == pytest.approx(3.0**1.5, rel=1e-14)


def test_contributions_refuse_negative_powers_and_factors_one_at_a_time():
    kw = VALID["contributions"]
    with pytest.raises(ValueError, match=r"^powers: Schatten powers must be >= 0"):
        S.contributions(**{**kw, "powers": -kw["powers"]})
    for arg in ("gamma", "alpha"):
        with pytest.raises(ValueError, match=r"^gamma/alpha: factors must be >= 0"):
            S.contributions(**{**kw, arg: -1.0})
    # zero factors are allowed: c(W, 0) = (Σσ⁰)^{1/2} N^{1/2} (x⁰ = 1), c(W, p > 0) = 0
    c = S.contributions(torch.tensor([4.0, 9.0]), [0.0, 1.0], gamma=1.0, alpha=0.0, num_layers=2, hidden_size=9)
    assert c.tolist() == pytest.approx([2.0 * 3.0, 0.0])


def test_flip_factors_of_a_batch_are_each_spectrums_own():
    g = torch.Generator().manual_seed(3)
    ps = torch.arange(5, dtype=torch.float64)
    powers = torch.rand(3, 5, generator=g, dtype=torch.float64) * torch.tensor([[1.0], [50.0], [1e3]]) + 0.1
    scale = torch.tensor([0.5, 2.0, 30.0], dtype=torch.float64)
    down, up = S.flip_factors(powers, ps, scale, hidden_size=16)
    for i in range(3):
        d1, u1 = S.flip_factors(powers[i], ps, scale[i], hidden_size=16)
        assert float(down[i]) == float(d1) and float(up[i]) == float(u1)
    assert len({float(v) for v in down}) + len({float(v) for v in up}) > 2  # the rows really differ


def test_empty_and_one_column_matrices_and_spectra_by_hand():
    for shape in ((2, 0, 3), (2, 3, 0)):  # no singular values, per matrix of the batch
        assert S.singular_values(torch.zeros(shape)).shape == (2, 0)
    assert S.spectral_norm(torch.zeros(2, 0)).tolist() == [0.0, 0.0]
    assert S.rank_threshold(torch.zeros(2, 0), full_dim=4, rank_tol=0.25).tolist() == [1.0, 1.0]  # tol · n
    # one column / one row: σ = the vector's length
    assert S.singular_values(torch.tensor([[3.0], [4.0]])).tolist() == pytest.approx([5.0])
    assert S.singular_values(torch.tensor([[3.0, 4.0]]), method="svd").tolist() == pytest.approx([5.0])
    assert S.spectral_norm(torch.tensor([[2.5]])).tolist() == [2.5]
    assert S.rank_threshold(torch.tensor([[2.5]]), rank_tol=0.5).tolist() == [1.25]


def test_rank_tol_bounds_and_per_matrix_thresholds():
    sigma = torch.tensor([[3.0, 1.0], [0.5, 0.1]])
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"^rank_tol: "):
            S.rank_threshold(sigma, rank_tol=bad)
    assert S.rank_threshold(sigma, rank_tol=0.0).tolist() == [0.0, 0.0]
    # τ = tol · n · max(σ₁, 1) per row: 0.1 · 2 · 3 and 0.1 · 2 · 1
    assert S.rank_threshold(sigma, rank_tol=0.1).tolist() == pytest.approx([0.6, 0.2])


def test_stable_rank_of_a_spectrum_below_one_and_of_zero():
    # ‖W‖_F² / ‖W‖₂² = (0.25 + 0.0625) / 0.25
    assert S.stable_rank(torch.tensor([0.5, 0.25])).tolist() == pytest.approx(1.25)
    assert S.stable_rank(torch.tensor([0.0, 0.0])).tolist() == 0.0


def test_a_non_numeric_argument_is_named_with_what_was_expected():
    with pytest.raises(TypeError, match=r"^matrix: expected a torch.Tensor or numpy array, got str"):
        S.norm_2_1("x")
    with pytest.raises(TypeError, match=r"^matrix: expected a numeric tensor/array, got list"):
        S.norm_2_1([["a", "b"]])
    with pytest.raises(TypeError, match=r"^matrix: expected a torch.Tensor or numpy array, got bool"):
        S.norm_2_1(True)
    with pytest.raises(TypeError, match=r"^matrix: expected a real floating tensor, got a boolean array"):
        S.norm_2_1(np.eye(3, dtype=bool))
    with pytest.raises(TypeError, match=r"^ps: expected a real floating tensor, got a boolean array"):
        S.schatten_powers(torch.ones(2), np.array([True]))


def test_empty_spectra_with_two_batch_dims_keep_the_batch_shape():
    empty = torch.zeros(2, 3, 0)
    assert S.rank_threshold(empty, full_dim=5, rank_tol=0.1).shape == (2, 3)
    assert S.spectral_norm(empty).shape == (2, 3)
    assert S.singular_values(torch.zeros(2, 3, 4, 0)).shape == (2, 3, 0)
