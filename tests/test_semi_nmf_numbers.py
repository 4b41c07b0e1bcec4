"""SemiNMF's numbers against independent computations: a naive numpy Ding–Li–Jordan Semi-NMF run side by side from
the same start, the losses recomputed from the factors, the stopping rule at its exact threshold, the documented
composition of the Gram-weighted fit, dtypes/devices, progress bars, and ``from_components`` round trips."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from scipy.optimize import nnls

from hf_tdiag.measures.concepts.init import initial_codes
from hf_tdiag.measures.concepts.joint import grams, refine
from hf_tdiag.measures.concepts.nnls import nnls_codes
from hf_tdiag.measures.concepts.semi_nmf import SemiNMF


def naive_semi_nmf(A, U, iters):
    """Ding–Li–Jordan in numpy float64: W = AᵀU(UᵀU)⁻¹, U ← U ∘ √(([AW]⁺ + U[WᵀW]⁻)/([AW]⁻ + U[WᵀW]⁺)).

    Returns the codes, the dictionary of the final codes and ‖A − U_{t+1} W_tᵀ‖² after each step (the objective
    of the new codes with the dictionary that produced them)."""
    objs = []
    for _ in range(iters):
        W = A.T @ U @ np.linalg.inv(U.T @ U)
        AW, WtW = A @ W, W.T @ W
        num = np.maximum(AW, 0) + U @ np.maximum(-WtW, 0)
        den = np.maximum(-AW, 0) + U @ np.maximum(WtW, 0) + 1e-12
        U = U * np.sqrt(num / den)
        objs.append(float(np.sum((A - U @ W.T) ** 2)))
    return U, A.T @ U @ np.linalg.inv(U.T @ U), objs


def naive_losses(A3, U, W):
    """(L_rec, L_gram) of Â = U Wᵀ for per-image data A3 (images, N, d): L_gram = mean_i ‖G_i − Ĝ_i‖²/‖G_i‖²."""
    H = (U @ W.T).reshape(A3.shape)
    rec = float(np.sum((A3 - H) ** 2) / np.sum(A3**2))
    G, Gh = A3 @ A3.transpose(0, 2, 1), H @ H.transpose(0, 2, 1)
    return rec, float(np.mean(np.sum((G - Gh) ** 2, axis=(1, 2)) / np.sum(G**2, axis=(1, 2))))


def grid(shape, scale, seed):
    """float32 values on a 2⁻¹⁰·scale grid (12-bit integers): squares exact in float32, ‖A‖² exact in float64 but
    not in a float32 sum."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4096, 4097, shape, generator=g).float() * (scale / 1024)


def test_the_mu_phase_is_the_naive_ding_li_jordan_iteration_and_codes_are_nnls():
    torch.manual_seed(0)
    A = torch.randn(30, 7, dtype=torch.float64) * 0.01  # ‖A‖² ≈ 0.02: no loss may be clipped at 1
    k, its = 3, 6
    m = SemiNMF(k, max_iter=its, encode_tol=1e-12).fit(A)
    U0 = initial_codes(A, k, "nndsvda", 0).numpy()
    a = A.numpy()
    a2 = float(np.sum(a**2))
    U, W, objs = naive_semi_nmf(a, U0, its)
    W0 = a.T @ U0 @ np.linalg.inv(U0.T @ U0)
    h = m.history_
    assert h["phase"] == ["init"] + ["mu"] * its + ["mu-end", "final"]
    assert m.n_iter_ == its
    np.testing.assert_allclose(h["rec_loss"][0], np.sum((a - U0 @ W0.T) ** 2) / a2, rtol=1e-9)
    np.testing.assert_allclose(h["rec_loss"][1 : its + 1], np.array(objs) / a2, rtol=1e-9)
    np.testing.assert_allclose(h["objective"][1 : its + 1], np.array(objs) / a2, rtol=1e-9)
    np.testing.assert_allclose(h["rec_loss"][its + 1], np.sum((a - U @ W.T) ** 2) / a2, rtol=1e-9)
    assert all(math.isnan(g) for g in h["gram_loss"])  # row data has no Grams
    assert h["objective"] == h["rec_loss"]  # J = L_rec for μ = 0, at every phase (not NaN = L_rec + 0·NaN)
    # components_ are the exact dictionary of the final MU codes; codes_ are its NNLS codes (scipy, row by row)
    np.testing.assert_allclose(m.components_.numpy(), W.T, rtol=1e-9, atol=1e-12)
    ref = np.stack([nnls(W, row)[0] for row in a])
    np.testing.assert_allclose(m.codes_.numpy(), ref, atol=1e-9)
    final = float(np.sum((a - m.codes_.numpy() @ m.components_.numpy()) ** 2))
    np.testing.assert_allclose(h["rec_loss"][-1], final / a2, rtol=1e-12)
    np.testing.assert_allclose(m.reconstruction_err_, math.sqrt(final), rtol=1e-12)


def test_losses_are_normalised_by_the_float64_norm_of_float32_activations():
    A = grid((40, 8), 1.0, 1)
    a2 = float(A.double().square().sum())  # exact: the entries are 12-bit integers / 1024
    assert float(A.square().sum()) != a2  # a float32 sum would not be
    m = SemiNMF(3, max_iter=4).fit(A)
    assert m.components_.dtype == torch.float32 and m.codes_.dtype == torch.float32
    R = A - m.codes_ @ m.components_  # the float32 residual the estimator reports on, its squares summed in float64
    assert m.history_["rec_loss"][-1] == pytest.approx(float(R.square().sum(dtype=torch.float64)) / a2, rel=1e-14)


def test_tol_stops_at_the_first_iteration_whose_decrease_is_at_most_tol_times_the_norm():
    g = torch.Generator().manual_seed(3)
    A = torch.randn(16, 8, generator=g, dtype=torch.float64).sign()  # ‖A‖² = 128: obj = rec_loss·128 exactly
    a2 = 128.0
    full = SemiNMF(3, max_iter=30).fit(A)
    objs = [r * a2 for r in full.history_["rec_loss"][1:31]]
    drops = [objs[j - 1] - objs[j] for j in range(1, 30)]  # drops[j-1]: the decrease at iteration j + 1
    j = next(j for j in range(2, 29) if 0 < drops[j - 1] < min(drops[: j - 1]))
    tol = drops[j - 1] / a2  # exact (a2 is a power of two): the decrease at iteration j + 1 equals tol·‖A‖²
    m = SemiNMF(3, max_iter=30, tol=tol).fit(A)
    assert m.n_iter_ == j + 1
    assert m.history_["rec_loss"][1 : j + 2] == full.history_["rec_loss"][1 : j + 2]
    assert m.history_["phase"].count("mu") == j + 1
    # a threshold just below that decrease does not stop there
    later = SemiNMF(3, max_iter=30, tol=tol * (1 - 1e-9)).fit(A)
    assert later.n_iter_ > j + 1


def test_tol_zero_runs_every_iteration_even_when_the_objective_stalls():
    A = torch.ones(8, 4, dtype=torch.float64)  # exactly rank one and non-negative: the loss stops moving at once
    m = SemiNMF(1, max_iter=10).fit(A)
    assert m.n_iter_ == 10 and m.history_["phase"].count("mu") == 10
    assert m.history_["rec_loss"][-1] < 1e-20


def test_max_iter_zero_keeps_the_initial_codes_dictionary_and_defaults():
    torch.manual_seed(1)
    A = torch.randn(20, 5, dtype=torch.float64)
    m = SemiNMF(2, max_iter=0, encode_tol=1e-12).fit(A)
    assert m.n_iter_ == 0 and m.history_["phase"] == ["init", "mu-end", "final"]
    U0 = initial_codes(A, 2, "nndsvda", 0).numpy()
    a = A.numpy()
    np.testing.assert_allclose(m.components_.numpy(), (a.T @ U0 @ np.linalg.inv(U0.T @ U0)).T, rtol=1e-9)
    assert m.history_["rec_loss"][0] == pytest.approx(m.history_["rec_loss"][1], rel=1e-9)
    est = SemiNMF(2)
    assert (est.max_iter, est.refine_iter, est.tol, est.encode_tol, est.verbose) == (200, 100, 0.0, 1e-3, False)
    assert est.fit(A).n_iter_ == 200


@pytest.mark.parametrize("refine_iter", [1, 3])
def test_gram_weighted_fit_is_mu_then_joint_refinement_then_nnls_and_code_refinement(refine_iter):
    torch.manual_seed(2)
    A = torch.randn(4, 5, 8, dtype=torch.float64)
    mu, k, its = 0.5, 3, 3
    m = SemiNMF(k, gram_weight=mu, max_iter=its, refine_iter=refine_iter, encode_tol=1e-9).fit(A)
    X, shape = A.reshape(-1, 8), tuple(A.shape)
    a2 = float(X.square().sum())
    U0 = initial_codes(X, k, "nndsvda", 0).numpy()
    U, W, _ = naive_semi_nmf(X.numpy(), U0, its)
    G, g2 = grams(X, shape)
    Ur, Wr = refine(X, torch.from_numpy(U), torch.from_numpy(W), shape, a2, G, g2, refine_iter, mu, True)
    codes = nnls_codes(X, Wr, tol=1e-9)
    codes, _ = refine(X, codes, Wr, shape, a2, G, g2, refine_iter, mu, False)
    np.testing.assert_allclose(m.components_.numpy(), Wr.T.numpy(), rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(m.codes_.numpy(), codes.reshape(4, 5, k).numpy(), rtol=1e-7, atol=1e-10)
    h = m.history_
    assert h["phase"] == ["init"] + ["mu"] * its + ["mu-end"] + ["refine"] * refine_iter + ["final"]
    a3 = A.numpy()
    W0 = X.numpy().T @ U0 @ np.linalg.inv(U0.T @ U0)
    for at, (Uc, Wc) in {
        0: (U0, W0),
        its + 1: (U, W),
        -1: (m.codes_.reshape(-1, k).numpy(), m.components_.T.numpy()),
    }.items():
        rec, gl = naive_losses(a3, Uc, Wc)
        np.testing.assert_allclose([h["rec_loss"][at], h["gram_loss"][at]], [rec, gl], rtol=1e-9)
        np.testing.assert_allclose(h["objective"][at], rec + mu * gl, rtol=1e-9)
    for at in range(its + 2, its + 2 + refine_iter):  # the refinement's own J = L_rec + μ·L_gram
        assert h["objective"][at] == pytest.approx(h["rec_loss"][at] + mu * h["gram_loss"][at], rel=1e-12)


def close(a, b, rtol):
    """Equal up to rtol of the largest entry (codes: the NNLS start is a LAPACK solve whose last bits vary run to run)."""
    return bool((a - b).abs().max() <= rtol * b.abs().max())


@pytest.mark.parametrize("scale", [1.0, 1 / 1024])  # ‖A‖² ≈ 850 and ≈ 8e-4
def test_transform_of_the_training_data_reproduces_codes_with_gram_weight(scale):
    A = grid((4, 5, 8), scale, 4)
    m = SemiNMF(3, gram_weight=0.5, max_iter=5, refine_iter=5, encode_tol=1e-6).fit(A)
    assert close(m.transform(A), m.codes_, 1e-4)
    est = SemiNMF.from_components(m.components_, gram_weight=0.5, refine_iter=5, encode_tol=1e-6)
    assert est.codes_ is None and est.history_ is None and est.n_concepts == 3 and est.n_features_in_ == 8
    assert close(est.transform(A), m.codes_, 1e-4)
    plain = SemiNMF.from_components(m.components_, refine_iter=5, encode_tol=1e-6).transform(A)
    assert not close(plain, m.codes_, 1e-2)  # without the Gram term the codes are plain NNLS


def test_from_components_round_trip_with_keywords_and_numpy():
    torch.manual_seed(5)
    A = torch.randn(25, 6, dtype=torch.float64)
    m = SemiNMF(3, max_iter=20, encode_tol=1e-10).fit(A)
    comps = m.components_.numpy().copy()
    est = SemiNMF.from_components(comps, encode_tol=1e-10)
    comps[:] = 0  # the estimator keeps its own copy
    assert est.gram_weight == 0.0 and est.encode_tol == 1e-10 and est.n_features_in_ == 6
    assert torch.equal(est.components_, m.components_)
    assert close(est.transform(A), m.codes_, 1e-9)
    B = torch.randn(9, 6, dtype=torch.float64)
    W = m.components_.numpy().T
    np.testing.assert_allclose(est.transform(B).numpy(), np.stack([nnls(W, r)[0] for r in B.numpy()]), atol=1e-8)


def test_reconstruct_and_inverse_transform_are_codes_times_components():
    torch.manual_seed(6)
    A = torch.randn(3, 4, 6)
    m = SemiNMF(2, max_iter=10, encode_tol=1e-6).fit(A)
    B = torch.randn(2, 4, 6)
    assert close(m.reconstruct(B), m.transform(B) @ m.components_, 1e-5)
    assert m.reconstruct(B).shape == (2, 4, 6)
    U = torch.rand(5, 2, dtype=torch.float64)
    out = m.inverse_transform(U)
    assert out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), U.numpy() @ m.components_.double().numpy(), rtol=1e-12)


def test_transform_zero_image_without_gram_weight_and_float64_input_on_a_float32_fit():
    torch.manual_seed(7)
    A = torch.randn(3, 4, 6) + 0.5
    m = SemiNMF(2, max_iter=10, encode_tol=1e-10).fit(A)
    B = A.clone()
    B[1] = 0  # no Gram is needed without gram_weight: a silent image has zero codes
    codes = m.transform(B)
    assert torch.equal(codes[1], torch.zeros(4, 2))
    torch.testing.assert_close(codes[[0, 2]], m.transform(A[[0, 2]]), rtol=1e-5, atol=1e-5)
    c64 = m.transform(A.double())
    assert c64.dtype == torch.float64
    ref = np.stack([nnls(m.components_.double().numpy().T, r)[0] for r in A.double().reshape(-1, 6).numpy()])
    np.testing.assert_allclose(c64.reshape(-1, 2).numpy(), ref, atol=1e-8)


def test_work_dtype_and_device():
    torch.manual_seed(8)
    A32 = torch.randn(12, 5)
    assert SemiNMF(2, max_iter=2).fit(A32.double()).components_.dtype == torch.float64
    assert SemiNMF(2, max_iter=2).fit(A32.half()).codes_.dtype == torch.float32
    assert SemiNMF(2, max_iter=2).fit(A32.numpy()).components_.dtype == torch.float32
    up = SemiNMF(2, max_iter=2, dtype=torch.float64).fit(A32)
    assert up.components_.dtype == torch.float64 and up.codes_.dtype == torch.float64
    down = SemiNMF(2, max_iter=2, dtype=torch.float32).fit(A32.double())
    assert down.components_.dtype == torch.float32
    # the work goes to the requested device, by default stays on the input's ("meta" needs no accelerator)
    assert SemiNMF(2, device="meta")._prepare(A32).device.type == "meta"
    assert SemiNMF(2, device=torch.device("meta"), dtype=torch.float64)._prepare(A32).dtype == torch.float64
    assert SemiNMF(2)._prepare(A32).device.type == "cpu"


def test_n_concepts_may_equal_the_smaller_side():
    torch.manual_seed(9)
    assert SemiNMF(4, max_iter=3).fit(torch.randn(30, 4)).components_.shape == (4, 4)
    assert SemiNMF(3, max_iter=3).fit(torch.randn(3, 6)).codes_.shape == (3, 3)
    assert SemiNMF(3, max_iter=3).fit(torch.randn(1, 3, 6)).codes_.shape == (1, 3, 3)


def test_progress_bars_only_when_verbose(capsys, monkeypatch):
    import hf_tdiag._progress

    # as in a terminal (outside one, transient bars such as refine/encode write nothing: tests/test_quiet_output.py)
    monkeypatch.setattr(hf_tdiag._progress, "_in_terminal", lambda stream: True)
    torch.manual_seed(10)
    A = torch.randn(3, 4, 6)
    m = SemiNMF(2, gram_weight=0.5, max_iter=2, refine_iter=2).fit(A)
    m.transform(A)
    assert capsys.readouterr().err == ""
    SemiNMF(2, gram_weight=0.5, max_iter=2, refine_iter=2, verbose=True).fit(A)
    bars = {line.partition(":")[0] for line in re.split(r"[\r\n]+", capsys.readouterr().err) if line.strip()}
    assert {"Semi-NMF", "refine", "encode"} <= bars  # tqdm's lines start with the label and a colon
    SemiNMF.from_components(m.components_, gram_weight=0.5, refine_iter=2, verbose=True).transform(A)
    bars = {line.partition(":")[0] for line in re.split(r"[\r\n]+", capsys.readouterr().err) if line.strip()}
    assert "encode" in bars and "Semi-NMF" not in bars
