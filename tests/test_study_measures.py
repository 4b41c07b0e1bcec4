"""Every number of the study's table against an independent computation on a small trained CRATE.

The study's values come from ``compute_measures``; the references here are written out by hand: the weight
tensors named explicitly, norms by numpy's SVD, the margin by sorting, and the flatness searches checked by
their defining property (the accuracy drop at the returned scale, measured here with fresh noise).
"""

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import hf_tdiag  # noqa: F401  (registers CRATE)
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
from hf_tdiag.study import MeasureSettings, compute_measures

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LAYERS = 2


def _fit(variant: str):
    torch.manual_seed(0)
    config = CrateConfig.from_preset(
        "crate-digits",
        variant=variant,
        hidden_size=16,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        num_labels=3,
        pooling="mean",
    )
    model = CrateForImageClassification(config)
    x = torch.randn(120, 1, 8, 8)
    y = (x[:, 0, :4].mean(dim=(1, 2)) > 0).long() + (x[:, 0, 4:].mean(dim=(1, 2)) > 0).long()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        F.cross_entropy(model(pixel_values=x).logits, y).backward()
        opt.step()
    model.eval()
    # how well 150 Adam steps fit depends on the CPU's float kernels (on one machine <90% of the examples): label
    # the examples with the model's own predictions, so the margin is defined and the accuracy starts at 1 everywhere
    with torch.no_grad():
        y = model(pixel_values=x).logits.argmax(1)
    return model, x, y


@pytest.fixture(scope="module", params=["crate", "crate-c"])
def fitted(request):
    with torch.no_grad():
        torch.set_num_threads(1)
    model, x, y = _fit(request.param)
    settings = MeasureSettings(max_examples=120, batch_size=64, pac_draws=32)
    details: dict = {}
    values, errors = compute_measures(model, x, y, settings, details=details)
    return request.param, model, x, y, settings, values, errors, details


def _named(model, suffixes):
    params = dict(model.named_parameters())
    return [p.detach().double().numpy() for n, p in params.items() if n.endswith(suffixes)]


def test_l2_is_over_the_weight_matrices_only(fitted):
    variant, model, *_, values, errors, _ = fitted
    # Jiang's l2: the weight matrices, each parameter once; no LayerNorm, bias, CLS or position embedding
    suffixes = ("projection.weight", "attention.qkv.weight", "ista.weight", "classifier.weight")
    if variant == "crate":
        suffixes += ("attention.out_proj.weight",)  # the only variant with an output matrix of its own
    mats = _named(model, suffixes)
    assert len(mats) == 2 + LAYERS * (3 if variant == "crate" else 2)
    assert values["l2"] == pytest.approx(sum(float((m**2).sum()) for m in mats), rel=1e-12)
    everything = sum(float((p.detach().double() ** 2).sum()) for p in model.parameters())
    assert values["l2"] < everything  # a different parameter set gives a different number


def test_l2_parameters_are_the_trainable_weight_matrices_each_once():
    from hf_tdiag.study.measures import jiang_weight_matrices

    torch.manual_seed(1)
    config = CrateConfig.from_preset(
        "crate-digits", variant="crate-c", hidden_size=8, num_hidden_layers=LAYERS, num_attention_heads=2, num_labels=3
    )
    model = CrateForImageClassification(config)
    maps, params = jiang_weight_matrices(model)
    # crate-c applies U^T and, as its output matrix, U: both are maps, only U's parameter is in w
    assert len(maps) == 2 + 3 * LAYERS and len(params) == 2 + 2 * LAYERS
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad and p.ndim == 2}
    assert set(params) == set(trainable) and all(params[n] is p for n, p in trainable.items())
    frozen = "crate.encoder.layer.0.ista.weight"
    model.get_parameter(frozen).requires_grad_(False)  # a frozen matrix is not a parameter of w
    _, params = jiang_weight_matrices(model)
    assert set(params) == set(trainable) - {frozen}


def test_spectral_measures_over_every_linear_map(fitted):
    variant, model, *_, values, errors, _ = fitted
    spec = lambda m: float(np.linalg.svd(m, compute_uv=False)[0])  # noqa: E731
    proj = _named(model, ("projection.weight",))
    u = _named(model, ("attention.qkv.weight",))
    d = _named(model, ("ista.weight",))
    head = _named(model, ("classifier.weight",))
    # per block: U^T, the output matrix (crate: its own W; crate-c: U again, ‖U‖ = ‖U^T‖), the dictionary D
    out = _named(model, ("attention.out_proj.weight",)) if variant == "crate" else u
    norms = [spec(m) for m in proj + head] + [spec(m) for block in zip(u, out, d) for m in block]
    assert len(norms) == 2 + 3 * LAYERS
    log_prod = sum(2 * math.log(s) for s in norms)
    assert values["log_prod_of_spec"] == pytest.approx(log_prod, rel=1e-9)
    assert values["sum_of_spec"] == pytest.approx(len(norms) * math.exp(log_prod / len(norms)), rel=1e-9)


def test_inverse_margin_by_sorting(fitted):
    _, model, x, y, _, values, errors, _ = fitted
    with torch.no_grad():
        z = model(pixel_values=x).logits.double().numpy()
    yy = y.numpy()
    true = z[np.arange(len(yy)), yy]
    z[np.arange(len(yy)), yy] = -np.inf
    margins = np.sort(true - z.max(axis=1))
    # 10th percentile, linear interpolation between order statistics (torch.quantile's default)
    pos = 0.1 * (len(margins) - 1)
    gamma = margins[int(pos)] + (pos - int(pos)) * (margins[int(pos) + 1] - margins[int(pos)])
    assert gamma > 0, "the fixture model must classify >90% of its examples correctly"
    assert values["inverse_margin"] == pytest.approx(1 / gamma**2, rel=1e-9)


def _accuracy(model, x, y):
    with torch.no_grad():
        return float((model(pixel_values=x).logits.argmax(1) == y).double().mean())


def _mean_accuracy_under_noise(model, x, y, std_fn, draws=64, seed=1234):
    """Accuracy with u ~ N(0, std_fn(w)^2) added to every parameter, averaged over fresh draws (restored after)."""
    params = [p for p in model.parameters() if p.requires_grad]
    base = [p.detach().clone() for p in params]
    gen = torch.Generator().manual_seed(seed)
    accs = []
    try:
        for _ in range(draws):
            with torch.no_grad():
                for p, w in zip(params, base):
                    p.copy_(w + std_fn(w) * torch.randn(w.shape, generator=gen, dtype=w.dtype))
            accs.append(_accuracy(model, x, y))
    finally:
        with torch.no_grad():
            for p, w in zip(params, base):
                p.copy_(w)
    return float(np.mean(accs))


@pytest.mark.parametrize("name", ["pacbayes_flatness", "pacbayes_flatness_mag"])
def test_pacbayes_sigma_drops_the_accuracy_by_the_target(fitted, name):
    _, model, x, y, settings, values, errors, details = fitted
    sigma = details[name]["sigma"]
    assert details[name]["reached"] and values[name] == pytest.approx(1 / sigma**2)
    acc0 = _accuracy(model, x, y)
    assert details[name]["accuracy"] == acc0
    eps = settings.magnitude_eps

    def std(scale):
        return (lambda w: scale) if name == "pacbayes_flatness" else (lambda w: torch.sqrt(scale**2 * w**2 + eps**2))

    drop = acc0 - _mean_accuracy_under_noise(model, x, y, std(sigma))
    # the target +- tolerance, plus the Monte-Carlo error of 32 + 64 draws (one draw's accuracy varies by ~0.09 here)
    assert abs(drop - 0.1) < 0.01 + 0.04
    assert (
        acc0 - _mean_accuracy_under_noise(model, x, y, std(sigma / 4))
        < 0.1
        < acc0 - _mean_accuracy_under_noise(model, x, y, std(min(4 * sigma, settings.flatness_upper)))
    )


def test_sharpness_mag_alpha_is_where_a_naive_attack_drops_the_accuracy_by_the_target(fitted):
    _, model, x, y, settings, values, errors, details = fitted
    alpha = details["sharpness_mag"]["alpha"]
    assert details["sharpness_mag"]["reached"] and values["sharpness_mag"] == pytest.approx(1 / alpha**2)
    eps, acc0 = settings.magnitude_eps, _accuracy(model, x, y)
    params = [p for p in model.parameters() if p.requires_grad]
    base = [p.detach().clone() for p in params]

    def attack(a, steps=10):
        """Projected sign-gradient ascent on the cross-entropy in |u| <= a(|w| + eps), written out; worst accuracy seen."""
        bound = [a * (w.abs() + eps) for w in base]
        u = [torch.zeros_like(w) for w in base]
        worst = acc0
        try:
            for _ in range(steps + 1):
                with torch.no_grad():
                    for p, w, ui in zip(params, base, u):
                        p.copy_(w + ui)
                worst = min(worst, _accuracy(model, x, y))
                loss = F.cross_entropy(model(pixel_values=x).logits, y)
                grads = torch.autograd.grad(loss, params)
                u = [torch.clamp(ui + 0.25 * b * g.sign(), -b, b) for ui, g, b in zip(u, grads, bound)]
        finally:
            with torch.no_grad():
                for p, w in zip(params, base):
                    p.copy_(w)
        return acc0 - worst

    assert abs(attack(alpha) - 0.1) < 0.01 + 1 / len(y) + 1e-9
    assert attack(alpha / 4) < 0.1


def _srr_by_hand(Z, U, eps, lam):
    """SRR(Z; U) = Rc - R + lam * sparsity of one sample Z (N, d), U (K, d, p), on the token side in float64."""
    Z, U = Z.double(), U.double()
    N, d = Z.shape
    K, _, p = U.shape

    def half_logdet(A, c):
        return 0.5 * torch.linalg.slogdet(torch.eye(N, dtype=torch.float64) + c * A @ A.T)[1]

    R = half_logdet(Z, d / (N * eps**2))
    Rc = sum(half_logdet(Z @ U[k], p / (N * eps**2)) for k in range(K))
    return float(Rc - R + lam * float((Z != 0).sum()) / (N * d))


def test_srr_columns_are_the_block_outputs_by_hand(fitted):
    _, model, x, y, settings, values, errors, _ = fitted
    with torch.no_grad():
        hidden = model(pixel_values=x, output_hidden_states=True).hidden_states
    heads, d = model.config.num_attention_heads, model.config.hidden_size
    Us = [
        layer.attention.qkv.weight.detach().reshape(heads, d // heads, d).transpose(1, 2)
        for layer in model.crate.encoder.layer
    ]
    # "layer l" is Z^l = hidden_states[l] (the output of block l) with block l's U^l; srr_last is Z^L
    per_layer = [
        np.mean(
            [
                _srr_by_hand(hidden[ell][b], Us[ell - 1], settings.srr_eps, settings.srr_lambda)
                for b in range(x.shape[0])
            ]
        )
        for ell in range(1, LAYERS + 1)
    ]
    assert values["srr_last"] == pytest.approx(per_layer[-1], rel=1e-6)
    assert values["srr_mean"] == pytest.approx(np.mean(per_layer), rel=1e-6)
    assert values["_srr_per_layer"] == pytest.approx(per_layer, rel=1e-6)
