"""Prediction heads ``h(u)`` applied to the attention output ``u_i = X_iᵀ softmax(X_i W z_i)`` (batched over runs).

* linear (``head=None``): ``h(u) = vᵀu`` with the data's ``v`` — the paper's main setting;
* :class:`ReLUHead`: ``h(u) = 1ᵀReLU(Vᵀu)`` (the nonlinear head of Fig. 9);
* :class:`LambdaHead`: ``h(u) = vᵀu − λ‖u‖²`` (concave; selects several tokens, Figs 10/13);
* :class:`MLPHead`: ``h(u) = aᵀReLU(B u)`` with a fixed random ``B`` and ``a = ±1/√hidden``.
"""

from __future__ import annotations

import math

import torch

from .data import check_pos_int

__all__ = ["MLPHead", "ReLUHead", "LambdaHead"]


class MLPHead:
    """A fixed random nonlinear head ``h(u) = aᵀ ReLU(B u)`` (B: hidden×d Gaussian/√d, a: ±1/√hidden)."""

    def __init__(self, d: int, hidden: int = 16, *, seed: int = 0):
        check_pos_int(d, "d")
        check_pos_int(hidden, "hidden")
        g = torch.Generator().manual_seed(seed)
        self.B = torch.randn(hidden, d, generator=g, dtype=torch.float64) / math.sqrt(d)
        self.a = (torch.randint(0, 2, (hidden,), generator=g).to(torch.float64) * 2 - 1) / math.sqrt(hidden)

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        return torch.relu(u @ self.B.T) @ self.a


class ReLUHead:
    """``h(u) = 1ᵀ ReLU(Vᵀ u)`` for ``V (d, k)``, or one ``V`` per run ``(R, d, k)`` for batched ``u (R, n, d)``."""

    def __init__(self, V: torch.Tensor):
        if not isinstance(V, torch.Tensor) or V.ndim not in (2, 3):
            raise ValueError(f"V: expected a (d, k) or (R, d, k) tensor, got {getattr(V, 'shape', type(V).__name__)}")
        self.V = V.detach().to(torch.float64)

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        return torch.relu(u @ self.V).sum(-1)


class LambdaHead:
    """``h(u) = vᵀu − λ‖u‖²`` with ``v (d,)`` or ``(R, d)`` and ``λ ≥ 0`` (a float or one per run ``(R,)``)."""

    def __init__(self, v: torch.Tensor, lam):
        self.v = v.detach().to(torch.float64)
        lam_t = torch.as_tensor(lam, dtype=torch.float64)
        if not bool(torch.isfinite(lam_t).all()) or bool((lam_t < 0).any()):
            raise ValueError(f"lam: expected λ ≥ 0, got {lam!r}")
        self.lam = lam_t

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        lam = self.lam[..., None] if self.lam.ndim else self.lam
        return torch.einsum("...nd,...d->...n", u, self.v) - lam * (u * u).sum(-1)
