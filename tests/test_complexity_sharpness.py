import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hf_tdiag.measures.sharpness import pac_bayes_flatness, sharpness


def test_sharpness_of_linear_loss_is_exact_box_maximum():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(20, dtype=torch.float64))
    gs = [torch.randn(20, dtype=torch.float64) for _ in range(3)]
    rho, xi = 0.1, 1e-3
    got = sharpness(lambda g: (g * w).sum(), [w], gs, rho=rho, steps=3, xi=xi)
    # max over |d_i| <= rho(|w_i|+xi) of g.d is sum |g_i| rho (|w_i| + xi); averaged over batches
    expected = sum(float((g.abs() * rho * (w.detach().abs() + xi)).sum()) for g in gs) / len(gs)
    assert got == pytest.approx(expected, rel=1e-10)


def test_sharpness_of_separable_quadratic_matches_corner():
    torch.manual_seed(1)
    w = nn.Parameter(torch.randn(30, dtype=torch.float64))
    a = torch.rand(30, dtype=torch.float64) + 0.5
    rho = 0.2
    got = sharpness(lambda _: 0.5 * (a * w**2).sum(), [w], [None], rho=rho, steps=4, xi=0.0)
    w0 = w.detach()
    # worst case in the box: move every weight away from 0 by the full half-width
    expected = float(0.5 * (a * (w0.abs() * (1 + rho)) ** 2).sum() - 0.5 * (a * w0**2).sum())
    assert got == pytest.approx(expected, rel=1e-10)
    assert torch.equal(w.detach(), w0)  # restored


def _toy_classifier():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    x = torch.randn(96, 6)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(150):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    model.eval()
    batches = [(x[i : i + 32], y[i : i + 32]) for i in range(0, 96, 32)]
    return model, batches


def test_sharpness_grows_with_rho_and_restores_model():
    model, batches = _toy_classifier()
    before = [p.detach().clone() for p in model.parameters()]
    loss_fn = lambda b: F.cross_entropy(model(b[0]), b[1])  # noqa: E731
    values = [sharpness(loss_fn, model.parameters(), batches, rho=r, steps=5) for r in (1e-3, 1e-2, 5e-2, 2e-1)]
    assert all(v >= 0 for v in values)
    assert all(a < b for a, b in zip(values, values[1:])), values
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.requires_grad for p in model.parameters())
    # ascent beats a random corner of the same box (it is a worst-case search)
    with torch.no_grad():
        l0 = sum(float(loss_fn(b)) for b in batches) / len(batches)
        for p in model.parameters():
            p.add_(0.05 * (p.abs() + 1e-3) * torch.sign(torch.randn_like(p)))
        rand = sum(float(loss_fn(b)) for b in batches) / len(batches) - l0
        for p, w in zip(model.parameters(), before):
            p.copy_(w)
    assert values[2] > rand


def test_pac_bayes_flatness_of_quadratic_matches_closed_form():
    # L(w) = a/2 |w|^2 at w = 0: E L(w + sigma u) - L(w) = a sigma^2 n / 2 -> sigma* = sqrt(2 thr / (a n))
    n, a, thr = 20000, 3.0, 0.1
    w = nn.Parameter(torch.zeros(n, dtype=torch.float64))
    res = pac_bayes_flatness(lambda _: 0.5 * a * (w**2).sum(), [w], [None], threshold=thr, samples=2, iters=30)
    expected = math.sqrt(2 * thr / (a * n))
    assert res["sigma"] == pytest.approx(expected, rel=0.03)
    assert res["flatness"] == pytest.approx(1 / res["sigma"] ** 2)
    assert torch.count_nonzero(w.detach()) == 0  # restored
    sharper = pac_bayes_flatness(lambda _: 0.5 * 4 * a * (w**2).sum(), [w], [None], threshold=thr, samples=2, iters=30)
    assert sharper["sigma"] == pytest.approx(expected / 2, rel=0.03)


def test_pac_bayes_flatness_on_classifier_is_deterministic():
    model, batches = _toy_classifier()
    loss_fn = lambda b: F.cross_entropy(model(b[0]), b[1])  # noqa: E731
    r1 = pac_bayes_flatness(loss_fn, model.parameters(), batches, threshold=0.05, samples=3, iters=8)
    r2 = pac_bayes_flatness(loss_fn, model.parameters(), batches, threshold=0.05, samples=3, iters=8)
    assert r1 == r2
    loose = pac_bayes_flatness(loss_fn, model.parameters(), batches, threshold=0.5, samples=3, iters=8)
    assert loose["sigma"] > r1["sigma"]


def test_bad_arguments():
    w = nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="rho"):
        sharpness(lambda _: w.sum(), [w], [None], rho=0)
    with pytest.raises(ValueError, match="batches"):
        sharpness(lambda _: w.sum(), [w], [])
    with pytest.raises(TypeError, match="loss_fn"):
        sharpness(lambda _: 1.0, [w], [None])
    with pytest.raises(ValueError, match="sigma_min"):
        pac_bayes_flatness(lambda _: w.sum(), [w], [None], sigma_min=1.0, sigma_max=0.5)
