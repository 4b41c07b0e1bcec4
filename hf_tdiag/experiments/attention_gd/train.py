"""(Normalized) gradient descent on the 1-layer attention model, for one run or a batch of independent runs.

The paper's settings (authors' code, ucr-optml/max_margin_attention): step ``η = 0.1``; normalized GD
``W ← W − η ∇/‖∇‖_F``; for ``W = K Qᵀ`` the gradients of ``K`` and ``Q`` are normalized **separately**,
from ``Q = 0`` and a small random ``K`` (``init="zero"``), or from PyTorch's ``nn.Linear`` initialization
``U(−1/√d, 1/√d)`` (``init="linear"``, the local-convergence and Fig. 9 notebooks). A batch of ``R`` runs (data with a
leading run dimension) is trained at once; each run is normalized on its own, so the result equals ``R``
separate runs. As in the authors' code the step is ``η∇/(‖∇‖ + ε)`` and ``(K, Q)`` carry the penalty
``ε(‖K‖² + ‖Q‖²)`` (``ε`` = float64 machine epsilon): once the loss gradient falls to machine precision the
steps shrink (``W``) or pull ``K, Q`` back (KQ). The linear head's gradient is computed in log space, so these
thresholds act on its exact magnitude, not on an underflowed one; ``eps=0, kq_penalty=0`` give plain
normalized GD.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..._threads import torch_threads
from .data import AttentionData, check_pos_int
from .model import attention_logits, attention_loss, loss_and_grad_linear

__all__ = ["GDRun", "GDBatch", "train_attention", "train_attention_batch"]

_INITS = ("zero", "linear")
_ONE_THREAD_NUMEL = 1_000_000  # below this many token entries GD runs on one torch thread
EPS = torch.finfo(torch.float64).eps  # the authors' ε: ∇/(‖∇‖ + ε) and the (K, Q) penalty ε(‖K‖² + ‖Q‖²)


@dataclass
class GDBatch:
    """Trajectories of ``R`` independent gradient-descent runs (leading dimension ``R`` everywhere)."""

    W: torch.Tensor  # (R, d, d_z) final W (= K Qᵀ for the KQ parameterization)
    param: str
    steps: torch.Tensor  # (S,) recorded iteration numbers
    loss: torch.Tensor  # (R, S)
    norm: torch.Tensor  # (R, S) ‖W_t‖_F
    max_prob: torch.Tensor  # (R, S) mean over inputs of the largest softmax probability
    correlation: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> (R, S)
    snapshot_steps: torch.Tensor | None = None  # (S',) iterations of the stored W's
    snapshots: torch.Tensor | None = None  # (R, S', d, d_z)
    K: torch.Tensor | None = None
    Q: torch.Tensor | None = None

    def run(self, r: int) -> GDRun:
        """Run ``r`` as a :class:`GDRun`."""
        return GDRun(
            W=self.W[r],
            param=self.param,
            steps=self.steps,
            loss=self.loss[r],
            norm=self.norm[r],
            correlation={k: v[r] for k, v in self.correlation.items()},
            max_prob=self.max_prob[r],
            snapshot_steps=self.snapshot_steps,
            snapshots=None if self.snapshots is None else self.snapshots[r],
            K=None if self.K is None else self.K[r],
            Q=None if self.Q is None else self.Q[r],
        )


@dataclass
class GDRun:
    """Trajectory of one gradient-descent run."""

    W: torch.Tensor  # final W (d, d_z) (= K Qᵀ for the KQ parameterization)
    param: str
    steps: torch.Tensor  # recorded iteration numbers
    loss: torch.Tensor
    norm: torch.Tensor  # ‖W_t‖_F
    correlation: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> corr(W_t, ref) per recorded step
    max_prob: torch.Tensor | None = None  # mean over inputs of the largest softmax probability per recorded step
    snapshot_steps: torch.Tensor | None = None
    snapshots: torch.Tensor | None = None  # (S', d, d_z) stored W's
    K: torch.Tensor | None = None
    Q: torch.Tensor | None = None

    def probs(self, data: AttentionData) -> torch.Tensor:
        return torch.softmax(attention_logits(data, self.W), dim=-1)


def _check_options(param, steps, lr, record_every, snapshot_every, normalize):
    if param not in ("W", "KQ"):
        raise ValueError(f"param: expected 'W' or 'KQ', got {param!r}")
    check_pos_int(steps, "steps")
    check_pos_int(record_every, "record_every")
    if snapshot_every is not None:
        check_pos_int(snapshot_every, "snapshot_every")
    if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0):
        raise ValueError(f"lr: expected a positive number, got {lr!r}")
    if normalize not in ("separate", "joint"):
        raise ValueError(f"normalize: expected 'separate' (K and Q each) or 'joint', got {normalize!r}")


def _references(references, R: int, d: int, dz: int) -> dict[str, torch.Tensor]:
    """Unit-norm reference matrices ``(R, d, d_z)`` (a single ``(d, d_z)`` is shared by every run)."""
    refs = {}
    for name, ref in (references or {}).items():
        if ref is None:
            continue
        ref = ref.detach().to(torch.float64)
        if ref.shape not in ((d, dz), (R, d, dz)):
            raise ValueError(f"references[{name!r}]: expected shape {(d, dz)} or {(R, d, dz)}, got {tuple(ref.shape)}")
        ref = ref.expand(R, d, dz)
        refs[name] = ref / torch.linalg.norm(ref, dim=(-2, -1), keepdim=True)
    return refs


def _init_params(param: str, R: int, d: int, dz: int, m: int, init, init_scale: float, g) -> list[torch.Tensor]:
    """Initial ``[W]`` or ``[K, Q]`` with a leading run dimension."""

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def linear(*shape):  # nn.Linear(fan_in=shape[-2]) default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        bound = 1.0 / math.sqrt(shape[-2])
        return (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1) * bound

    if init is None or init == "zero":
        return (
            [torch.zeros(R, d, dz, dtype=torch.float64)]
            if param == "W"
            else [init_scale * randn(R, d, m), torch.zeros(R, dz, m, dtype=torch.float64)]
        )
    if init == "linear":
        return [linear(R, d, dz)] if param == "W" else [linear(R, d, m), linear(R, dz, m)]
    if isinstance(init, str):
        raise ValueError(f"init: expected one of {_INITS}, a tensor or a (K, Q) pair, got {init!r}")
    tensors = [init] if param == "W" else (list(init) if isinstance(init, tuple) and len(init) == 2 else None)
    shapes = [(d, dz)] if param == "W" else [(d, m), (dz, m)]
    if tensors is None or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise ValueError(f"init: expected a {'(d, d_z) tensor' if param == 'W' else '(K, Q) pair'} for param={param!r}")
    out = []
    for t, shape in zip(tensors, shapes):
        t = t.detach().to(torch.float64)
        if t.shape not in (shape, (R, *shape)):
            raise ValueError(f"init: expected shape {shape} or {(R, *shape)}, got {tuple(t.shape)}")
        out.append(t.expand(R, *shape).clone())
    return out


def _build(params: list[torch.Tensor]) -> torch.Tensor:
    return params[0] if len(params) == 1 else params[0] @ params[1].transpose(-1, -2)


def _loss_and_grads(data: AttentionData, params: list[torch.Tensor], head: Callable | None, penalty: float):
    """``(loss (R,), grads, log-scale M (R,) or None)``: per run, the gradient of each parameter is ``e^M · grads``.

    ``penalty``: the authors' ``penalty·(‖K‖² + ‖Q‖²)`` for ``W = KQᵀ`` (its gradient ``2·penalty·K`` is
    combined with the log-scaled loss gradient without underflow)."""
    kq = len(params) == 2
    if head is None:
        with torch.no_grad():
            loss, gW, M = loss_and_grad_linear(data, _build(params))
            if not kq:
                return loss, [gW], M
            K, Q = params
            grads = [gW @ Q, gW.transpose(-1, -2) @ K]
            if penalty > 0:
                M2 = torch.maximum(M, torch.full_like(M, math.log(2 * penalty)))
                a, b = torch.exp(M - M2).view(-1, 1, 1), (2 * penalty * torch.exp(-M2)).view(-1, 1, 1)
                grads, M = [a * grads[0] + b * K, a * grads[1] + b * Q], M2
            return loss, grads, M
    live = [p.detach().requires_grad_(True) for p in params]
    loss = attention_loss(data, _build(live), head)
    total = loss.sum() + (penalty * sum((p * p).sum() for p in live) if kq and penalty > 0 else 0.0)
    grads = torch.autograd.grad(total, live)
    return loss.detach(), list(grads), None


def _per_run_norm(t: torch.Tensor) -> torch.Tensor:
    return torch.linalg.norm(t.flatten(1), dim=1)


def _view(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.view(-1, *[1] * (like.ndim - 1))


def _step(params, grads, lr: float, normalized: bool, normalize: str, M, eps: float) -> None:
    """One GD step in place: ``θ ← θ − lr·∇/(‖∇‖ + eps)`` per run (the authors' normalization; ``∇ = e^M·grads``),
    or ``θ ← θ − lr·∇`` when not ``normalized``. A run whose gradient is exactly zero does not move."""
    R = params[0].shape[0]
    if not normalized:
        scale = lr * (torch.exp(M) if M is not None else torch.ones(R, dtype=torch.float64))
        for p, gr in zip(params, grads):
            p -= _view(scale, p) * gr
        return
    eps_scaled = torch.zeros(R, dtype=torch.float64)
    if eps > 0:  # eps in units of e^M (inf when the true gradient is far below eps: no step)
        eps_scaled = eps * (torch.exp(-M) if M is not None else torch.ones(R, dtype=torch.float64))
    norms = [_per_run_norm(gr) for gr in grads]
    if normalize == "joint":
        joint = torch.sqrt(sum(nrm * nrm for nrm in norms))
        norms = [joint] * len(grads)
    for p, gr, nrm in zip(params, grads, norms):
        den = nrm + eps_scaled
        scale = torch.where(den > 0, lr / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(den))
        p -= _view(scale, p) * gr


def _batched(data: AttentionData) -> AttentionData:
    if data.X.ndim == 4:
        return data
    return AttentionData(X=data.X[None], z=data.z[None], v=data.v[None], Y=data.Y[None])


class _Recorder:
    """Loss, norm, correlation with the references, peakedness and optional snapshots at recorded steps."""

    def __init__(self, refs: dict, record_every: int, snapshot_every: int | None, steps: int):
        self.refs, self.every, self.snap_every, self.last = refs, record_every, snapshot_every, steps
        self.steps, self.loss, self.norm, self.max_prob = [], [], [], []
        self.corr = {name: [] for name in refs}
        self.snap_steps, self.snaps = [], []

    def __call__(self, it: int, data: AttentionData, W: torch.Tensor, loss: torch.Tensor) -> None:
        if self.snap_every is not None and (it % self.snap_every == 0 or it == self.last):
            self.snap_steps.append(it)
            self.snaps.append(W.detach().clone())
        if it % self.every and it != self.last:
            return
        with torch.no_grad():
            nw = torch.linalg.norm(W, dim=(-2, -1))
            self.steps.append(it)
            self.loss.append(loss.detach().clone())
            self.norm.append(nw)
            self.max_prob.append(torch.softmax(attention_logits(data, W), -1).amax(-1).mean(-1))
            safe = torch.where(nw > 0, nw, torch.ones_like(nw))
            for name, ref in self.refs.items():
                self.corr[name].append(torch.where(nw > 0, (W * ref).sum((-2, -1)) / safe, torch.zeros_like(nw)))

    def result(self, W: torch.Tensor, param: str, params: list[torch.Tensor]) -> GDBatch:
        return GDBatch(
            W=W,
            param=param,
            steps=torch.tensor(self.steps),
            loss=torch.stack(self.loss, 1),
            norm=torch.stack(self.norm, 1),
            max_prob=torch.stack(self.max_prob, 1),
            correlation={k: torch.stack(v, 1) for k, v in self.corr.items()},
            snapshot_steps=torch.tensor(self.snap_steps) if self.snaps else None,
            snapshots=torch.stack(self.snaps, 1) if self.snaps else None,
            K=params[0].detach().clone() if param == "KQ" else None,
            Q=params[1].detach().clone() if param == "KQ" else None,
        )


def train_attention_batch(
    data: AttentionData,
    *,
    param: str = "W",
    m: int | None = None,
    steps: int = 1000,
    lr: float = 0.1,
    normalized: bool = True,
    normalize: str = "separate",
    init=None,
    init_scale: float = 0.1,
    references: dict[str, torch.Tensor] | None = None,
    record_every: int = 1,
    snapshot_every: int | None = None,
    head: Callable | None = None,
    seed: int = 0,
    eps: float = EPS,
    kq_penalty: float = EPS,
    progress: bool = False,
) -> GDBatch:
    """GD on ``R`` runs at once (``data`` with a leading run dimension, e.g. from :func:`stack_data`).

    ``param="W"`` trains ``W (d, d_z)``; ``param="KQ"`` trains ``W = K Qᵀ`` with ``K (d, m)``, ``Q (d_z, m)``.
    ``normalized``: steps ``θ ← θ − lr·∇/‖∇‖`` per run, ``normalize="separate"`` (K and Q each, the paper)
    or ``"joint"``. ``init``: ``"zero"`` (default: ``W = 0``; ``Q = 0``, ``K = init_scale·N(0, 1)``),
    ``"linear"`` (``nn.Linear``'s ``U(±1/√fan_in)``), a ``W`` or a ``(K, Q)`` pair (shared or per run).
    ``references``: name → matrix ``(d, d_z)`` or ``(R, d, d_z)``; the correlation of ``W_t`` with each is
    recorded every ``record_every`` steps. ``snapshot_every``: also keep ``W_t`` every that many steps.
    ``eps``: the normalized step is ``lr·∇/(‖∇‖ + eps)`` (the authors' code; the step shrinks once the gradient
    falls to machine precision), ``kq_penalty``: ``kq_penalty·(‖K‖² + ‖Q‖²)`` added to the loss for ``(K, Q)``
    (the authors keep ``K, Q`` bounded this way); both default to float64's machine epsilon, 0 turns them off.
    """
    _check_options(param, steps, lr, record_every, snapshot_every, normalize)
    data = _batched(data)
    R, d, dz = data.X.shape[0], data.X.shape[-1], data.z.shape[-1]
    m = d if m is None else check_pos_int(m, "m")
    params = _init_params(param, R, d, dz, m, init, init_scale, torch.Generator().manual_seed(seed))
    record = _Recorder(_references(references, R, d, dz), record_every, snapshot_every, steps)
    iterator = range(steps + 1)
    if progress:
        from ..._progress import tqdm

        iterator = tqdm(iterator, desc=f"GD ({param}, {R} run{'s' * (R > 1)})", leave=False)
    with torch_threads(1 if data.X.numel() <= _ONE_THREAD_NUMEL else None):  # tiny tensors: threads only contend
        for it in iterator:
            loss, grads, M = _loss_and_grads(data, params, head, kq_penalty)
            record(it, data, _build(params).detach(), loss)
            if it == steps:
                break
            with torch.no_grad():
                _step(params, grads, lr, normalized, normalize, M, eps)
    with torch.no_grad():
        W = _build(params).detach().clone()
    return record.result(W, param, params)


def train_attention(data: AttentionData, **kwargs) -> GDRun:
    """GD on one run (see :func:`train_attention_batch` for the options; the same code with ``R = 1``)."""
    if data.X.ndim != 3:
        raise ValueError(
            f"data: expected one run (X of shape (n, T, d)), got X of shape {tuple(data.X.shape)}; use train_attention_batch"
        )
    return train_attention_batch(data, **kwargs).run(0)
