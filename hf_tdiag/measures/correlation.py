"""Rank correlation between a generalization measure and the generalization gap.

Kendall's τ-b (with ties, = ``scipy.stats.kendalltau``), Jiang et al.'s τ (τ-a: a
tied pair counts 0) and their granulated Kendall coefficient Ψ (2020, "Fantastic
Generalization Measures and Where to Find Them", Eq. 1–3), as used by Hu, Zou &
Xu (2024) to ask whether sparse rate reduction predicts generalization.

Both are pure functions of numbers: a measure value, a gap and the
hyperparameters of each trained run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.stats

__all__ = ["kendall_tau", "jiang_tau", "granulated_kendall", "GranulatedKendall"]


def _as_vector(x, name: str) -> np.ndarray:
    try:
        arr = np.asarray(x.detach().cpu() if hasattr(x, "detach") else x, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name}: expected a 1-D sequence of real numbers, got {type(x).__name__} ({err})") from None
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of real numbers, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(
            f"{name}: contains NaN or inf values (at positions {np.flatnonzero(~np.isfinite(arr)).tolist()[:10]})"
        )
    return arr


def _paired(x, y) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``y`` as finite float vectors of the same length."""
    x, y = _as_vector(x, "x"), _as_vector(y, "y")
    if x.shape != y.shape:
        raise ValueError(f"x, y: expected the same length, got {x.shape[0]} and {y.shape[0]}")
    return x, y


def kendall_tau(x, y) -> float:
    """Kendall's τ-b: ``(n_c − n_d) / √((n₀ − n₁)(n₀ − n₂))`` over all pairs, ties in x (n₁) and y (n₂) excluded
    (computed by ``scipy.stats.kendalltau``)."""
    x, y = _paired(x, y)
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"x, y: expected at least 2 observations for a rank correlation, got {n}")
    if np.all(x == x[0]) or np.all(y == y[0]):
        which = "x" if np.all(x == x[0]) else "y"
        raise ValueError(f"{which}: all {n} values are equal; Kendall's tau is undefined for a constant sequence")
    return float(scipy.stats.kendalltau(x, y, variant="b").statistic)


def jiang_tau(x, y) -> float:
    """Jiang et al.'s τ (their Eq. 1, τ-a): ``Σ_{i≠j} sign(x_i − x_j)·sign(y_i − y_j) / (n(n − 1))``; a tied pair counts 0,
    fewer than two observations give 0."""
    x, y = _paired(x, y)
    n = x.shape[0]
    if n < 2:
        return 0.0
    sx = np.sign(x[:, None] - x[None, :])
    sy = np.sign(y[:, None] - y[None, :])
    return float(np.sum(sx * sy) / (n * (n - 1)))


@dataclass
class GranulatedKendall:
    """Result of :func:`granulated_kendall`.

    ``psi`` is Ψ, the mean of the per-axis coefficients ``per_axis`` (ψ_k) over all
    axes; ``groups`` is m_k, the number of groups per axis (every combination of the
    other axes' values, whether or not its runs exist); ``incomplete`` counts, per
    axis, the groups with fewer runs than the axis has values (a missing run); and
    ``missing_runs`` the grid points without a run.
    """

    psi: float
    per_axis: dict[str, float]
    groups: dict[str, int] = field(default_factory=dict)
    incomplete: dict[str, int] = field(default_factory=dict)
    missing_runs: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "psi": self.psi,
            "per_axis": dict(self.per_axis),
            "groups": dict(self.groups),
            "incomplete": dict(self.incomplete),
            "missing_runs": self.missing_runs,
        }


def _hparam_table(hparams, n: int) -> dict[str, list]:
    if isinstance(hparams, Mapping):
        table = {str(k): list(v) for k, v in hparams.items()}
        for k, v in table.items():
            if len(v) != n:
                raise ValueError(f"hparams: axis {k!r} has {len(v)} values, expected one per run ({n})")
    elif isinstance(hparams, Sequence) and not isinstance(hparams, (str, bytes)):
        if len(hparams) != n:
            raise ValueError(f"hparams: expected one mapping per run ({n}), got {len(hparams)}")
        if not all(isinstance(h, Mapping) for h in hparams):
            raise TypeError("hparams: expected a sequence of mappings (one dict of hyperparameters per run)")
        keys = sorted({str(k) for h in hparams for k in h})
        for i, h in enumerate(hparams):
            missing = [k for k in keys if k not in h]
            if missing:
                raise ValueError(f"hparams: run {i} lacks axes {missing}; every run must set every axis")
        table = {k: [h[k] for h in hparams] for k in keys}
    else:
        raise TypeError(
            f"hparams: expected a mapping axis -> values per run, or a sequence of per-run dicts, got {type(hparams).__name__}"
        )
    if not table:
        raise ValueError("hparams: expected at least one hyperparameter axis, got none")
    for k, values in table.items():
        for v in values:
            try:
                hash(v)
            except TypeError:
                raise TypeError(
                    f"hparams: values of axis {k!r} must be hashable (numbers, strings), got {type(v).__name__}"
                ) from None
    return table


def _axis_values(table: Mapping[str, list], axes_values) -> dict[str, list]:
    """Θ_k per axis: the given grid values (every run's value must be among them) or the values the runs have."""
    if axes_values is None:
        return {k: list(dict.fromkeys(v)) for k, v in table.items()}
    if not isinstance(axes_values, Mapping) or set(axes_values) != set(table):
        got = sorted(axes_values) if isinstance(axes_values, Mapping) else type(axes_values).__name__
        raise ValueError(f"axes_values: expected a mapping with exactly the axes {sorted(table)}, got {got}")
    out = {k: list(dict.fromkeys(axes_values[k])) for k in table}
    for k, values in table.items():
        unknown = sorted({repr(v) for v in values if v not in out[k]})
        if unknown:
            raise ValueError(f"axes_values: axis {k!r} lacks the run values {unknown}")
    return out


def granulated_kendall(measure, gap, hparams, axes_values=None) -> GranulatedKendall:
    """Ψ = (1/n) Σ_k ψ_k, ψ_k = (1/m_k) Σ_{θ₋k} τ(runs that share θ₋k), τ = :func:`jiang_tau`, exactly as Jiang et al.

    The groups of axis k are all m_k = Π_{j≠k} |Θ_j| combinations of the other axes'
    values (Θ_j from ``axes_values``, a mapping axis -> grid values, or else the values
    seen in the runs). A group whose measure or gap is constant, with one run or none,
    contributes τ = 0 but still counts in m_k, so missing runs pull ψ_k toward 0
    (reported as ``missing_runs`` and ``incomplete``). ``hparams`` is a mapping
    ``axis -> [value per run]`` or a sequence of per-run dicts.
    """
    m = _as_vector(measure, "measure")
    g = _as_vector(gap, "gap")
    if m.shape != g.shape:
        raise ValueError(f"measure, gap: expected the same length, got {m.shape[0]} and {g.shape[0]}")
    table = _hparam_table(hparams, m.shape[0])
    theta = _axis_values(table, axes_values)
    runs_at: dict[tuple, list[int]] = {}
    for i in range(m.shape[0]):
        runs_at.setdefault(tuple(table[a][i] for a in theta), []).append(i)
    per_axis, groups, incomplete = {}, {}, {}
    for _k, axis in enumerate(theta):
        others = [a for a in theta if a != axis]
        combos = list(itertools.product(*(theta[a] for a in others)))
        taus, short = [], 0
        for combo in combos:
            point = dict(zip(others, combo))
            idx = [i for v in theta[axis] for i in runs_at.get(tuple(point.get(a, v) for a in theta), [])]
            short += len({table[axis][i] for i in idx}) < len(theta[axis])
            taus.append(jiang_tau(m[idx], g[idx]) if idx else 0.0)
        per_axis[axis] = float(sum(taus) / len(combos))
        groups[axis] = len(combos)
        incomplete[axis] = short
    grid_size = math.prod(len(v) for v in theta.values())
    return GranulatedKendall(
        psi=float(sum(per_axis.values()) / len(per_axis)),
        per_axis=per_axis,
        groups=groups,
        incomplete=incomplete,
        missing_runs=grid_size - len(runs_at),
    )
