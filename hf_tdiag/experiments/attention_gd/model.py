"""The 1-layer attention model ``f(X) = h(Xᵀ softmax(X W z))`` and its logistic loss, with a stable linear-head gradient."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .data import AttentionData

__all__ = ["attention_logits", "attention_output", "attention_loss", "loss_and_grad_linear"]


def attention_logits(data: AttentionData, W: torch.Tensor) -> torch.Tensor:
    """``ℓ_it = x_itᵀ W z_i`` (…, n, T)."""
    return torch.einsum("...ntd,...de,...ne->...nt", data.X, W, data.z)


def attention_output(data: AttentionData, W: torch.Tensor, head: Callable | None = None) -> torch.Tensor:
    """``f(X_i) = vᵀ X_iᵀ softmax(X_i W z_i)`` (or ``h(X_iᵀ softmax(X_i W z_i))``), shape (…, n)."""
    s = torch.softmax(attention_logits(data, W), dim=-1)
    u = torch.einsum("...nt,...ntd->...nd", s, data.X)
    return torch.einsum("...nd,...d->...n", u, data.v) if head is None else head(u)


def attention_loss(data: AttentionData, W: torch.Tensor, head: Callable | None = None) -> torch.Tensor:
    """Logistic loss ``(1/n) Σ log(1 + exp(−Y_i f(X_i)))`` (one value per run)."""
    return torch.nn.functional.softplus(-data.Y * attention_output(data, W, head)).mean(-1)


def loss_and_grad_linear(data: AttentionData, W: torch.Tensor):
    """Logistic loss and ``∇_W = e^{M} · G`` for the linear head, returned as ``(loss, G, M)`` (per run).

    Written so saturated softmaxes keep full precision: ``∂L/∂ℓ_it = L'_i s_it (a_it − f_i)``
    with ``a_it = vᵀx_it`` and ``a_it − f_i = Σ_τ s_iτ (a_it − a_iτ)`` (no cancellation);
    ``∇_W = Σ_i Σ_t ∂L/∂ℓ_it (x_it − x_{i,r_i}) z_iᵀ`` with ``r_i`` the top token (the
    ``∂L/∂ℓ_i`` sum to zero). The magnitudes are combined in log space and the largest
    is factored out as ``e^{M}``, so the *direction* survives even when every
    non-selected probability underflows (normalized GD only needs the direction).
    For a batch (leading run dimension) ``loss`` and ``M`` are tensors ``(R,)``; for one run, floats.
    """
    X, z = data.X, data.z
    n = X.shape[-3]
    logs = torch.log_softmax(attention_logits(data, W), dim=-1)
    s = logs.exp()
    a = torch.einsum("...ntd,...d->...nt", X, data.v)
    c = torch.einsum("...nr,...ntr->...nt", s, a[..., :, None] - a[..., None, :])
    margin = data.Y * (s * a).sum(-1)
    loss = torch.nn.functional.softplus(-margin).mean(-1)
    dldf = -data.Y * torch.sigmoid(-margin) / n
    logmag = torch.log(dldf.abs())[..., None] + logs + torch.log(c.abs())
    M = logmag.flatten(-2).amax(-1)
    finite = torch.isfinite(M)
    Msafe = torch.where(finite, M, torch.zeros_like(M))
    dl = torch.sign(dldf)[..., None] * torch.sign(c) * torch.exp(logmag - Msafe[..., None, None])
    dl = torch.where(finite[..., None, None], dl, torch.zeros_like(dl))
    ref = logs.argmax(-1, keepdim=True)
    x_ref = torch.take_along_dim(X, ref[..., None], dim=-2)
    G = torch.einsum("...nt,...ntd->...nd", dl, X - x_ref)
    grad = torch.einsum("...nd,...ne->...de", G, z)
    if grad.ndim == 2:
        return float(loss), grad, float(Msafe)
    return loss, grad, Msafe
