"""Jiang et al.'s measures against independent computations: norms by SVD, flatness on models whose accuracy curve is known."""

import math

import numpy as np
import pytest
import scipy.stats
import torch

from hf_tdiag.measures.complexity import l2, log_prod_of_spec, sum_of_spec
from hf_tdiag.measures.sharpness import (
    accuracy,
    bisect_to_target,
    pacbayes_flatness,
    pacbayes_flatness_mag,
    sharpness_mag,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors: threads only contend


def test_norm_measures_match_numpy():
    rng = np.random.default_rng(0)
    mats = [rng.normal(size=s) for s in [(5, 3), (4, 4), (7, 2)]]
    t = [torch.tensor(m, dtype=torch.float32) for m in mats]
    spec2 = [np.linalg.svd(m.astype(np.float32).astype(np.float64), compute_uv=False)[0] ** 2 for m in mats]
    assert l2(t) == pytest.approx(
        sum(float((m.astype(np.float32).astype(np.float64) ** 2).sum()) for m in mats), rel=1e-12
    )
    assert log_prod_of_spec(t) == pytest.approx(math.log(np.prod(spec2)), rel=1e-10)
    assert sum_of_spec(t) == pytest.approx(3 * np.prod(spec2) ** (1 / 3), rel=1e-10)
    # scaling every matrix by c multiplies l2 and sum_of_spec by c^2 and adds 2 d log c to the log product
    c = 3.0
    assert l2([c * m for m in t]) == pytest.approx(c**2 * l2(t), rel=1e-6)
    assert sum_of_spec([c * m for m in t]) == pytest.approx(c**2 * sum_of_spec(t), rel=1e-6)
    assert log_prod_of_spec([c * m for m in t]) == pytest.approx(log_prod_of_spec(t) + 2 * 3 * math.log(c), rel=1e-6)
    with pytest.raises(ValueError, match="matrices"):
        l2([])


def test_bisection_hand_worked():
    x, reached, history = bisect_to_target(lambda s: s, upper=1.0, target=0.3, tolerance=0.01)
    # 0.5 (too much) 0.25 (too little) 0.375 0.3125 (|.0125| >= .01) 0.28125 0.296875 (within .01)
    assert [h[0] for h in history] == [0.5, 0.25, 0.375, 0.3125, 0.28125, 0.296875]
    assert reached and x == 0.296875
    x, reached, history = bisect_to_target(lambda s: 0.0, upper=2.0, target=0.1, depth=4)
    assert (
        not reached and x == 2.0 * (1 - 0.5**4) and len(history) == 4
    )  # never perturbed enough: tends to the upper end


def _per_example_model(w0, threshold, batch=37):
    """Example i is classified correctly (label 0) iff w_i > threshold: each example has a weight of its own."""
    w = torch.nn.Parameter(torch.as_tensor(w0, dtype=torch.float64).clone())

    def logits_fn(idx):
        return torch.stack([w[idx] - threshold, torch.zeros_like(w[idx])], dim=1)

    n = w.shape[0]
    idx = torch.arange(n)
    batches = [(idx[i : i + batch], torch.zeros(len(idx[i : i + batch]), dtype=torch.long)) for i in range(0, n, batch)]
    return w, logits_fn, batches


def test_sharpness_mag_solves_the_hand_made_box_problem():
    n, t, eps = 100, 1.0, 1e-3
    w0 = 2.0 + 0.05 * torch.arange(n, dtype=torch.float64)
    w, logits_fn, batches = _per_example_model(w0, t)
    assert accuracy(logits_fn, batches) == 1.0

    # worst case in |u_i| <= a(|w_i| + eps): every weight moves down by its half-width; example i fails once
    # w_i - a (w_i + eps) <= t, i.e. a >= (w_i - t) / (w_i + eps); the accuracy drop at a is the fraction of such i
    def drop(a):
        return float(((w0 - a * (w0 + eps)) <= t).double().mean())

    res = sharpness_mag(logits_fn, [w], batches, target=0.1, eps=eps, alpha_max=2.0, steps=8, tolerance=0.005)
    expected, reached, _ = bisect_to_target(drop, 2.0, 0.1, 0.005)  # the same search on the exact curve
    assert reached and res["reached"]
    assert res["alpha"] == pytest.approx(expected, abs=0)
    a_10, a_11 = ((w0[9] - t) / (w0[9] + eps)).item(), ((w0[10] - t) / (w0[10] + eps)).item()
    assert a_10 <= res["alpha"] < a_11  # exactly the 10 smallest weights flip: accuracy 0.90
    assert res["flatness"] == pytest.approx(1 / expected**2)
    assert torch.equal(w.detach(), w0)  # restored


def _phi_inv(p):
    return scipy.stats.norm.ppf(p)


def test_pacbayes_flatness_matches_the_gaussian_accuracy_curve():
    n = 20000
    w, logits_fn, batches = _per_example_model(torch.ones(n, dtype=torch.float64), 0.0, batch=7000)
    res = pacbayes_flatness(logits_fn, [w], batches, target=0.1, draws=10, seed=0)
    # E accuracy = Phi(1 / sigma): a drop of 0.1 +- 0.01 from accuracy 1 means Phi(1/sigma) in (0.89, 0.91)
    # (0.002 more for the Monte-Carlo error of 10 draws x 20000 examples, std ~0.0007)
    assert res["reached"] and abs(scipy.stats.norm.cdf(1 / res["sigma"]) - 0.9) < 0.012
    # the same search on the exact curve 1 - Phi(1/sigma) takes the same steps and stops at the same sigma
    exact, _, _ = bisect_to_target(lambda s: 1 - scipy.stats.norm.cdf(1 / s), 2.0, 0.1, 0.01)
    assert res["sigma"] == exact
    assert res["flatness"] == pytest.approx(1 / res["sigma"] ** 2)
    assert torch.equal(w.detach(), torch.ones(n, dtype=torch.float64))
    again = pacbayes_flatness(logits_fn, [w], batches, target=0.1, draws=10, seed=0)
    assert again == res  # common random numbers: deterministic for a seed


def test_pacbayes_flatness_mag_matches_the_gaussian_accuracy_curve():
    n, eps = 20000, 1e-3
    w, logits_fn, batches = _per_example_model(torch.full((n,), 2.0, dtype=torch.float64), 1.0, batch=7000)
    res = pacbayes_flatness_mag(logits_fn, [w], batches, target=0.1, eps=eps, draws=10, seed=1)
    # u_i ~ N(0, s^2 w_i^2 + eps^2): example correct iff 2 + u > 1, probability Phi(1 / sqrt(4 s^2 + eps^2))
    std = math.sqrt(4 * res["sigma"] ** 2 + eps**2)
    assert res["reached"] and abs(scipy.stats.norm.cdf(1 / std) - 0.9) < 0.012
    # the plain (non-magnitude) sigma of the same model is twice as large (noise not scaled by |w| = 2)
    plain = pacbayes_flatness(logits_fn, [w], batches, target=0.1, draws=10, seed=1)
    assert plain["sigma"] == pytest.approx(2 * res["sigma"], rel=0.05)


def test_flatness_bad_input():
    w, logits_fn, batches = _per_example_model(torch.ones(10, dtype=torch.float64), 0.0)
    with pytest.raises(TypeError, match="batches"):
        pacbayes_flatness(logits_fn, [w], [torch.arange(3)])
    with pytest.raises(ValueError, match="draws"):
        pacbayes_flatness(logits_fn, [w], batches, draws=0)
    with pytest.raises(ValueError, match="eps"):
        sharpness_mag(logits_fn, [w], batches, eps=-1.0)
    with pytest.raises(ValueError, match="target"):
        pacbayes_flatness(logits_fn, [w], batches, target=0.0)
