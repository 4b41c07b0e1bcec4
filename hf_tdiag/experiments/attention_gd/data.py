"""Synthetic data of Tarzanagh et al. (2023), one run or a batch of runs (leading run dimension).

* :class:`AttentionData`: tokens ``X (…, n, T, d)``, queries ``z (…, n, d)``, head ``v (…, d)``, labels
  ``Y (…, n)``; token scores ``γ_it = Y_i vᵀx_it`` and optimal tokens ``argmax_t γ_it``;
* :func:`make_attention_data`: unit tokens / queries / head, labels ±1 (the paper's default setting);
* :func:`score_gap` / :func:`passes_gap_filter`: the paper's γ filter (Figs 2, 5, 6 keep only instances
  whose best token leads the runner-up by at least γ = 0.1 in every input);
* :func:`make_trajectory_data`: the two-input 2-D cross-attention data of Fig. 2 (authors' notebook);
* :func:`make_relu_head_data`: data and ``V`` of the nonlinear head ``1ᵀReLU(Vᵀu)`` (Fig. 9);
* :func:`make_orthonormal_data`: orthonormal tokens with planted scores (multi-token selection, Figs 10/13);
* :func:`make_planted_local_instance`: a hand-built locally-optimal (not optimal) selection;
* :func:`stack_data`: a batch of runs from single runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "AttentionData",
    "make_attention_data",
    "make_planted_local_instance",
    "make_trajectory_data",
    "make_relu_head_data",
    "make_orthonormal_data",
    "score_gap",
    "passes_gap_filter",
    "stack_data",
    "check_pos_int",
]


@dataclass
class AttentionData:
    """One synthetic data set of the paper's setting (float64), or a batch of them (leading run dimension)."""

    X: torch.Tensor  # (…, n, T, d) tokens
    z: torch.Tensor  # (…, n, d) queries
    v: torch.Tensor  # (…, d) head
    Y: torch.Tensor  # (…, n) labels ±1

    @property
    def scores(self) -> torch.Tensor:
        """Token scores ``γ_it = Y_i vᵀ x_it`` (…, n, T)."""
        return self.Y[..., :, None] * torch.einsum("...ntd,...d->...nt", self.X, self.v)

    @property
    def optimal(self) -> torch.Tensor:
        """Optimal token ``argmax_t γ_it`` of each input (…, n)."""
        return self.scores.argmax(-1)

    @property
    def num_runs(self) -> int | None:
        """Size of the leading run dimension (None for a single run)."""
        return self.X.shape[0] if self.X.ndim == 4 else None

    def run(self, r: int) -> AttentionData:
        """Run ``r`` of a batch as a single data set."""
        if self.X.ndim != 4:
            raise ValueError("run: this data set is a single run, not a batch")
        return AttentionData(X=self.X[r], z=self.z[r], v=self.v[r], Y=self.Y[r])


def check_pos_int(value, name: str, minimum: int = 1) -> int:
    """``value`` as an int ≥ ``minimum`` (bool rejected)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name}: expected an integer ≥ {minimum}, got {value!r}")
    return value


def _unit(t: torch.Tensor) -> torch.Tensor:
    return t / torch.linalg.norm(t, dim=-1, keepdim=True)


def stack_data(datas) -> AttentionData:
    """A batch ``(R, …)`` of single runs with equal shapes."""
    datas = list(datas)
    if not datas:
        raise ValueError("datas: expected at least one data set")
    shapes = {tuple(d.X.shape) for d in datas}
    if len(shapes) != 1 or datas[0].X.ndim != 3:
        raise ValueError(f"datas: expected single runs of one shape (n, T, d), got shapes {sorted(shapes)}")
    return AttentionData(*(torch.stack([getattr(d, f) for d in datas]) for f in ("X", "z", "v", "Y")))


def score_gap(data: AttentionData) -> torch.Tensor:
    """Smallest lead ``min_i (γ_{i,(1)} − γ_{i,(2)})`` of the best token over the runner-up (per run)."""
    top2 = data.scores.topk(2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]).amin(-1)


def passes_gap_filter(data: AttentionData, gamma: float = 0.1) -> torch.Tensor | bool:
    """The paper's γ filter: keep an instance only if every input's best token leads by at least ``gamma``."""
    if not (isinstance(gamma, (int, float)) and not isinstance(gamma, bool) and gamma >= 0):
        raise ValueError(f"gamma: expected a number ≥ 0, got {gamma!r}")
    keep = score_gap(data) >= gamma
    return bool(keep) if keep.ndim == 0 else keep


def make_attention_data(
    n: int, T: int, d: int, *, seed: int = 0, min_gap: float = 0.0, max_tries: int = 1000
) -> AttentionData:
    """Random unit tokens/queries/head and ±1 labels; inputs are redrawn until their best token leads by ``min_gap``."""
    check_pos_int(n, "n")
    check_pos_int(T, "T", 2)
    check_pos_int(d, "d")
    if not (isinstance(min_gap, (int, float)) and 0 <= min_gap < 2):
        raise ValueError(f"min_gap: expected a number in [0, 2), got {min_gap!r}")
    g = torch.Generator().manual_seed(seed)
    v = _unit(torch.randn(d, generator=g, dtype=torch.float64))
    X = _unit(torch.randn(n, T, d, generator=g, dtype=torch.float64))
    z = _unit(torch.randn(n, d, generator=g, dtype=torch.float64))
    Y = torch.randint(0, 2, (n,), generator=g).to(torch.float64) * 2 - 1
    for _ in range(max_tries):
        top2 = (Y[:, None] * (X @ v)).topk(2, dim=1).values
        bad = (top2[:, 0] - top2[:, 1]) < min_gap
        if not bool(bad.any()):
            break
        k = int(bad.sum())
        X[bad] = _unit(torch.randn(k, T, d, generator=g, dtype=torch.float64))
    else:
        raise ValueError(f"min_gap: could not draw inputs with a score gap ≥ {min_gap} in {max_tries} tries; lower it")
    return AttentionData(X=X, z=z, v=v, Y=Y)


def make_trajectory_data(*, seed: int = 1, T: int = 3, noise: float = 0.3) -> AttentionData:
    """Fig. 2's data (n = d = 2): tokens ``0.3·N(0, I)`` around ``(−1, 0)`` (input 1) and ``(1, 0)`` (input 2),
    a unit head ``v``, unit queries, ``Y = 1`` (drawn in float32 in the authors' order, then float64)."""
    check_pos_int(T, "T", 2)
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(2, generator=g)
    v = v / v.norm()
    X = noise * torch.randn(2, T, 2, generator=g)
    X[0] += torch.tensor([-1.0, 0.0])
    X[1] += torch.tensor([1.0, 0.0])
    z = _unit(torch.randn(2, 2, generator=g))
    return AttentionData(X=X.double(), z=z.double(), v=v.double(), Y=torch.ones(2, dtype=torch.float64))


def make_relu_head_data(n: int, T: int, d: int, *, seed: int = 0) -> tuple[AttentionData, torch.Tensor]:
    """Data of the nonlinear-head experiment (Fig. 9) and its ``V (d, d)`` (``‖V‖_F = 1``): unit tokens and
    queries, labels ±1; drawn in float32 in the authors' order (V, X, Y, z), then float64. ``v`` is ``1/√d``."""
    for value, name in ((n, "n"), (T, "T"), (d, "d")):
        check_pos_int(value, name)
    g = torch.Generator().manual_seed(seed)
    V = torch.randn(d, d, generator=g)
    V = V / V.norm()
    X = _unit(torch.randn(n, T, d, generator=g))
    Y = 2.0 * (torch.randn(n, generator=g) > 0).float() - 1.0
    z = _unit(torch.randn(n, d, generator=g))
    v = torch.full((d,), d**-0.5)
    return AttentionData(X=X.double(), z=z.double(), v=v.double(), Y=Y.double()), V.double()


def make_orthonormal_data(
    n: int, T: int, d: int, scores: torch.Tensor | None = None, *, seed: int = 0
) -> AttentionData:
    """Orthonormal tokens per input (``X_i X_iᵀ = I_T``), unit queries, ``Y = 1`` (multi-token selection, §6.1).

    ``scores=None``: each input's tokens are an independent random orthonormal set and ``v`` is a random unit
    vector (the authors' λ setting). ``scores (n, T)``: the inputs occupy mutually orthogonal blocks
    (needs ``d ≥ n·T``) and ``v = Σ_it γ_it x_it`` realises ``γ_it = vᵀx_it`` exactly (planted scores, τ setting).
    """
    check_pos_int(n, "n")
    check_pos_int(T, "T", 2)
    if d < T:
        raise ValueError(f"d: T = {T} orthonormal tokens need d ≥ T, got {d}")
    g = torch.Generator().manual_seed(seed)
    if scores is None:
        X = torch.linalg.qr(torch.randn(n, d, T, generator=g, dtype=torch.float64)).Q.transpose(1, 2).contiguous()
        v = _unit(torch.randn(d, generator=g, dtype=torch.float64))
    else:
        if tuple(scores.shape) != (n, T):
            raise ValueError(f"scores: expected shape {(n, T)}, got {tuple(scores.shape)}")
        if d < n * T:
            raise ValueError(
                f"d: planted scores for n·T = {n * T} mutually orthogonal tokens need d ≥ {n * T}, got {d}"
            )
        Qm = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64)).Q
        X = Qm[:, : n * T].T.reshape(n, T, d).contiguous()
        v = torch.einsum("nt,ntd->d", scores.to(torch.float64), X)
    z = _unit(torch.randn(n, d, generator=g, dtype=torch.float64))
    return AttentionData(X=X, z=z, v=v, Y=torch.ones(n, dtype=torch.float64))


def make_planted_local_instance(
    n: int = 3, d: int = 6, *, seed: int = 0, jitter: float = 0.02
) -> tuple[AttentionData, torch.Tensor]:
    """Inputs with three tokens where token 1 is locally optimal but not optimal; returns (data, local selection).

    In a random plane ``(e1, e2)``: ``x_0 = −0.6e1 + 0.8e2`` (best score), ``x_1 = e1``,
    ``x_2 = e2`` (worst score) and ``v ∝ −e1 − 1.5e2``, ``Y = +1``, so ``γ_0 > γ_1 > γ_2``.
    Separating ``x_1`` from ``x_2`` with margin 1 already separates it from ``x_0``
    with margin 1.2, so the only support token of selection ``x_1`` is ``x_2``,
    which scores lower: the selection is locally optimal. Queries are orthonormal
    (and orthogonal to the plane), so the inputs do not interact; tokens get a
    small random perturbation (renormalized) per input.
    """
    check_pos_int(n, "n")
    if d < n + 2:
        raise ValueError(f"d: the planted instance needs d ≥ n + 2 = {n + 2}, got {d}")
    g = torch.Generator().manual_seed(seed)
    Qm, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    e1, e2 = Qm[:, 0], Qm[:, 1]
    base = torch.stack([-0.6 * e1 + 0.8 * e2, e1, e2])  # (3, d)
    X = base.expand(n, 3, d).clone()
    X = _unit(X + jitter * torch.randn(n, 3, d, generator=g, dtype=torch.float64))
    z = Qm[:, 2 : 2 + n].T.contiguous()
    v = _unit(-e1 - 1.5 * e2)
    Y = torch.ones(n, dtype=torch.float64)
    data = AttentionData(X=X, z=z, v=v, Y=Y)
    return data, torch.ones(n, dtype=torch.long)
