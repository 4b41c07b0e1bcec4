"""Coding rates / SRR measures against naive references, identities and hand-worked values."""

import math

import numpy as np
import pytest
import torch

from hf_tdiag.measures import (
    coding_rate,
    compression_rate,
    compression_rate_from_projections,
    head_projections,
    logdet_identity_plus_gram,
    sparse_rate_reduction,
    sparsity,
    srr_terms,
)

# ---------------------------------------------------------------------------
# naive references: explicit loops, token-side (N x N) log-determinants, numpy
# ---------------------------------------------------------------------------


def _token_side_logdet(A: np.ndarray, c: float) -> float:
    n = A.shape[0]
    sign, val = np.linalg.slogdet(np.eye(n) + c * A @ A.T)
    assert sign > 0
    return val


def naive_R(Z: np.ndarray, eps: float) -> np.ndarray:
    *batch, N, d = Z.shape
    flat = Z.reshape(-1, N, d)
    out = [0.5 * _token_side_logdet(flat[i], d / (N * eps**2)) for i in range(flat.shape[0])]
    return np.array(out).reshape(batch)


def naive_Rc(Z: np.ndarray, U: np.ndarray, eps: float) -> np.ndarray:
    *batch, N, d = Z.shape
    K, _, p = U.shape
    flat = Z.reshape(-1, N, d)
    out = []
    for i in range(flat.shape[0]):
        total = 0.0
        for k in range(K):
            total += 0.5 * _token_side_logdet(flat[i] @ U[k], p / (N * eps**2))
        out.append(total)
    return np.array(out).reshape(batch)


def naive_sparsity(Z: np.ndarray) -> np.ndarray:
    *batch, N, d = Z.shape
    flat = Z.reshape(-1, N, d)
    out = []
    for i in range(flat.shape[0]):
        nnz = 0
        for t in range(N):
            for j in range(d):
                nnz += flat[i, t, j] != 0
        out.append(nnz / (d * N))
    return np.array(out).reshape(batch)


CASES = [
    # (batch, N, d, K, p)
    ((3,), 5, 12, 3, 4),  # N < d, N > p, pK = d
    ((2,), 20, 8, 2, 3),  # N > d, p < d, pK < d
    ((2, 2), 7, 6, 4, 2),  # several batch dims, pK > d (overlapping subspaces)
    ((1,), 9, 9, 1, 9),  # N = d = p
]


@pytest.mark.parametrize("batch,N,d,K,p", CASES)
@pytest.mark.parametrize("eps", [0.1, 0.5])
def test_against_naive_reference(batch, N, d, K, p, eps):
    Z = torch.randn(*batch, N, d, dtype=torch.float64)
    Z[Z.abs() < 0.3] = 0.0  # some exact zeros for the sparsity term
    U = torch.randn(K, d, p, dtype=torch.float64) / math.sqrt(d)
    Zn, Un = Z.numpy(), U.numpy()
    R_ref, Rc_ref, sp_ref = naive_R(Zn, eps), naive_Rc(Zn, Un, eps), naive_sparsity(Zn)

    R = coding_rate(Z, eps=eps)
    Rc = compression_rate(Z, U, eps=eps)
    sp = sparsity(Z)
    assert R.shape == Z.shape[:-2] and Rc.shape == Z.shape[:-2] and sp.shape == Z.shape[:-2]
    assert R.dtype == torch.float64
    np.testing.assert_allclose(R.numpy(), R_ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(Rc.numpy(), Rc_ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(sp.numpy(), sp_ref, rtol=0, atol=1e-15)
    for lam in (0.0, 1.0, 2.5):
        np.testing.assert_allclose(
            sparse_rate_reduction(Z, U, eps=eps, lam=lam).numpy(), Rc_ref - R_ref + lam * sp_ref, rtol=1e-10, atol=1e-9
        )


@pytest.mark.parametrize("n,m", [(4, 9), (9, 4), (6, 6)])
def test_gram_side_identity(n, m):
    A = torch.randn(2, n, m, dtype=torch.float64)
    c = 3.7
    token_side = torch.logdet(torch.eye(n, dtype=torch.float64) + c * A @ A.transpose(-1, -2))
    feature_side = torch.logdet(torch.eye(m, dtype=torch.float64) + c * A.transpose(-1, -2) @ A)
    ours = logdet_identity_plus_gram(A, c)
    torch.testing.assert_close(token_side, feature_side, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours, token_side, rtol=1e-10, atol=1e-10)
    # transposing A leaves the value unchanged
    torch.testing.assert_close(logdet_identity_plus_gram(A.transpose(-1, -2), c), ours, rtol=1e-10, atol=1e-10)


def test_hand_worked_rank_one_and_zero():
    # Z = x yᵀ has ZᵀZ = ‖x‖² y yᵀ, so R = ½ log(1 + d/(Nε²) ‖x‖²‖y‖²)
    x = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)  # N = 3
    y = torch.tensor([0.5, 0.0, -1.0, 2.0], dtype=torch.float64)  # d = 4
    Z = torch.outer(x, y)
    eps = 0.5
    expected = 0.5 * math.log(1 + 4 / (3 * eps**2) * 5.0 * 5.25)
    assert coding_rate(Z, eps=eps).item() == pytest.approx(expected, rel=1e-12)
    # sparsity: x has one zero (row of 4 zeros), y one zero (column of 3 zeros) -> 2*3 = 6 nonzeros of 12
    assert sparsity(Z).item() == pytest.approx(6 / 12)
    # one head: U = e_1 (d x 1) -> A = 0.5 x, Rc = ½ log(1 + 1/(Nε²) 0.25 ‖x‖²)
    U = torch.zeros(1, 4, 1, dtype=torch.float64)
    U[0, 0, 0] = 1.0
    assert compression_rate(Z, U, eps=eps).item() == pytest.approx(
        0.5 * math.log(1 + 1 / (3 * eps**2) * 0.25 * 5), rel=1e-12
    )
    # zero matrix: rates are 0, sparsity 0
    Z0 = torch.zeros(2, 5, 4)
    assert torch.equal(coding_rate(Z0), torch.zeros(2, dtype=torch.float64))
    assert torch.equal(compression_rate(Z0, U.float()), torch.zeros(2, dtype=torch.float64))
    assert torch.equal(sparsity(Z0), torch.zeros(2, dtype=torch.float64))


def test_rank_deficient_inputs_are_finite_and_match_reference():
    # rank-2 Z with N > d and N < d, and repeated tokens
    B = torch.randn(2, 40, 2, dtype=torch.float64) @ torch.randn(2, 2, 10, dtype=torch.float64)
    U = torch.linalg.qr(torch.randn(10, 10, dtype=torch.float64))[0].reshape(10, 5, 2).permute(1, 0, 2)
    for Z in (B, B[:, :3], B[:, :1].expand(2, 30, 10)):
        np.testing.assert_allclose(coding_rate(Z).numpy(), naive_R(Z.numpy(), 0.1), rtol=1e-9)
        np.testing.assert_allclose(compression_rate(Z, U).numpy(), naive_Rc(Z.numpy(), U.numpy(), 0.1), rtol=1e-9)


def test_projection_variant_and_terms_agree():
    Z = torch.randn(4, 11, 12, dtype=torch.float64)
    U = torch.randn(3, 12, 4, dtype=torch.float64)
    A = head_projections(Z, U)
    assert A.shape == (4, 3, 11, 4)
    for k in range(3):
        torch.testing.assert_close(A[:, k], Z @ U[k])
    torch.testing.assert_close(compression_rate_from_projections(A), compression_rate(Z, U))
    t1 = srr_terms(Z, U, lam=0.7)
    t2 = srr_terms(Z, projections=A, lam=0.7)
    for key in ("R", "Rc", "sparsity", "srr"):
        torch.testing.assert_close(t1[key], t2[key])
    torch.testing.assert_close(t1["srr"], t1["Rc"] - t1["R"] + 0.7 * t1["sparsity"])


@pytest.mark.parametrize("N,d", [(4, 6), (7, 3)])
def test_gradcheck(N, d):
    Z = torch.randn(1, N, d, dtype=torch.float64, requires_grad=True)
    U = torch.randn(2, d, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: coding_rate(z, eps=0.5), (Z,))
    assert torch.autograd.gradcheck(lambda z, u: sparse_rate_reduction(z, u, eps=0.5, lam=1.0), (Z, U))
    A = head_projections(Z.detach(), U.detach()).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a: compression_rate_from_projections(a, eps=0.5), (A,))


def test_gradient_flows_to_low_precision_leaf_and_sparsity_has_none():
    Z = torch.randn(2, 5, 8, dtype=torch.float32, requires_grad=True)
    U = torch.randn(2, 8, 4, dtype=torch.float32, requires_grad=True)
    sparse_rate_reduction(Z, U).sum().backward()
    assert Z.grad is not None and Z.grad.dtype == torch.float32 and torch.isfinite(Z.grad).all()
    assert U.grad is not None and U.grad.abs().sum() > 0
    assert not sparsity(Z).requires_grad


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs(dtype):
    Z = torch.randn(3, 10, 16).to(dtype)
    U = torch.randn(4, 16, 4).to(dtype)
    exact = sparse_rate_reduction(Z.double(), U.double())
    out = sparse_rate_reduction(Z, U)
    assert out.dtype == torch.float64
    # projections in float32, Grams and log-determinants in float64
    torch.testing.assert_close(out, exact, rtol=1e-6, atol=1e-6)


def test_errors_name_the_argument():
    Z = torch.randn(2, 5, 6)
    U = torch.randn(2, 6, 3)
    with pytest.raises(ValueError, match="Z: contains NaN"):
        coding_rate(torch.full((2, 5, 6), float("nan")))
    bad = Z.clone()
    bad[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="Z: contains NaN or inf"):
        sparse_rate_reduction(bad, U)
    with pytest.raises(ValueError, match=r"U: expected shape \(K, d=6, p\)"):
        compression_rate(Z, torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match="U: expected"):
        compression_rate(Z, torch.randn(6, 3))
    with pytest.raises(ValueError, match="Z: expected"):
        coding_rate(torch.randn(6))
    with pytest.raises(TypeError, match="Z: expected a floating tensor"):
        coding_rate(torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="Z: expected a torch.Tensor"):
        coding_rate(np.ones((2, 3)))
    with pytest.raises(ValueError, match="eps"):
        coding_rate(Z, eps=0.0)
    with pytest.raises(ValueError, match="lam"):
        sparse_rate_reduction(Z, U, lam=float("nan"))
    with pytest.raises(ValueError, match="projections"):
        srr_terms(Z, projections=torch.randn(2, 2, 4, 3))
    with pytest.raises(ValueError, match="exactly one"):
        srr_terms(Z)


# ---------------------------------------------------------------------------
# Hu, Zou & Xu (2024), Figure 1: CRATE-C's MSSA step raises Rᶜ, CRATE-N's lowers it
# ---------------------------------------------------------------------------


def _mssa(Z: torch.Tensor, U: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """Z (N, d), U (K, d, p), output (d, K*p): output @ concat_k[ softmax(A_k A_kᵀ/√p) A_k ]."""
    K, d, p = U.shape
    heads = []
    for k in range(K):
        A = Z @ U[k]
        heads.append(torch.softmax(A @ A.T / math.sqrt(p), dim=-1) @ A)
    return torch.cat(heads, dim=-1) @ output.T


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_crate_c_step_raises_compression_term_crate_n_lowers_it(seed):
    g = torch.Generator().manual_seed(seed)
    d, K, p, N, eta = 16, 4, 4, 24, 0.5
    Q = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
    U = Q.reshape(d, K, p).permute(1, 0, 2).contiguous()  # orthonormal blocks U_k (d x p)
    U_cat = U.permute(1, 0, 2).reshape(d, K * p)  # [U_1 ... U_K]
    # tokens near a union of subspaces: each token lives mostly in one U_k
    labels = torch.randint(0, K, (N,), generator=g)
    Z = torch.stack([U[labels[i]] @ torch.randn(p, generator=g, dtype=torch.float64) for i in range(N)])
    Z = Z + 0.05 * torch.randn(N, d, generator=g, dtype=torch.float64)
    before = compression_rate(Z, U).item()
    after_c = compression_rate(Z + eta * _mssa(Z, U, U_cat), U).item()  # CRATE-C: output matrix U
    after_n = compression_rate(Z + eta * _mssa(Z, U, -U_cat), U).item()  # CRATE-N: output matrix -U
    assert after_c > before + 1e-3
    assert after_n < before - 1e-3


def test_token_mask_equals_measuring_only_the_kept_tokens():
    Z = torch.randn(3, 9, 6, dtype=torch.float64)
    Z[Z.abs() < 0.4] = 0.0
    U = torch.randn(2, 6, 2, dtype=torch.float64)
    lengths = [9, 4, 2]  # padded batch: sample i keeps its first lengths[i] tokens
    mask = torch.zeros(3, 9, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    Zpad = Z.clone()
    Zpad[~mask] = 123.0  # padding content must not matter
    terms = srr_terms(Zpad, U, token_mask=mask, lam=0.3)
    for i, n in enumerate(lengths):
        Zi = Z[i, :n].numpy()
        assert terms["R"][i].item() == pytest.approx(naive_R(Zi[None], 0.1)[0], rel=1e-10)
        assert terms["Rc"][i].item() == pytest.approx(naive_Rc(Zi[None], U.numpy(), 0.1)[0], rel=1e-10)
        assert terms["sparsity"][i].item() == pytest.approx(naive_sparsity(Zi[None])[0], rel=1e-12)
    torch.testing.assert_close(compression_rate(Zpad, U, token_mask=mask), terms["Rc"])
    torch.testing.assert_close(coding_rate(Zpad, token_mask=mask.long()), terms["R"])
    torch.testing.assert_close(
        compression_rate_from_projections(head_projections(Zpad, U), token_mask=mask), terms["Rc"]
    )
    with pytest.raises(ValueError, match="token_mask: expected shape"):
        coding_rate(Z, token_mask=mask[:, :3])
    with pytest.raises(ValueError, match="at least one"):
        coding_rate(Z, token_mask=torch.zeros(3, 9))


def test_unit_tokens_and_official_compression_rate():
    from hf_tdiag.measures.coding_rate import official_compression_rate, unit_tokens

    A = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    A[0, 1, 2] = 0.0  # an all-zero token stays zero instead of becoming NaN
    Ahat = unit_tokens(A)
    norms = Ahat.norm(dim=-1)
    assert torch.allclose(norms[norms > 0], torch.ones_like(norms[norms > 0])) and float(norms[0, 1, 2]) == 0.0
    # scale-invariant per token, and Σ_k ½ logdet(I + p/(Nε²) Âₖ Âₖᵀ) on the token side by hand
    scaled = A * torch.rand(2, 3, 5, 1, dtype=torch.float64).add(0.5)
    value = official_compression_rate(A, eps=0.1)
    torch.testing.assert_close(value, official_compression_rate(scaled, eps=0.1))
    eye = torch.eye(5, dtype=torch.float64)
    by_hand = 0.5 * torch.linalg.slogdet(eye + 4 / (5 * 0.01) * Ahat @ Ahat.transpose(-1, -2))[1].sum(-1)
    torch.testing.assert_close(value, by_hand)


def test_float32_gram_path_agrees_with_float64_and_falls_back_when_ill_conditioned(monkeypatch):
    import importlib

    cr = importlib.import_module("hf_tdiag.measures.coding_rate")  # the package exports a function of that name
    seen = []
    gram = cr._gram
    monkeypatch.setattr(cr, "_gram", lambda A: seen.append(A.dtype) or gram(A))
    g = torch.Generator().manual_seed(0)
    # well conditioned (independent Gaussian tokens): float32 Gram + Cholesky, within 1e-6 of float64
    for shape, c in (((3, 40, 200), 200 / (40 * 0.01)), ((2, 6, 64, 16), 16 / (64 * 0.01))):
        A = torch.randn(*shape, generator=g)
        seen.clear()
        auto = cr.logdet_identity_plus_gram(A, c)
        assert seen == [torch.float32]
        exact = cr.logdet_identity_plus_gram(A, c, precision="float64")
        assert auto.dtype == torch.float64
        torch.testing.assert_close(auto, exact, rtol=1e-6, atol=0)
        # the error estimate the guard uses is an upper estimate of the error actually made
        mat = gram(A).mul_(c)
        torch.diagonal(mat, dim1=-2, dim2=-1).add_(1.0)
        estimate = cr.float32_gram_error(mat, torch.linalg.cholesky(mat), inner=max(A.shape[-2:]))
        assert bool(((auto - exact).abs() <= estimate).all())
    # nearly collinear tokens (one direction + 1e-4 noise) and a large scale: I + c·Gram is ill conditioned,
    # the float32 result would be off; the guard recomputes in float64
    direction = torch.randn(1, 1, 200, generator=g)
    A = direction.expand(2, 40, 200) + 1e-4 * torch.randn(2, 40, 200, generator=g)
    seen.clear()
    auto = cr.logdet_identity_plus_gram(A, 1e6)
    assert seen == [torch.float32, torch.float64]
    exact = cr.logdet_identity_plus_gram(A.double(), 1e6)
    torch.testing.assert_close(auto, exact, rtol=1e-6, atol=0)
    # float64 inputs and inputs that need a gradient (the regulariser) never take the float32 path
    seen.clear()
    cr.logdet_identity_plus_gram(torch.randn(2, 10, 5, dtype=torch.float64), 1.0)
    cr.logdet_identity_plus_gram(torch.randn(2, 10, 5, requires_grad=True), 1.0)
    assert seen == [torch.float64, torch.float64]
    with pytest.raises(ValueError, match="precision"):
        cr.logdet_identity_plus_gram(A, 1.0, precision="float16")


# ---------------------------------------------------------------------------
# gaps found by mutation testing (scripts/mutation.sh): defaults, pass-through arguments, dtypes, the error estimate
# ---------------------------------------------------------------------------


def test_every_public_rate_refuses_non_finite_inputs_by_default_and_skips_the_check_on_request():
    from hf_tdiag.measures.coding_rate import official_compression_rate, unit_tokens

    Z = torch.randn(2, 5, 4, dtype=torch.float64)
    U = torch.randn(2, 4, 2, dtype=torch.float64)
    Z[1, 2, 3] = math.nan
    A = head_projections(Z.nan_to_num(), U).clone()
    A[0, 1, 0, 0] = math.inf
    U_nan = U.clone()
    U_nan[1, 0, 1] = math.nan
    calls = {
        "coding_rate": lambda **kw: coding_rate(Z, **kw),
        "sparsity": lambda **kw: sparsity(Z, **kw),
        "compression_rate, NaN in U": lambda **kw: compression_rate(Z.nan_to_num(), U_nan, **kw),
        "head_projections, NaN in U": lambda **kw: head_projections(Z.nan_to_num(), U_nan, **kw),
        "compression_rate": lambda **kw: compression_rate(Z, U, **kw),
        "head_projections": lambda **kw: head_projections(Z, U, **kw),
        "compression_rate_from_projections": lambda **kw: compression_rate_from_projections(A, **kw),
        "unit_tokens": lambda **kw: unit_tokens(A, **kw),
        "official_compression_rate": lambda **kw: official_compression_rate(A, **kw),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="NaN|inf|finite"):
            call()
        try:  # the caller vouches for the values: no check; a non-finite result or a failure inside linear algebra
            out = call(check_finite=False)
        except RuntimeError as err:  # torch.linalg's LinAlgError, not the argument check's ValueError
            assert not isinstance(err, ValueError), name
        else:
            assert name == "sparsity" or not bool(torch.isfinite(out).all()), name  # sparsity: a count (below)
    with pytest.raises(ValueError, match=r"^U: "):  # srr_terms has no switch: U is always checked
        srr_terms(Z.nan_to_num(), U_nan)
    # sparsity with the check off still counts the NaN entry as non-zero: 1 + the non-zeros of a Gaussian sample
    assert float(sparsity(Z, check_finite=False)[1]) == pytest.approx(float((Z[1] != 0).sum()) / 20)


def test_sparsity_and_the_official_rate_honour_the_token_mask_and_eps():
    from hf_tdiag.measures.coding_rate import official_compression_rate

    g = torch.Generator().manual_seed(7)
    Z = torch.randn(2, 6, 5, generator=g, dtype=torch.float64)
    Z[0, :3] = 0.0  # the first sample's first three tokens are all zero
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    got = sparsity(Z, token_mask=mask)
    # ‖Z‖₀ / (d·N) over the kept tokens only, by hand: sample 0 keeps its three non-zero tokens -> 1
    assert got.tolist() == pytest.approx([1.0, float((Z[1, :4] != 0).sum()) / 20])
    assert float(sparsity(Z)[0]) == pytest.approx(0.5)
    # official Rᶜ with a mask and ε = 0.3: token side ½ logdet(I + p/(N'ε²) Â Âᵀ) over the N' kept tokens
    A = torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64)
    value = official_compression_rate(A, eps=0.3, token_mask=mask)
    for b in range(2):
        kept = A[b][:, mask[b]]
        Ahat = kept / kept.norm(dim=-1, keepdim=True)
        n = kept.shape[1]
        eye = torch.eye(n, dtype=torch.float64)
        by_hand = 0.5 * torch.linalg.slogdet(eye + 4 / (n * 0.09) * Ahat @ Ahat.transpose(-1, -2))[1].sum()
        assert float(value[b]) == pytest.approx(float(by_hand), rel=1e-10)
    # the default ε is 0.1
    eye = torch.eye(6, dtype=torch.float64)
    Ahat = A / A.norm(dim=-1, keepdim=True)
    default = 0.5 * torch.linalg.slogdet(eye + 4 / (6 * 0.01) * Ahat @ Ahat.transpose(-1, -2))[1].sum(-1)
    torch.testing.assert_close(official_compression_rate(A), default)


def test_the_precision_argument_reaches_the_log_determinants():
    from hf_tdiag.measures.coding_rate import official_compression_rate

    Z = torch.randn(2, 5, 4)
    U = torch.randn(2, 4, 2)
    for call in (
        lambda p: compression_rate(Z, U, precision=p),
        lambda p: coding_rate(Z, precision=p),
        lambda p: official_compression_rate(head_projections(Z, U), precision=p),
        lambda p: compression_rate_from_projections(head_projections(Z, U), precision=p),
    ):
        with pytest.raises(ValueError, match="precision"):
            call("float16")
        torch.testing.assert_close(call("float64"), call("auto"), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "dtype, expected",
    [
        (torch.float64, torch.float64),
        (torch.float32, torch.float32),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
    ],
)
def test_unit_tokens_computes_in_float64_for_float64_else_float32(dtype, expected):
    from hf_tdiag.measures.coding_rate import unit_tokens

    A = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]], dtype=dtype)
    out = unit_tokens(A)
    assert out.dtype == expected
    torch.testing.assert_close(
        out.double(),
        torch.tensor([[0.6, 0.8], [0.0, 0.0], [1.0, 0.0]], dtype=torch.float64),
        rtol=1e-3 if dtype in (torch.float16, torch.bfloat16) else 1e-7,
        atol=0,
    )


def test_float32_gram_error_is_the_documented_hutchinson_estimate():
    import importlib

    cr = importlib.import_module("hf_tdiag.measures.coding_rate")
    g = torch.Generator().manual_seed(5)
    k, m = 6, 30
    A = torch.randn(3, m, k, generator=g) * torch.tensor([1.0, 3.0, 10.0])[:, None, None]
    mat = A.transpose(-1, -2) @ A * 0.7
    torch.diagonal(mat, dim1=-2, dim2=-1).add_(1.0)
    estimate = cr.float32_gram_error(mat, torch.linalg.cholesky(mat), inner=m)
    # u (√m + √k + 2) · mean_j z_jᵀ H⁻¹ z_j with H = D^{-½} mat D^{-½}, in float64, same fixed ±1 probes z_j
    z = cr._rademacher(k, "cpu").double()
    assert set(z.unique().tolist()) == {-1.0, 1.0}
    for b in range(3):
        M = mat[b].double()
        d = M.diagonal().rsqrt()
        H = d[:, None] * M * d[None, :]
        hutchinson = float((z * torch.linalg.solve(H, z)).sum(0).mean())
        expected = 2.0**-24 * (math.sqrt(m) + math.sqrt(k) + 2.0) * hutchinson
        assert float(estimate[b]) == pytest.approx(expected, rel=1e-4)
    # a float64 matrix gives the same estimate (the solve runs in float32 either way)
    mat64 = mat.double()
    torch.testing.assert_close(
        cr.float32_gram_error(mat64, torch.linalg.cholesky(mat64), inner=m), estimate, rtol=1e-4, atol=0
    )
    # Hutchinson's estimate is unbiased for tr(H⁻¹); with this many probes within 30% on this well-scaled matrix
    M = mat[0].double()
    d = M.diagonal().rsqrt()
    trace = float(torch.linalg.inv(d[:, None] * M * d[None, :]).trace())
    assert float(estimate[0]) / (2.0**-24 * (math.sqrt(m) + math.sqrt(k) + 2.0)) == pytest.approx(trace, rel=0.3)


def test_srr_defaults_mask_and_argument_names_by_hand():
    g = torch.Generator().manual_seed(8)
    Z = torch.randn(2, 7, 6, generator=g, dtype=torch.float64)
    Z[Z.abs() < 0.3] = 0.0  # a sparsity that is neither 0 nor 1
    U = torch.randn(3, 6, 2, generator=g, dtype=torch.float64)
    z, u = Z.numpy(), U.numpy()
    # defaults ε = 0.1, λ = 1: Rᶜ − R + sparsity
    expected = naive_Rc(z, u, 0.1) - naive_R(z, 0.1) + naive_sparsity(z)
    np.testing.assert_allclose(sparse_rate_reduction(Z, U).numpy(), expected, rtol=1e-10)
    terms = srr_terms(Z, U)
    np.testing.assert_allclose(terms["srr"].numpy(), expected, rtol=1e-10)
    # a mask: every term over the kept tokens only (N = their count)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[0, 5:] = False
    mask[1, :2] = False
    got = sparse_rate_reduction(Z, U, eps=0.4, lam=0.5, token_mask=mask)
    for b in range(2):
        kept = z[b][mask[b].numpy()][None]
        ref = naive_Rc(kept, u, 0.4) - naive_R(kept, 0.4) + 0.5 * naive_sparsity(kept)
        assert float(got[b]) == pytest.approx(float(ref[0]), rel=1e-10)
    with pytest.raises(ValueError, match="precision"):
        sparse_rate_reduction(Z, U, precision="float16")
    with pytest.raises(ValueError, match=r"^lam: "):
        srr_terms(Z, U, lam=math.nan)
    with pytest.raises(ValueError, match=r"^eps: "):
        srr_terms(Z, U, eps=-1.0)


def test_srr_terms_pass_precision_to_both_rates_and_take_projections_with_several_batch_dims():
    g = torch.Generator().manual_seed(9)
    Z = torch.randn(2, 3, 20, 6, generator=g)  # float32: "auto" would form the Grams in float32
    U = torch.randn(2, 6, 3, generator=g)
    A = head_projections(Z, U)
    terms = srr_terms(Z, U, precision="float64")
    # float64 log-determinants of the float32 states / projections, to float64 round-off
    torch.testing.assert_close(terms["R"], coding_rate(Z.double()), rtol=1e-12, atol=0)
    torch.testing.assert_close(terms["Rc"], compression_rate_from_projections(A.double()), rtol=1e-12, atol=0)
    # projections (B1, B2, K, N, p) reused from a forward: the same four terms as from U
    reused = srr_terms(Z, projections=A, precision="float64")
    for key in ("R", "Rc", "sparsity", "srr"):
        torch.testing.assert_close(reused[key], terms[key], rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="projections: expected shape"):
        srr_terms(Z, projections=A[..., :5, :])


def test_eps_whose_square_under_or_overflows_is_refused():
    Z = torch.randn(1, 4, 3, dtype=torch.float64)
    for eps in (1e-200, 1e200):  # ε² is 0 or inf in float64
        with pytest.raises(ValueError, match=r"^eps: expected a value whose square"):
            coding_rate(Z, eps=eps)
    assert math.isfinite(float(coding_rate(Z, eps=1e-100)[0])) and math.isfinite(float(coding_rate(Z, eps=1e100)[0]))


def test_no_subspace_and_fractional_masks_are_refused():
    Z = torch.randn(2, 4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"K >= 1"):
        compression_rate(Z, torch.empty(0, 3, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="booleans or 0/1"):
        coding_rate(Z, token_mask=torch.full((2, 4), 0.5))
    torch.testing.assert_close(coding_rate(Z, token_mask=torch.ones(2, 4)), coding_rate(Z))  # 0/1 floats are fine
    # a (B1, B2, N) mask: each of the four samples needs a kept token of its own
    Z4 = torch.randn(2, 2, 4, 3, dtype=torch.float64)
    mask = torch.ones(2, 2, 4, dtype=torch.bool)
    mask[0, 1] = False
    with pytest.raises(ValueError, match="every sample needs at least one unmasked token"):
        coding_rate(Z4, token_mask=mask)


def test_masks_with_several_batch_dims_count_each_samples_own_tokens():
    g = torch.Generator().manual_seed(12)
    Z = torch.randn(2, 3, 6, 5, generator=g, dtype=torch.float64)
    Z[Z.abs() < 0.4] = 0.0
    U = torch.randn(2, 5, 2, generator=g, dtype=torch.float64)
    mask = torch.rand(2, 3, 6, generator=g) < 0.6
    mask[..., 0] = True
    R, Rc, S = coding_rate(Z, 0.3, mask), compression_rate(Z, U, 0.3, mask), sparsity(Z, mask)
    Rc_proj = compression_rate_from_projections(head_projections(Z, U), 0.3, mask)
    for i in range(2):
        for j in range(3):
            kept = Z[i, j][mask[i, j]].numpy()[None]
            assert float(R[i, j]) == pytest.approx(float(naive_R(kept, 0.3)[0]), rel=1e-10)
            assert float(Rc[i, j]) == pytest.approx(float(naive_Rc(kept, U.numpy(), 0.3)[0]), rel=1e-10)
            assert float(Rc_proj[i, j]) == pytest.approx(float(Rc[i, j]), rel=1e-10)
            assert float(S[i, j]) == pytest.approx(float(naive_sparsity(kept)[0]), rel=1e-12)
    # one head (K = 1) with a mask
    one = compression_rate_from_projections(head_projections(Z, U[:1]), 0.3, mask)
    torch.testing.assert_close(one, compression_rate(Z, U[:1], 0.3, mask))


def test_float32_states_with_a_mask_match_float64_and_projections_keep_float32():
    g = torch.Generator().manual_seed(13)
    Z = torch.randn(3, 12, 8, generator=g)
    U = torch.randn(2, 8, 4, generator=g)
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[1, 7:] = False
    assert head_projections(Z, U).dtype == torch.float32
    assert head_projections(Z.double(), U).dtype == torch.float64
    exact = compression_rate(Z.double(), U.double(), token_mask=mask)
    torch.testing.assert_close(compression_rate(Z, U, token_mask=mask), exact, rtol=1e-6, atol=0)
    exact = coding_rate(Z.double(), token_mask=mask)
    torch.testing.assert_close(coding_rate(Z, token_mask=mask), exact, rtol=1e-6, atol=0)


def test_cholesky_logdet_falls_back_to_eigenvalues_where_positive_definiteness_is_lost():
    import importlib

    cr = importlib.import_module("hf_tdiag.measures.coding_rate")
    spd = torch.tensor([[4.0, 2.0], [2.0, 3.0]], dtype=torch.float64)  # det 8
    psd = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=torch.float64)  # eigenvalues 2 and 0
    mats = torch.stack([torch.stack([spd, psd]), torch.stack([spd, 2 * spd])])  # (2, 2, 2, 2)
    logdet, _, info = cr._cholesky_logdet(mats)
    assert bool((info != 0).any())
    tiny = math.log(torch.finfo(torch.float64).tiny)
    expected = [[math.log(8.0), math.log(2.0) + tiny], [math.log(8.0), math.log(32.0)]]
    np.testing.assert_allclose(logdet.numpy(), expected, rtol=1e-12)
    logdet, _, info = cr._cholesky_logdet(mats[1])  # all positive definite: the Cholesky route
    assert not bool((info != 0).any())
    np.testing.assert_allclose(logdet.numpy(), [math.log(8.0), math.log(32.0)], rtol=1e-12)


def test_float32_guard_compares_the_estimate_with_the_tolerance_and_the_inner_length(monkeypatch):
    import importlib

    cr = importlib.import_module("hf_tdiag.measures.coding_rate")
    seen, inner = [], []
    gram = cr._gram
    monkeypatch.setattr(cr, "_gram", lambda A: seen.append(A.dtype) or gram(A))
    estimate = {"value": 0.0}
    monkeypatch.setattr(
        cr,
        "float32_gram_error",
        lambda mat, L, inner_length=None, **kw: (
            inner.append(kw["inner"]) or torch.as_tensor(estimate["value"], dtype=torch.float64).expand(mat.shape[:-2])
        ),
    )
    g = torch.Generator().manual_seed(14)
    # the inner length m of the Gram products is the longer side of A
    for shape, m in (((2, 40, 7), 40), ((2, 3, 7, 40), 40), ((2, 3, 9, 5), 9)):
        inner.clear()
        cr.logdet_identity_plus_gram(torch.randn(*shape, generator=g), 0.5)
        assert inner == [m], shape
    A = torch.randn(2, 20, 4, generator=g)
    for c in (5.0, 0.01):  # |logdet| above 2, and below 1 (the tolerance is relative to max(|logdet|, 1))
        seen.clear()
        estimate["value"] = 0.0
        logdet = cr.logdet_identity_plus_gram(A, c)
        assert seen == [torch.float32]
        bound = cr.FLOAT32_GRAM_TOLERANCE * logdet.abs().clamp_min(1.0)  # per matrix
        for value, fallback in ((bound, False), (bound * 1.01, True)):
            estimate["value"] = value
            seen.clear()
            cr.logdet_identity_plus_gram(A, c)
            assert seen == ([torch.float32, torch.float64] if fallback else [torch.float32]), (c, value)
        if c < 1:
            assert float(logdet.abs().max()) < 1.0


def test_srr_from_terms_is_the_papers_combination():
    """SRR = Rᶜ − R + λ·sparsity, worked by hand: 3 − 2 + 2·0.5 = 2; the diagnostics' terms follow it."""
    import torch

    from hf_tdiag.measures.coding_rate import srr_from_terms, srr_terms

    out = srr_from_terms(torch.tensor([2.0]), torch.tensor([3.0]), torch.tensor([0.5]), 2.0)
    assert out.tolist() == [2.0]
    torch.manual_seed(0)
    Z, U = torch.randn(2, 6, 8, dtype=torch.float64), torch.randn(2, 8, 4, dtype=torch.float64)
    t = srr_terms(Z, U, eps=0.5, lam=0.3)
    torch.testing.assert_close(t["srr"], t["Rc"] - t["R"] + 0.3 * t["sparsity"], rtol=0, atol=0)
