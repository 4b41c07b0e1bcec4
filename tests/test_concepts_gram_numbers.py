"""The Gram measures (hf_tdiag.measures.concepts.gram) against a naive numpy computation per image, on both sides of
the Gram (N < d, N = d, N > d), for one (N, d) image and for batches; float64 accumulation of float32 inputs; the
all-zero image. Written for the survivors of the mutation run (issue 22)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_tdiag.measures.concepts.gram import (
    batched_gram_loss_grad,
    fidelity_errors,
    gram_error,
    gram_lemma_rhs,
    gram_loss,
    gram_loss_grad,
)


def _naive(a: np.ndarray, h: np.ndarray) -> dict[str, float]:
    """One image, float64, straight from the definitions."""
    a, h = a.astype(np.float64), h.astype(np.float64)
    G, Gh = a @ a.T, h @ h.T
    g2 = (G**2).sum()
    err = np.sqrt(((G - Gh) ** 2).sum())
    delta = np.sqrt(((a - h) ** 2).sum())
    a_norm = np.sqrt((a**2).sum())
    return {
        "loss": err**2 / g2,
        "grad": 4 * (Gh - G) @ h / g2,
        "delta_rec": delta,
        "delta_rec_rel": delta / a_norm,
        "delta_gram": err / np.sqrt(g2),
        "gram_norm": np.sqrt(g2),
        "gram_error": err,
        "lemma_rhs": 2 * a_norm * delta + delta**2,
    }


SHAPES = [(3, 5, 8), (2, 6, 6), (3, 9, 4)]  # N < d, N = d, N > d


def _batch(B, N, d, seed=0, scale=0.3):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(B, N, d))
    h = a + scale * rng.normal(size=(B, N, d)) * np.arange(1, B + 1)[:, None, None]  # a different error per image
    return a, h


@pytest.mark.parametrize("B, N, d", SHAPES)
def test_batch_measures_equal_a_naive_per_image_computation(B, N, d):
    a, h = _batch(B, N, d)
    ref = [_naive(a[i], h[i]) for i in range(B)]
    A, H = torch.tensor(a), torch.tensor(h)
    np.testing.assert_allclose(gram_loss(A, H).numpy(), [r["loss"] for r in ref], rtol=1e-10)
    np.testing.assert_allclose(gram_error(A, H).numpy(), [r["gram_error"] for r in ref], rtol=1e-10)
    np.testing.assert_allclose(gram_lemma_rhs(A, H).numpy(), [r["lemma_rhs"] for r in ref], rtol=1e-12)
    errs = fidelity_errors(A, H)
    for key in ("delta_rec", "delta_rec_rel", "delta_gram", "gram_norm", "gram_error", "lemma_rhs"):
        assert errs[key].shape == (B,), key
        np.testing.assert_allclose(errs[key].numpy(), [r[key] for r in ref], rtol=1e-10, err_msg=key)
    loss, grad = gram_loss_grad(A, H)
    np.testing.assert_allclose(loss.numpy(), [r["loss"] for r in ref], rtol=1e-10)
    np.testing.assert_allclose(grad.numpy(), np.stack([r["grad"] for r in ref]), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("B, N, d", SHAPES)
def test_one_image_gives_scalars_equal_to_the_batch_entry(B, N, d):
    a, h = _batch(B, N, d, seed=1)
    ref = _naive(a[1], h[1])
    A, H = torch.tensor(a[1]), torch.tensor(h[1])
    for value, key in (
        (gram_loss(A, H), "loss"),
        (gram_error(A, H), "gram_error"),
        (gram_lemma_rhs(A, H), "lemma_rhs"),
    ):
        assert value.shape == (), key
        assert float(value) == pytest.approx(ref[key], rel=1e-10), key
    errs = fidelity_errors(A, H)
    for key in ("delta_rec", "delta_rec_rel", "delta_gram", "gram_norm", "gram_error", "lemma_rhs"):
        assert errs[key].shape == (), key
        assert float(errs[key]) == pytest.approx(ref[key], rel=1e-10), key
    loss, grad = gram_loss_grad(A, H)
    assert loss.shape == () and grad.shape == (N, d)
    assert float(loss) == pytest.approx(ref["loss"], rel=1e-10)
    np.testing.assert_allclose(grad.numpy(), ref["grad"], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("N, d", [(5, 8), (9, 4)])
def test_small_losses_are_not_clamped_and_sums_accumulate_in_float64(N, d):
    """float32 activations: the float32 products' squares are accumulated in float64 (equal to that sum to 1e-12,
    where a float32 accumulation is off by ~1e-7; for N > d, where ‖G − Ĝ‖² is a difference of large sums, to 1e-6,
    where a float32 accumulation is off by ~10%: ‖G‖² itself is summed in float32 there), the gradient stays
    float32, and a loss ≪ 1 stays ≪ 1."""
    a, h = _batch(2, N, d, seed=2, scale=1e-3)
    A, H = torch.tensor(a, dtype=torch.float32), torch.tensor(h, dtype=torch.float32)
    loss, grad = batched_gram_loss_grad(A, H)
    At = H.transpose(-1, -2)
    if N <= d:
        G = A @ A.transpose(-1, -2)
        diff = (H @ At - G).square().sum((-1, -2), dtype=torch.float64)
        g2 = G.square().sum((-1, -2), dtype=torch.float64)
    else:
        C, X, Ch = A.transpose(-1, -2) @ A, A.transpose(-1, -2) @ H, At @ H
        g2 = C.square().sum((-1, -2), dtype=torch.float64)
        f64 = torch.float64
        diff = (g2 - 2 * X.square().sum((-1, -2), dtype=f64) + Ch.square().sum((-1, -2), dtype=f64)).clamp(min=0)
    assert loss.dtype == torch.float64 and grad.dtype == torch.float32
    np.testing.assert_allclose(loss.numpy(), (diff / g2).numpy(), rtol=1e-12 if N <= d else 1e-6)
    assert float(loss.max()) < 1e-3
    ref = [_naive(a[i].astype(np.float32), h[i].astype(np.float32)) for i in range(2)]
    # against the exact loss of the float32 values: close on the N <= d side; on the N > d side the float32 products
    # C, X, Ĉ cancel (the loss is ~1e-6 of each term), so the working-dtype loss is only ~20% accurate here (the
    # reported δ_gram comes from fidelity_errors, in float64 throughout)
    np.testing.assert_allclose(loss.numpy(), [r["loss"] for r in ref], rtol=2e-2 if N <= d else 0.5)


def test_an_all_zero_image_is_an_error_and_a_unit_gram_is_not():
    A = torch.zeros(2, 3, 4, dtype=torch.float64)
    A[0, 0, 0] = 1.0  # image 0: G = e1 e1ᵀ, ‖G‖²_F = 1 exactly; image 1: all zero
    H = A + 0.1
    for f in (gram_loss, fidelity_errors, lambda a, h: batched_gram_loss_grad(a, h)):
        with pytest.raises(ValueError, match=r"^A: an image has all-zero activations"):
            f(A, H)
    one = A[:1]
    assert float(gram_loss(one, H[:1])[0]) == pytest.approx(_naive(one[0].numpy(), H[0].numpy())["loss"], rel=1e-12)
    assert float(fidelity_errors(one, H[:1])["gram_norm"][0]) == 1.0
    loss, _ = batched_gram_loss_grad(one, H[:1])
    assert float(loss[0]) == pytest.approx(_naive(one[0].numpy(), H[0].numpy())["loss"], rel=1e-12)
