"""Sharpness-based generalization measures (Jiang et al. 2020; Keskar et al. 2017).

Jiang et al.'s flatness measures, under their names. Each takes ``logits_fn(inputs)
-> (n, classes) logits`` evaluated with the current values of ``params`` (the tensors
to perturb, in place; always restored) and ``batches`` of ``(inputs, labels)``, the
training set. Each searches, by Jiang's bisection, the perturbation scale at which
the **training accuracy drops by** ``target`` (0.1, within ``tolerance`` 0.01):

- ``sharpness_mag``: 1/α′², α′ such that the worst case over the box
  |u_i| ≤ α′(|w_i| + ε) (found by projected sign-gradient ascent on the cross-entropy,
  PGD) lowers the accuracy by ``target``. (The box α′|w_i| + ε does not shrink to
  zero with α′: on small models its ε-part alone can drop the accuracy by more
  than the target, and the search has no answer.)
- ``pacbayes_flatness``: 1/σ′², σ′ such that u ~ N(0, σ′²I) lowers the mean
  accuracy (Monte-Carlo over ``draws``) by ``target``.
- ``pacbayes_flatness_mag``: the same with u_i ~ N(0, σ′²w_i² + ε²).

The older cross-entropy forms below stay for their own use; they take a *loss closure* ``loss_fn(batch) -> scalar tensor`` that evaluates the
loss with the current values of ``params`` (the tensors to perturb, typically
``[p for p in model.parameters() if p.requires_grad]``), and an iterable of
batches. They perturb ``params`` in place and always restore them; they know
nothing about the model class. Put the model in ``eval()`` mode first so that
dropout does not add noise to the loss.

- ``sharpness``: mean over batches of max_{|δ_i| ≤ ρ(|w_i|+ξ)} L(w+δ) − L(w),
  the worst-case loss increase in a box whose half-widths are relative to each
  weight's magnitude, found by a few steps of projected sign-gradient ascent.
- ``pac_bayes_flatness``: the largest σ such that E_{u~N(0,σ²I)} L(w+u) − L(w) ≤
  threshold, found by bisection on log σ with common random numbers (the same
  noise directions for every σ), reported with the measure 1/σ².
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from .._progress import tqdm
from .._validation import integer, non_negative_float, positive_float, positive_int
from .complexity import bisect_largest, project_box

__all__ = [
    "sharpness_mag",
    "pacbayes_flatness",
    "pacbayes_flatness_mag",
    "bisect_to_target",
    "accuracy",
    "sharpness",
    "pac_bayes_flatness",
]


def _check_params(params) -> list[torch.Tensor]:
    if isinstance(params, torch.Tensor):
        params = [params]
    try:
        params = list(params)
    except TypeError:
        raise TypeError(f"params: expected an iterable of tensors, got {type(params).__name__}") from None
    if not params:
        raise ValueError("params: expected at least one tensor to perturb, got none")
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor) or not p.is_floating_point():
            raise TypeError(
                f"params[{i}]: expected a floating torch.Tensor, got {getattr(p, 'dtype', type(p).__name__)}"
            )
        if not bool(torch.isfinite(p.detach()).all()):
            raise ValueError(f"params[{i}]: contains NaN or inf values (shape {tuple(p.shape)})")
    return params


def _check_batches(batches) -> list:
    if isinstance(batches, (torch.Tensor, dict)):
        raise TypeError(
            f"batches: expected an iterable of batches (e.g. a list), got a single {type(batches).__name__}; wrap it in a list"
        )
    try:
        batches = list(batches)
    except TypeError:
        raise TypeError(f"batches: expected an iterable of batches, got {type(batches).__name__}") from None
    if not batches:
        raise ValueError("batches: expected at least one batch, got none")
    return batches


def _loss(loss_fn, batch) -> torch.Tensor:
    loss = loss_fn(batch)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(
            f"loss_fn: expected it to return a scalar tensor, got {type(loss).__name__} {getattr(loss, 'shape', '')}"
        )
    if not bool(torch.isfinite(loss.detach())):
        raise ValueError(f"loss_fn: returned a non-finite loss ({float(loss.detach())})")
    return loss.reshape(())


@torch.no_grad()
def _assign(
    params: Sequence[torch.Tensor],
    base: Sequence[torch.Tensor],
    delta: Sequence[torch.Tensor] | None,
    scale: float = 1.0,
):
    for p, w, d in zip(params, base, delta if delta is not None else [None] * len(params)):
        if d is None:
            p.copy_(w)
        else:
            p.copy_(w + scale * d)


def sharpness(
    loss_fn: Callable[[object], torch.Tensor],
    params: Iterable[torch.Tensor],
    batches: Iterable,
    rho: float = 0.05,
    steps: int = 5,
    xi: float = 1e-3,
    progress: bool = False,
) -> float:
    """mean_b max_{|δ_i| ≤ ρ(|w_i|+ξ)} [L_b(w+δ) − L_b(w)], by ``steps`` steps of projected sign-gradient ascent."""
    params = _check_params(params)
    batches = _check_batches(batches)
    rho = positive_float(rho, "rho")
    steps = positive_int(steps, "steps")
    xi = non_negative_float(xi, "xi")
    alpha = min(1.0, 2.5 / steps)  # step as a fraction of the half-width (PGD convention)
    base = [p.detach().clone() for p in params]
    bounds = [rho * (w.abs() + xi) for w in base]
    requires = [p.requires_grad for p in params]
    increases = []
    try:
        for p in params:
            p.requires_grad_(True)
        for batch in tqdm(batches, desc="sharpness", disable=not progress, leave=False):
            _assign(params, base, None)
            with torch.no_grad():
                l0 = float(_loss(loss_fn, batch))
            delta = [torch.zeros_like(w) for w in base]
            best = 0.0
            for _ in range(steps):
                _assign(params, base, delta)
                loss = _loss(loss_fn, batch)
                grads = torch.autograd.grad(loss, params, allow_unused=True)
                best = max(best, float(loss.detach()) - l0)
                with torch.no_grad():
                    delta = [
                        d if g is None else project_box(d + alpha * b * torch.sign(g), b)
                        for d, g, b in zip(delta, grads, bounds)
                    ]
            _assign(params, base, delta)
            with torch.no_grad():
                best = max(best, float(_loss(loss_fn, batch)) - l0)
            increases.append(best)
    finally:
        _assign(params, base, None)
        for p, r in zip(params, requires):
            p.requires_grad_(r)
    return float(sum(increases) / len(increases))


def pac_bayes_flatness(
    loss_fn: Callable[[object], torch.Tensor],
    params: Iterable[torch.Tensor],
    batches: Iterable,
    threshold: float = 0.1,
    samples: int = 4,
    sigma_min: float = 1e-5,
    sigma_max: float = 1.0,
    iters: int = 12,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, float]:
    """σ* = max{σ : E_{u~N(0,σ²I)} mean_b L_b(w+u) − mean_b L_b(w) ≤ threshold} by bisection; returns σ* and 1/σ*².

    The expectation is a Monte-Carlo mean over ``samples`` noise draws that are the
    same for every σ (draw s uses seed ``seed + s``), so the bisection sees a
    deterministic function of σ.
    """
    params = _check_params(params)
    batches = _check_batches(batches)
    threshold = positive_float(threshold, "threshold")
    samples = positive_int(samples, "samples")
    iters = positive_int(iters, "iters")
    sigma_min = positive_float(sigma_min, "sigma_min")
    sigma_max = positive_float(sigma_max, "sigma_max")
    if not sigma_min < sigma_max:
        raise ValueError(f"sigma_min, sigma_max: expected sigma_min < sigma_max, got {sigma_min!r}, {sigma_max!r}")
    integer(seed, "seed")
    base = [p.detach().clone() for p in params]

    def noise(s: int) -> list[torch.Tensor]:
        out = []
        for i, w in enumerate(base):
            gen = torch.Generator(device=w.device)
            gen.manual_seed(seed * 1_000_003 + s * 10_007 + i)
            out.append(torch.randn(w.shape, generator=gen, device=w.device, dtype=w.dtype))
        return out

    bar = tqdm(total=iters + 3, desc="pac-bayes flatness", disable=not progress, leave=False)

    @torch.no_grad()
    def mean_loss(scale: float) -> float:
        total, count = 0.0, 0
        for s in range(samples if scale > 0 else 1):
            eps = noise(s) if scale > 0 else None
            _assign(params, base, eps, scale)
            for batch in batches:
                total += float(_loss(loss_fn, batch))
                count += 1
        bar.update(1)
        return total / count

    try:
        l0 = mean_loss(0.0)
        sigma = bisect_largest(
            lambda s: mean_loss(s) - l0 <= threshold, sigma_min, sigma_max, iters=iters, geometric=True
        )
    finally:
        _assign(params, base, None)
        bar.close()
    return {"sigma": float(sigma), "flatness": float(1.0 / sigma**2)}


# --------------------------------------------------------------------------- Jiang et al. (2020)


def bisect_to_target(
    deviation: Callable[[float], float], upper: float, target: float = 0.1, tolerance: float = 0.01, depth: int = 15
) -> tuple[float, bool, list[tuple[float, float]]]:
    """Jiang et al.'s search: bisect x on [0, ``upper``] until |deviation(x) − target| < tolerance (at most ``depth``
    steps; too much deviation lowers x). Returns (x, whether the target was met, [(x, deviation), ...])."""
    upper = positive_float(upper, "upper")
    target = positive_float(target, "target")
    tolerance = positive_float(tolerance, "tolerance")
    depth = positive_int(depth, "depth")
    lo, hi, history = 0.0, upper, []
    for _ in range(depth):
        x = 0.5 * (lo + hi)
        dev = float(deviation(x))
        history.append((x, dev))
        if abs(dev - target) < tolerance:
            return x, True, history
        if dev > target:
            hi = x
        else:
            lo = x
    return x, False, history


def _check_labelled(batches) -> list:
    batches = _check_batches(batches)
    for i, b in enumerate(batches):
        if not (isinstance(b, (tuple, list)) and len(b) == 2 and isinstance(b[1], torch.Tensor)):
            raise TypeError(
                f"batches[{i}]: expected an (inputs, labels) pair with a labels tensor, got {type(b).__name__}"
            )
    return batches


def _logits(logits_fn, inputs, labels) -> torch.Tensor:
    z = logits_fn(inputs)
    if not isinstance(z, torch.Tensor) or z.ndim != 2 or z.shape[0] != labels.shape[0]:
        raise TypeError(
            f"logits_fn: expected a ({labels.shape[0]}, classes) tensor, got {getattr(z, 'shape', type(z).__name__)}"
        )
    return z


@torch.no_grad()
def accuracy(logits_fn: Callable, batches: Iterable) -> float:
    """Fraction of the examples in ``batches`` whose arg-max logit is their label."""
    correct, count = 0, 0
    for x, y in _check_labelled(batches):
        correct += int((_logits(logits_fn, x, y).argmax(dim=1) == y).sum())
        count += int(y.shape[0])
    return correct / count


def _pgd_accuracy_drop(logits_fn, params, base, bounds, batches, acc0: float, steps: int) -> float:
    """Largest accuracy drop seen while ``steps`` steps of projected sign-gradient ascent on the cross-entropy
    search the box |u_i| ≤ bound_i (one perturbation for all batches; every iterate's accuracy counts)."""
    n = sum(int(y.shape[0]) for _, y in batches)
    delta = [torch.zeros_like(w) for w in base]
    worst = 0.0
    for _ in range(steps):
        _assign(params, base, delta)
        grads = [torch.zeros_like(w) for w in base]
        correct = 0
        for x, y in batches:
            z = _logits(logits_fn, x, y)
            loss = torch.nn.functional.cross_entropy(z.float(), y, reduction="sum") / n
            for g, gi in zip(grads, torch.autograd.grad(loss, params, allow_unused=True)):
                if gi is not None:
                    g += gi
            correct += int((z.detach().argmax(dim=1) == y).sum())
        worst = max(worst, acc0 - correct / n)
        with torch.no_grad():
            delta = [project_box(d + (2.5 / steps) * b * torch.sign(g), b) for d, g, b in zip(delta, grads, bounds)]
    _assign(params, base, delta)
    return max(worst, acc0 - accuracy(logits_fn, batches))


def _search_result(scale_name: str, scale: float, reached: bool, acc0: float, history: list) -> dict[str, float]:
    """A flatness search's outcome: the scale found (α′ or σ′), the measure 1/scale², whether the drop reached the
    target within the tolerance, the unperturbed accuracy and the number of bisection evaluations."""
    return {
        scale_name: scale,
        "flatness": 1.0 / scale**2,
        "reached": reached,
        "accuracy": acc0,
        "evaluations": len(history),
    }


def sharpness_mag(
    logits_fn: Callable,
    params: Iterable[torch.Tensor],
    batches: Iterable,
    target: float = 0.1,
    eps: float = 1e-3,
    alpha_max: float = 2.0,
    steps: int = 10,
    tolerance: float = 0.01,
    depth: int = 15,
    progress: bool = False,
) -> dict[str, float]:
    """Jiang et al.'s ``sharpness_mag``: 1/α′², α′ the box scale at which max_{|u_i| ≤ α′(|w_i|+ε)} drops the training
    accuracy by ``target`` (PGD with ``steps`` sign-gradient steps, bisection on α ∈ [0, ``alpha_max``])."""
    params, batches = _check_params(params), _check_labelled(batches)
    steps, eps = positive_int(steps, "steps"), non_negative_float(eps, "eps")
    base = [p.detach().clone() for p in params]
    requires = [p.requires_grad for p in params]
    bar = tqdm(total=depth, desc="sharpness_mag", disable=not progress, leave=False)

    def drop(alpha: float) -> float:
        bar.update(1)
        bounds = [alpha * (w.abs() + eps) for w in base]
        return _pgd_accuracy_drop(logits_fn, params, base, bounds, batches, acc0, steps)

    try:
        for p in params:
            p.requires_grad_(True)
        acc0 = accuracy(logits_fn, batches)
        alpha, reached, history = bisect_to_target(drop, alpha_max, target, tolerance, depth)
    finally:
        _assign(params, base, None)
        for p, r in zip(params, requires):
            p.requires_grad_(r)
        bar.close()
    return _search_result("alpha", alpha, reached, acc0, history)


def _noise(base: Sequence[torch.Tensor], seed: int, draw: int) -> list[torch.Tensor]:
    """Standard normal noise shaped like ``base``; the same for every call with the same (seed, draw)."""
    out = []
    for i, w in enumerate(base):
        gen = torch.Generator(device=w.device)
        gen.manual_seed(seed * 1_000_003 + draw * 10_007 + i)
        out.append(torch.randn(w.shape, generator=gen, device=w.device, dtype=w.dtype))
    return out


def _pacbayes_sigma(
    logits_fn, params, batches, target, draws, sigma_max, magnitude_eps, seed, tolerance, depth, progress
):
    params, batches = _check_params(params), _check_labelled(batches)
    draws = positive_int(draws, "draws")
    integer(seed, "seed")
    base = [p.detach().clone() for p in params]
    bar = tqdm(total=depth, desc="pacbayes_flatness", disable=not progress, leave=False)

    def drop(sigma: float) -> float:
        bar.update(1)
        accs = []
        for s in range(draws):  # the same draws for every sigma: the bisection sees a deterministic function
            z = _noise(base, seed, s)
            if magnitude_eps is None:
                u = [sigma * zi for zi in z]
            else:
                u = [torch.sqrt(sigma**2 * w**2 + magnitude_eps**2) * zi for w, zi in zip(base, z)]
            _assign(params, base, u)
            accs.append(accuracy(logits_fn, batches))
        return acc0 - sum(accs) / draws

    try:
        _assign(params, base, None)
        acc0 = accuracy(logits_fn, batches)
        sigma, reached, history = bisect_to_target(drop, sigma_max, target, tolerance, depth)
    finally:
        _assign(params, base, None)
        bar.close()
    return _search_result("sigma", sigma, reached, acc0, history)


def pacbayes_flatness(
    logits_fn: Callable,
    params: Iterable[torch.Tensor],
    batches: Iterable,
    target: float = 0.1,
    draws: int = 10,
    sigma_max: float = 2.0,
    seed: int = 0,
    tolerance: float = 0.01,
    depth: int = 15,
    progress: bool = False,
) -> dict[str, float]:
    """Jiang et al.'s ``pacbayes_flatness``: 1/σ′², σ′ at which u ~ N(0, σ′²I) drops the mean training accuracy
    (over ``draws`` noise draws) by ``target``; bisection on σ ∈ [0, ``sigma_max``]."""
    return _pacbayes_sigma(logits_fn, params, batches, target, draws, sigma_max, None, seed, tolerance, depth, progress)


def pacbayes_flatness_mag(
    logits_fn: Callable,
    params: Iterable[torch.Tensor],
    batches: Iterable,
    target: float = 0.1,
    eps: float = 1e-3,
    draws: int = 10,
    sigma_max: float = 2.0,
    seed: int = 0,
    tolerance: float = 0.01,
    depth: int = 15,
    progress: bool = False,
) -> dict[str, float]:
    """Jiang et al.'s ``pacbayes_mag_flatness``: 1/σ′², σ′ at which u_i ~ N(0, σ′²w_i² + ε²) drops the mean training
    accuracy by ``target``; bisection on σ ∈ [0, ``sigma_max``]."""
    eps = non_negative_float(eps, "eps")
    return _pacbayes_sigma(logits_fn, params, batches, target, draws, sigma_max, eps, seed, tolerance, depth, progress)
