"""Sharpness-based generalization measures (Keskar et al. 2017; Jiang et al. 2020).

Both take a *loss closure* ``loss_fn(batch) -> scalar tensor`` that evaluates the
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

import math
from typing import Callable, Iterable, Sequence

import torch
from tqdm.auto import tqdm

from .complexity import bisect_largest, project_box

__all__ = ["sharpness", "pac_bayes_flatness"]


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
            raise TypeError(f"params[{i}]: expected a floating torch.Tensor, got {getattr(p, 'dtype', type(p).__name__)}")
        if not bool(torch.isfinite(p.detach()).all()):
            raise ValueError(f"params[{i}]: contains NaN or inf values (shape {tuple(p.shape)})")
    return params


def _check_batches(batches) -> list:
    if isinstance(batches, (torch.Tensor, dict)):
        raise TypeError(f"batches: expected an iterable of batches (e.g. a list), got a single {type(batches).__name__}; wrap it in a list")
    try:
        batches = list(batches)
    except TypeError:
        raise TypeError(f"batches: expected an iterable of batches, got {type(batches).__name__}") from None
    if not batches:
        raise ValueError("batches: expected at least one batch, got none")
    return batches


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a finite positive number, got {value!r}")
    return float(value)


def _count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return value


def _loss(loss_fn, batch) -> torch.Tensor:
    loss = loss_fn(batch)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(f"loss_fn: expected it to return a scalar tensor, got {type(loss).__name__} {getattr(loss, 'shape', '')}")
    if not bool(torch.isfinite(loss.detach())):
        raise ValueError(f"loss_fn: returned a non-finite loss ({float(loss.detach())})")
    return loss.reshape(())


@torch.no_grad()
def _assign(params: Sequence[torch.Tensor], base: Sequence[torch.Tensor], delta: Sequence[torch.Tensor] | None, scale: float = 1.0):
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
    rho = _positive(rho, "rho")
    steps = _count(steps, "steps")
    if isinstance(xi, bool) or not isinstance(xi, (int, float)) or not math.isfinite(xi) or xi < 0:
        raise ValueError(f"xi: expected a finite non-negative number, got {xi!r}")
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
    threshold = _positive(threshold, "threshold")
    samples = _count(samples, "samples")
    iters = _count(iters, "iters")
    sigma_min = _positive(sigma_min, "sigma_min")
    sigma_max = _positive(sigma_max, "sigma_max")
    if not sigma_min < sigma_max:
        raise ValueError(f"sigma_min, sigma_max: expected sigma_min < sigma_max, got {sigma_min!r}, {sigma_max!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
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
        sigma = bisect_largest(lambda s: mean_loss(s) - l0 <= threshold, sigma_min, sigma_max, iters=iters, geometric=True)
    finally:
        _assign(params, base, None)
        bar.close()
    return {"sigma": float(sigma), "flatness": float(1.0 / sigma**2)}
