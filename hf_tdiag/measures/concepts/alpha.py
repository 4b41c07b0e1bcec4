"""The bound's attention-projection constant ``α`` and the token scales it divides by (docs/concept_bound.md §7).

``α = γ_max²/(2√p s²) · ‖X‖_op · Σ_k ‖W_V^k‖_op ‖W_O^k‖_op`` of the block after layer ℓ: ``γ`` its attention
norm's weight, ``p`` the head size, ``s`` a token scale of that norm, ``X`` the attention input. Certified: the
smallest token scale and the largest ``‖X‖_op`` on the per-token domain around the data; estimated: the data's
median token scale and ``‖X₀‖_op``. Post-norm blocks read ``Z`` itself (``γ²/s² → 1``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import torch

from .certified import layernorm_deviation, layernorm_output_norm, op_norm

__all__ = [
    "Norm",
    "gamma_max",
    "token_scale",
    "smallest_token_scale_sq",
    "value_output_gain",
    "alpha",
    "alpha_prenorm",
    "alpha_postnorm",
]


class Norm(NamedTuple):
    """A LayerNorm's (or RMSNorm's) parameters: ``weight`` ``γ`` and ``bias`` ``β`` (either may be None) and ``eps``."""

    weight: torch.Tensor | None
    bias: torch.Tensor | None
    eps: float


def gamma_max(weight: torch.Tensor | None) -> float:
    """``γ_max = max_i |γ_i|`` (1 without a weight)."""
    return float(weight.detach().double().abs().max()) if weight is not None else 1.0


def token_scale(Z: torch.Tensor, eps: float, centred: bool = True) -> torch.Tensor:
    """Per token what the norm divides by: ``√(var z + ε)`` (LayerNorm, ``centred``) or ``√(mean z² + ε)`` (RMSNorm)."""
    Zd = Z.double()
    second = Zd.var(dim=-1, unbiased=False) if centred else Zd.square().mean(dim=-1)
    return torch.sqrt(second + eps)


def smallest_token_scale_sq(Z: torch.Tensor, radius: torch.Tensor, eps: float) -> torch.Tensor:
    """Per input ``min_t (max(m_t − r_t, 0)²/d + ε)``: the smallest squared LayerNorm scale on the domain where token
    t stays within ``r_t`` of the data's ``z_t`` (``m_t = ‖z_t − z̄_t‖``)."""
    Zd = Z.double()
    m = (Zd - Zd.mean(-1, keepdim=True)).norm(dim=-1)
    e = radius.double().to(Zd.device)
    return ((m - e).clamp(min=0).square() / Z.shape[-1] + eps).amin(-1)


def value_output_gain(heads: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """``Σ_k ‖W_V^k‖_op ‖W_O^k‖_op`` over the heads' ``(W_V^k, W_O^k)`` pairs (float64)."""
    return sum(float(op_norm(W_v.double())) * float(op_norm(W_o.double())) for W_v, W_o in heads)


def alpha(g_max: float, head_dim: int, gain: float, x_op, scale_sq):
    """``α = γ_max²/(2√p s²) · ‖X‖_op · Σ_k ‖W_V^k‖‖W_O^k‖`` (``gain`` the sum; numbers or per-input tensors)."""
    return g_max**2 * (gain / (2.0 * math.sqrt(head_dim))) * x_op / scale_sq


def alpha_prenorm(Z: torch.Tensor, X: torch.Tensor, radius: torch.Tensor, norm: Norm, head_dim: int, gain: float):
    """Per input ``(α certified, α estimated)`` of a pre-norm block: ``X = LN₁(Z)`` its attention input on the data,
    ``radius`` (inputs, T) the per-token domain around ``Z``; certified with the smallest token scale there and
    ``sup ‖X‖_op ≤ min(‖X₀‖_op + ‖LN₁ deviation‖_F, √T (γ_max √d + ‖β‖))``, estimated with the median token scale
    and ``‖X₀‖_op``."""
    e = radius.double().to(Z.device)
    g = gamma_max(norm.weight)
    s2_cert = smallest_token_scale_sq(Z, e, norm.eps)
    s2_est = token_scale(Z, norm.eps).median(dim=-1).values.square()
    cap = math.sqrt(Z.shape[-2]) * layernorm_output_norm(norm.weight, norm.bias, Z.shape[-1])
    x_op = op_norm(X)
    x_sup = (x_op + layernorm_deviation(Z, e, norm.weight, norm.eps).norm(dim=-1)).clamp(max=cap)
    return alpha(g, head_dim, gain, x_sup, s2_cert), alpha(g, head_dim, gain, x_op, s2_est)


def alpha_postnorm(Z: torch.Tensor, radius: torch.Tensor, head_dim: int, gain: float):
    """Per input ``(α certified, α estimated)`` of a post-norm block, whose attention reads ``Z`` itself: ``‖X‖_op``
    at most ``‖Z₀‖_op + ‖e‖₂`` on the domain (certified), ``‖Z₀‖_op`` at the data (estimated); ``γ²/s² = 1``."""
    e = radius.double().to(Z.device)
    x_op = op_norm(Z)
    return alpha(1.0, head_dim, gain, x_op + e.norm(dim=-1), 1.0), alpha(1.0, head_dim, gain, x_op, 1.0)
