"""Local Lipschitz estimates: the spectral norm of a map's Jacobian at a point (a lower estimate of its Lipschitz constant)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..._validation import check_tensor, positive_int


def jacobian_spectral_norm(
    f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, n_iter: int = 20, rel_step: float = 1e-6, seed: int = 0
) -> torch.Tensor:
    """Per-sample ``σ_max(∂f/∂x)`` at ``x`` by power iteration on ``JᵀJ`` (central-difference JVPs, autograd VJPs).

    ``f`` must act on each sample (first dim) independently; use float64 inputs for accurate differences.
    Returns a float64 tensor of shape ``(samples,)``; a lower estimate that tightens with ``n_iter``.
    """
    x = check_tensor(x, "x", ndim=(2, 3, 4), allow_numpy=True).detach()
    positive_int(n_iter, "n_iter")
    B = x.shape[0]
    view = (B,) + (1,) * (x.ndim - 1)

    def per_sample_norm(t):
        return t.flatten(1).norm(dim=1).clamp(min=1e-300)

    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(x.shape, generator=gen, dtype=torch.float64).to(device=x.device, dtype=x.dtype)
    v = v / per_sample_norm(v).view(view)
    h = (rel_step * per_sample_norm(x).clamp(min=1.0)).view(view)
    xg = x.clone().requires_grad_(True)
    with torch.enable_grad():
        y = f(xg)
    sigma = torch.zeros(B, dtype=torch.float64, device=x.device)
    for _ in range(n_iter):
        with torch.no_grad():
            jv = (f(x + h * v) - f(x - h * v)) / (2 * h.view((B,) + (1,) * (y.ndim - 1)))
        sigma = jv.flatten(1).norm(dim=1).double()
        (w,) = torch.autograd.grad(y, xg, grad_outputs=jv, retain_graph=True)
        v = w / per_sample_norm(w).view(view)
    return sigma


def realized_ratio(out_hat: torch.Tensor, out: torch.Tensor, in_hat: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
    """Per sample ``‖f(Ẑ) − f(Z)‖_F / ‖Ẑ − Z‖_F`` (0 where ``Ẑ = Z``): a lower estimate of the Lipschitz constant on
    the segment ``[Z, Ẑ]`` (mean-value inequality), float64."""
    num = (out_hat - out).double().flatten(1).norm(dim=1)
    den = (in_hat - inp).double().flatten(1).norm(dim=1)
    return torch.where(den > 0, num / den.clamp(min=1e-300), torch.zeros_like(num))
