"""Token SNR of a subspace mixture (hf_tdiag.measures.token_snr) against closed forms and a naive loop."""

import math

import pytest
import torch

from hf_tdiag.measures.token_snr import (
    centered_moments,
    class_position_sums,
    class_second_moments,
    cluster_snr,
    energies_from_moments,
    mixture_snr,
    principal_subspaces,
    snr_from_energies,
    subspace_energies,
)


def _orthogonal_bases(K, d, p, seed=0):
    """K mutually orthogonal orthonormal bases (d, p) from one random orthogonal matrix."""
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return torch.stack([Q[:, k * p : (k + 1) * p] for k in range(K)])


def _mixture(U, n_per_class, delta, seed=1):
    """Tokens z = U_k a + Σ_{j≠k} U_j e_j, a ~ N(0, I_p), e ~ N(0, δ² I_p); returns Z, labels, A, E."""
    g = torch.Generator().manual_seed(seed)
    K, d, p = U.shape
    labels = torch.arange(K).repeat_interleave(n_per_class)
    A = torch.randn(len(labels), p, generator=g, dtype=torch.float64)
    E = delta * torch.randn(len(labels), K, p, generator=g, dtype=torch.float64)
    E[torch.arange(len(labels)), labels] = 0.0  # no noise in a token's own subspace
    Z = torch.einsum("kdp,np->nkd", U, A)[torch.arange(len(labels)), labels] + torch.einsum("kdp,nkp->nd", U, E)
    return Z, labels, A, E


def _naive_snr(Z, labels, U):
    """Per class: a Python loop over tokens with the projector P = U Uᵀ written out."""
    out = []
    for k in range(U.shape[0]):
        P = U[k] @ U[k].T
        sig = noi = 0.0
        for i in range(Z.shape[0]):
            if int(labels[i]) == k:
                z = Z[i]
                sig += float((P @ z) @ (P @ z))
                r = z - P @ z
                noi += float(r @ r)
        out.append(math.sqrt(sig / noi) if noi > 0 else (math.inf if sig > 0 else math.nan))
    return out


def test_snr_equals_coefficient_norms_and_naive_loop():
    U = _orthogonal_bases(3, 12, 3)
    Z, labels, A, E = _mixture(U, 20, 0.3)
    got = mixture_snr(Z, labels, U)
    for k in range(3):
        own = labels == k
        exact = A[own].norm() / E[own].norm()  # orthonormal, orthogonal bases: projections keep coefficient norms
        assert got[k].item() == pytest.approx(exact.item(), rel=1e-12)
    assert got.tolist() == pytest.approx(_naive_snr(Z, labels, U), rel=1e-12)
    assert cluster_snr(Z[labels == 1], U[1]).item() == pytest.approx(got[1].item(), rel=1e-14)


def test_snr_tends_to_closed_form():
    K, p, delta = 4, 4, 0.5
    U = _orthogonal_bases(K, 20, p)
    Z, labels, _, _ = _mixture(U, 5000, delta)
    closed = 1.0 / (delta * math.sqrt(K - 1))  # E‖a‖² = p, E Σ_j ‖e_j‖² = (K−1) p δ²
    assert mixture_snr(Z, labels, U).tolist() == pytest.approx([closed] * K, rel=0.03)


def test_snr_scales_inversely_with_noise_and_is_monotone():
    U = _orthogonal_bases(2, 8, 2)
    values = []
    for delta in (0.1, 0.2, 0.4, 0.8):
        Z, labels, _, _ = _mixture(U, 50, delta, seed=3)  # same draws: the noise is scaled, the signal fixed
        values.append(mixture_snr(Z, labels, U))
    for a, b in zip(values, values[1:]):
        assert torch.allclose(a / b, torch.full_like(a, 2.0), rtol=1e-12)


def test_orthogonal_change_of_basis_and_scale_leave_snr_unchanged():
    U = _orthogonal_bases(3, 10, 2)
    Z, labels, _, _ = _mixture(U, 30, 0.7)
    Q, _ = torch.linalg.qr(torch.randn(10, 10, generator=torch.Generator().manual_seed(9), dtype=torch.float64))
    # tokens are rows: z -> Qᵀ z is Z -> Z Q, and the bases U_k -> Qᵀ U_k
    rotated = mixture_snr(Z @ Q, labels, Q.T @ U)
    assert torch.allclose(rotated, mixture_snr(Z, labels, U), rtol=1e-12)
    assert torch.allclose(mixture_snr(5.0 * Z, labels, U), mixture_snr(Z, labels, U), rtol=1e-12)


def test_zero_noise_is_inf_and_empty_class_nan():
    U = _orthogonal_bases(3, 9, 3)
    Z, labels, _, _ = _mixture(U, 10, 0.0)
    labels[labels == 2] = 0  # class 2 now has no tokens; class 0 has tokens of subspace 2 (noise for it)
    got = mixture_snr(Z, labels, U)
    assert got[1].item() == math.inf and math.isnan(got[2].item()) and math.isfinite(got[0].item())
    assert snr_from_energies(torch.tensor([0.0, 4.0, 0.0]), torch.tensor([1.0, 1.0, 0.0])).tolist()[:2] == [0.0, 2.0]
    with pytest.raises(ValueError, match="energies >= 0"):
        snr_from_energies(-1.0, 1.0)


def test_moments_route_equals_direct_energies():
    U = _orthogonal_bases(3, 10, 2)
    Z, labels, _, _ = _mixture(U, 25, 0.4)
    M, counts = class_second_moments(Z, labels, 3)
    assert counts.tolist() == [25.0, 25.0, 25.0]
    assert torch.allclose(M[1], Z[labels == 1].T @ Z[labels == 1], rtol=1e-12)
    signal, noise = energies_from_moments(M, U)
    for k in range(3):
        s, n = subspace_energies(Z[labels == k], U[k])
        assert signal[k].item() == pytest.approx(s.sum().item(), rel=1e-10)
        assert noise[k].item() == pytest.approx(n.sum().item(), rel=1e-10)
    Z0, labels0, _, _ = _mixture(U, 5, 0.0)
    signal0, noise0 = energies_from_moments(class_second_moments(Z0, labels0, 3)[0], U)
    assert (noise0 <= 1e-12 * signal0).all() and snr_from_energies(signal0, noise0).isinf().all()
    # a real SNR of 1e5 (noise 1e-10 of the energy) is kept finite
    assert snr_from_energies(1.0, 1e-10).item() == pytest.approx(1e5)


def test_centered_moments_equal_the_moments_of_centered_tokens():
    g = torch.Generator().manual_seed(7)
    Z = torch.randn(6, 3, 4, generator=g, dtype=torch.float64)  # 6 inputs, 3 positions, d = 4
    labels = torch.tensor([0, 1, 2, 0, 1, 1])
    keep = torch.ones(6, 3, dtype=torch.bool)
    keep[4, 2] = False  # a padding token
    mean = torch.randn(3, 4, generator=g, dtype=torch.float64)
    S, C = class_position_sums(Z, labels, 3, keep)
    assert C.tolist() == [[2, 2, 2], [3, 3, 2], [1, 1, 1]]
    assert torch.allclose(S[1, 2], Z[1, 2] + Z[5, 2])
    kept_labels = labels[:, None].expand(6, 3)[keep]
    M, _ = class_second_moments(Z[keep], kept_labels, 3)
    direct, _ = class_second_moments((Z - mean)[keep], kept_labels, 3)  # each token less its position's mean
    assert torch.allclose(centered_moments(M, S, C, mean), direct, rtol=1e-12, atol=1e-12)


def test_centering_removes_a_part_every_class_shares():
    """A constant added to every token (a position embedding) lies in every fitted subspace: uncentred, the SNR of a
    pure-noise mixture looks high; with the position mean removed it is the mixture's own."""
    U = _orthogonal_bases(2, 12, 2)
    Z, labels, _, _ = _mixture(U, 300, 0.3, seed=8)
    shared = torch.zeros(12, dtype=torch.float64)
    shared[-1] = 20.0  # outside every subspace
    Zs = (Z + shared)[:, None, :]  # one position
    M, _ = class_second_moments(Zs[:, 0], labels, 2)
    S, C = class_position_sums(Zs, labels, 2)
    raw = snr_from_energies(*energies_from_moments(M, principal_subspaces(M, 2)))
    mean = S.sum(0) / C.sum(0)[:, None]
    Mc = centered_moments(M, S, C, mean)
    centered = snr_from_energies(*energies_from_moments(Mc, principal_subspaces(Mc, 2)))
    truth = mixture_snr(Z, labels, U)
    assert (raw > 3 * truth).all() and torch.allclose(centered, truth, rtol=0.05)


def test_principal_subspaces_recover_the_mixture_and_held_out_snr():
    U = _orthogonal_bases(3, 16, 3)
    Z, labels, _, _ = _mixture(U, 400, 0.2, seed=4)
    U_hat = principal_subspaces(class_second_moments(Z, labels, 3)[0], 3)
    for k in range(3):  # projector distance: the estimated subspace is the true one
        assert torch.linalg.matrix_norm(U_hat[k] @ U_hat[k].T - U[k] @ U[k].T, ord=2) < 0.1
    held, held_labels, _, _ = _mixture(U, 400, 0.2, seed=5)
    assert torch.allclose(mixture_snr(held, held_labels, U_hat), mixture_snr(held, held_labels, U), rtol=0.02)
    # the fit ranks its directions: rank 1 keeps the class's largest-variance direction only
    M = torch.diag(torch.tensor([[1.0, 5.0, 2.0]], dtype=torch.float64)[0]).unsqueeze(0)
    assert principal_subspaces(M, 1)[0, :, 0].abs().tolist() == [0.0, 1.0, 0.0]


def test_bad_inputs_are_one_line_errors():
    U = _orthogonal_bases(2, 4, 2)
    Z = torch.randn(5, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="class indices in 0..1"):
        mixture_snr(Z, torch.tensor([0, 1, 2, 0, 1]), U)
    with pytest.raises(ValueError, match="labels: expected 5 integer"):
        mixture_snr(Z, torch.zeros(4, dtype=torch.long), U)
    with pytest.raises(TypeError, match="labels: expected a tensor"):
        class_second_moments(Z, [0, 1, 0, 1, 0], 2)
    with pytest.raises(ValueError, match="rank: expected an integer in 1..4"):
        principal_subspaces(torch.eye(4, dtype=torch.float64).expand(2, 4, 4), 5)
    with pytest.raises(ValueError, match=r"classes \[1\] have no token energy"):
        principal_subspaces(class_second_moments(Z, torch.zeros(5, dtype=torch.long), 2)[0], 1)
    with pytest.raises(ValueError, match="U: expected 4 rows"):
        cluster_snr(Z, torch.randn(3, 2, dtype=torch.float64))


def test_float32_inputs_are_measured_in_float64():
    U = _orthogonal_bases(2, 6, 2)
    Z, labels, _, _ = _mixture(U, 20, 0.5)
    Z32, U32 = Z.float(), U.float()
    s64, n64 = subspace_energies(Z, U[0])
    s32, n32 = subspace_energies(Z32, U[0])
    assert s32.dtype == torch.float64 and torch.allclose(s32, s64, rtol=1e-5) and torch.allclose(n32, n64, rtol=1e-5)
    M, _ = class_second_moments(Z, labels, 2)
    U_fit = principal_subspaces(M.float(), 2)
    assert U_fit.dtype == torch.float64
    assert torch.allclose(U_fit @ U_fit.transpose(-1, -2), principal_subspaces(M, 2) @ principal_subspaces(M, 2).mT,
                          atol=1e-4)  # fmt: skip
    signal, noise = energies_from_moments(M, U32)
    assert signal.dtype == torch.float64 and torch.allclose(signal, energies_from_moments(M, U)[0], rtol=1e-5)
    Zs = Z32.reshape(4, 10, 6)
    S, C = class_position_sums(Zs, torch.tensor([0, 1, 0, 1]), 2)
    mean = torch.zeros(10, 6)
    Mb, _ = class_second_moments(Z32, torch.tensor([0, 1, 0, 1]).repeat_interleave(10), 2)
    assert torch.allclose(centered_moments(Mb, S.float(), C.float(), mean), Mb)  # float32 sums and counts
