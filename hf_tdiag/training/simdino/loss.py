"""SimDINO's coding-rate self-distillation loss and DINO's centred, sharpened cross-entropy (the comparison).

SimDINO (Wu et al. 2025, ``simdino/main_dino.py:MCRLoss`` of ``RobinWu218/SimDINO``) on the L2-normalised head
outputs ``z`` of ``V`` student views (the first ``G`` global) and the teacher's ``G`` global views, batch ``m``,
width ``p``::

    loss = −coeff · mean_{i<G, v≠i} mean_b cos(t_{i,b}, s_{v,b}) − γ · mean_{i<G} R_ε(Y_i)

with ``R_ε(Y) = ½ logdet(I + p/(m ε²) YᵀY)`` (:func:`hf_tdiag.measures.coding_rate.coding_rate`) and
``Y_i = (s_i + t_i)/2`` (the authors' default ``expa_type=1``; ``expansion="student"`` is their ``expa_type=0``,
``Y_i = s_i``). ``γ = (p + m)/(p·m)`` unless given. Where this differs from the issue's ``‖z_s − z_t‖² − γ·R_ε(Z)``:
on unit vectors ``‖s − t‖² = 2 − 2cos(s, t)``, so the first term is ``coeff·(½‖s − t‖² − 1)`` averaged over the
``G·V − G`` cross-view pairs (a view is never compared with itself); the coding rate is taken per global view and
averaged (not on the pooled ``Z``); the authors' ``--eps`` multiplies ``WᵀW`` as ``p/(m·eps)``: it is our ``ε²``
(their default 0.5 is ``ε = √0.5``; SimDINOv2's 0.05 is ``ε ≈ 0.224``).

DINO (Caron et al. 2021, ``DINOLoss`` of the same file): ``−mean_{i, v≠i} Σ_k softmax((t_i − c)/τ_t)_k ·
log softmax(s_v/τ_s)_k`` with the centre ``c`` an EMA (``center_momentum``) of the teacher's batch means, updated
after each call.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...measures.coding_rate import coding_rate

EXPANSIONS = ("mean", "student")


def _views(x: torch.Tensor, n: int, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        raise ValueError(f"{name}: expected a (views * batch, dim) tensor, got {getattr(x, 'shape', type(x))}")
    if x.shape[0] % n:
        raise ValueError(f"{name}: {x.shape[0]} rows do not split into {n} views of equal batch")
    return x.view(n, x.shape[0] // n, x.shape[1])


def _check_counts(n_crops: int, n_global: int) -> None:
    if not (isinstance(n_global, int) and isinstance(n_crops, int) and 1 <= n_global <= n_crops):
        raise ValueError(f"n_global/n_crops: expected 1 <= n_global <= n_crops, got {n_global} and {n_crops}")


def cross_view_mean(pairs: torch.Tensor) -> torch.Tensor:
    """Mean of ``pairs`` (G, V) over the ``G·V − G`` entries with ``v ≠ i`` (a view against itself left out)."""
    G, V = pairs.shape[:2]
    keep = ~torch.eye(G, V, dtype=torch.bool, device=pairs.device)
    return pairs[keep].sum() / (G * V - min(G, V))


class SimDINOLoss(nn.Module):
    """``loss = −coeff·compression − expansion`` (see the module docstring); returns ``(loss, parts)``.

    ``eps``: ε of ``R_ε`` (the authors' ``--eps`` is ε²); ``gamma``: the coding-rate weight, None for the
    authors' ``(p + m)/(p·m)``; ``coeff``: the weight of the mean cosine similarity; ``expansion``: ``"mean"``
    (``R`` of the student/teacher mean of each global view, the authors' default) or ``"student"``.
    """

    def __init__(
        self,
        n_crops: int,
        n_global: int = 2,
        eps: float = math.sqrt(0.5),
        gamma: float | None = None,
        coeff: float = 1.0,
        expansion: str = "mean",
    ):
        super().__init__()
        _check_counts(n_crops, n_global)
        if expansion not in EXPANSIONS:
            raise ValueError(f"expansion: expected one of {list(EXPANSIONS)}, got {expansion!r}")
        if gamma is not None and not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and gamma >= 0):
            raise ValueError(f"gamma: expected a finite number >= 0 or None (the authors' (p+m)/(pm)), got {gamma!r}")
        if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps: expected a finite number > 0, got {eps!r}")
        self.n_crops, self.n_global, self.eps = n_crops, n_global, float(eps)
        self.gamma, self.coeff, self.expansion = gamma, float(coeff), expansion

    def forward(self, student: torch.Tensor, teacher: torch.Tensor) -> tuple[torch.Tensor, dict]:
        s = _views(student, self.n_crops, "student")  # (V, m, p)
        t = _views(teacher, self.n_global, "teacher")  # (G, m, p)
        if t.shape[1:] != s.shape[1:]:
            raise ValueError(f"teacher: expected views of shape {tuple(s.shape[1:])}, got {tuple(t.shape[1:])}")
        sim = F.cosine_similarity(t.unsqueeze(1), s.unsqueeze(0), dim=-1)  # (G, V, m)
        compression = cross_view_mean(sim.mean(-1))
        y = s[: self.n_global] if self.expansion == "student" else (s[: self.n_global] + t) / 2
        m, p = y.shape[1], y.shape[2]
        gamma = (p + m) / (p * m) if self.gamma is None else self.gamma
        rate = coding_rate(y, eps=self.eps).mean()
        expansion = (gamma * rate).to(compression.dtype)
        loss = -self.coeff * compression - expansion
        return loss, {"compression": compression.detach(), "expansion": expansion.detach(), "rate": rate.detach()}


class DINOLoss(nn.Module):
    """DINO's cross-entropy between sharpened, centred teacher and student prototype scores; ``(loss, parts)``.

    ``out_dim``: the number of prototypes; the teacher temperature is passed to each call (its warmup schedule is
    the caller's); ``center`` is a buffer (saved with the model's state).
    """

    def __init__(
        self, out_dim: int, n_crops: int, n_global: int = 2, student_temp: float = 0.1, center_momentum: float = 0.9
    ):
        super().__init__()
        _check_counts(n_crops, n_global)
        if not 0.0 <= center_momentum <= 1.0:
            raise ValueError(f"center_momentum: expected a value in [0, 1], got {center_momentum!r}")
        if not student_temp > 0:
            raise ValueError(f"student_temp: expected a value > 0, got {student_temp!r}")
        self.n_crops, self.n_global = n_crops, n_global
        self.student_temp, self.center_momentum = float(student_temp), float(center_momentum)
        self.register_buffer("center", torch.zeros(1, out_dim))

    def forward(self, student: torch.Tensor, teacher: torch.Tensor, teacher_temp: float) -> tuple[torch.Tensor, dict]:
        s = _views(student, self.n_crops, "student")
        t = _views(teacher, self.n_global, "teacher").detach()
        log_p = F.log_softmax(s / self.student_temp, dim=-1)  # (V, m, K)
        q = F.softmax((t - self.center) / teacher_temp, dim=-1)  # (G, m, K)
        ce = -(q.unsqueeze(1) * log_p.unsqueeze(0)).sum(-1).mean(-1)  # (G, V)
        loss = cross_view_mean(ce)
        self.update_center(teacher)
        return loss, {"cross_entropy": loss.detach()}

    @torch.no_grad()
    def update_center(self, teacher: torch.Tensor) -> None:
        """``c ← μ·c + (1 − μ)·mean(teacher)`` (across processes when a process group is running)."""
        total = teacher.detach().sum(0, keepdim=True).to(self.center.dtype)
        count = torch.tensor(float(teacher.shape[0]), device=total.device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(total)
            torch.distributed.all_reduce(count)
        self.center.mul_(self.center_momentum).add_(total / count, alpha=1.0 - self.center_momentum)


__all__ = ["SimDINOLoss", "DINOLoss", "cross_view_mean", "EXPANSIONS"]
