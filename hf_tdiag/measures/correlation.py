"""Rank correlation between a generalization measure and the generalization gap.

Kendall's τ-b (with ties) and the granulated Kendall coefficient Ψ of Jiang et
al. (2020, "Fantastic Generalization Measures and Where to Find Them"), as used
by Hu, Zou & Xu (2024) to ask whether sparse rate reduction predicts
generalization.

Both are pure functions of numbers: a measure value, a gap and the
hyperparameters of each trained run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import scipy.stats

__all__ = ["kendall_tau", "granulated_kendall", "GranulatedKendall"]


def _as_vector(x, name: str) -> np.ndarray:
    try:
        arr = np.asarray(x.detach().cpu() if hasattr(x, "detach") else x, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name}: expected a 1-D sequence of real numbers, got {type(x).__name__} ({err})") from None
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of real numbers, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: contains NaN or inf values (at positions {np.flatnonzero(~np.isfinite(arr)).tolist()[:10]})")
    return arr


def kendall_tau(x, y) -> float:
    """Kendall's τ-b: ``(n_c − n_d) / √((n₀ − n₁)(n₀ − n₂))`` over all pairs, ties in x (n₁) and y (n₂) excluded
    (computed by ``scipy.stats.kendalltau``)."""
    x = _as_vector(x, "x")
    y = _as_vector(y, "y")
    if x.shape != y.shape:
        raise ValueError(f"x, y: expected the same length, got {x.shape[0]} and {y.shape[0]}")
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"x, y: expected at least 2 observations for a rank correlation, got {n}")
    if np.all(x == x[0]) or np.all(y == y[0]):
        which = "x" if np.all(x == x[0]) else "y"
        raise ValueError(f"{which}: all {n} values are equal; Kendall's tau is undefined for a constant sequence")
    return float(scipy.stats.kendalltau(x, y, variant="b").statistic)


@dataclass
class GranulatedKendall:
    """Result of :func:`granulated_kendall`.

    ``psi`` is Ψ, the mean of the per-axis coefficients ``per_axis`` (ψ_k) over
    the axes where ψ_k is defined; ``groups`` counts, per axis, the groups of
    runs (same value on every other axis) that entered ψ_k, and ``skipped`` the
    groups left out because τ was undefined in them (fewer than two runs, or a
    constant measure or gap).
    """

    psi: float | None
    per_axis: dict[str, float | None]
    groups: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"psi": self.psi, "per_axis": dict(self.per_axis), "groups": dict(self.groups), "skipped": dict(self.skipped)}


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
                raise TypeError(f"hparams: values of axis {k!r} must be hashable (numbers, strings), got {type(v).__name__}") from None
    return table


def granulated_kendall(measure, gap, hparams) -> GranulatedKendall:
    """Ψ = (1/n) Σ_k ψ_k, ψ_k = (1/m_k) Σ_{θ₋k} τ(measure, gap | runs that share θ₋k and differ only in axis k).

    ``hparams`` is either a mapping ``axis -> [value per run]`` or a sequence of
    per-run dicts. Groups where τ is undefined (one run, or a constant measure or
    gap) are skipped and counted in ``skipped``; an axis with no usable group has
    ψ_k = None and is left out of Ψ.
    """
    m = _as_vector(measure, "measure")
    g = _as_vector(gap, "gap")
    if m.shape != g.shape:
        raise ValueError(f"measure, gap: expected the same length, got {m.shape[0]} and {g.shape[0]}")
    table = _hparam_table(hparams, m.shape[0])
    axes = list(table)
    per_axis: dict[str, float | None] = {}
    groups: dict[str, int] = {}
    skipped: dict[str, int] = {}
    for axis in axes:
        others = [a for a in axes if a != axis]
        buckets: dict[tuple, list[int]] = {}
        for i in range(m.shape[0]):
            key = tuple(table[a][i] for a in others)
            buckets.setdefault(key, []).append(i)
        taus = []
        n_skipped = 0
        for idx in buckets.values():
            if len(idx) < 2 or np.all(m[idx] == m[idx][0]) or np.all(g[idx] == g[idx][0]):
                n_skipped += 1
                continue
            taus.append(kendall_tau(m[idx], g[idx]))
        per_axis[axis] = float(np.mean(taus)) if taus else None
        groups[axis] = len(taus)
        skipped[axis] = n_skipped
    defined = [v for v in per_axis.values() if v is not None]
    psi = float(np.mean(defined)) if defined else None
    return GranulatedKendall(psi=psi, per_axis=per_axis, groups=groups, skipped=skipped)
