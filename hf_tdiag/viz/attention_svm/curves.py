"""Figures of the 1-layer experiments in the shape the Space and older recipes use (``Figure`` objects, no pyplot).

* :func:`plot_correlation_curves` — correlation of GD's direction with ``W_mm`` per iteration;
* :func:`plot_global_frequency` — share of runs converging globally / locally vs ``d``;
* :func:`plot_rank` — a value (e.g. rank) against ``x`` with one line per series;
* :func:`plot_gen_svm` — Gen-SVM prediction correlation and selected-set sizes per run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .. import new_figure
from ._common import as_array as _arr


def plot_correlation_curves(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str | None = None,
    threshold: float | None = 0.99,
) -> Figure:
    """One line per ``label: (iterations, correlations)``; optional dashed threshold line."""
    if not curves:
        raise ValueError("curves: expected at least one (iterations, correlations) pair")
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    for label, (steps, corr) in curves.items():
        ax.plot(_arr(steps), _arr(corr), label=label)
    if threshold is not None:
        ax.axhline(threshold, color="gray", ls="--", lw=0.8)
    ax.set_xlabel("iteration")
    ax.set_ylabel(r"corr$(W_t, W_{mm})$")
    ax.set_ylim(min(0.0, ax.get_ylim()[0]), 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "Directional convergence of GD to the Att-SVM solution")
    return fig


def plot_global_frequency(rows: Sequence[Mapping[str, Any]], *, x: str = "d", title: str | None = None) -> Figure:
    """Rows with ``x`` and ``global``/``local``/``undetermined`` shares (one line per ``param`` if present)."""
    if not rows:
        raise ValueError("rows: expected at least one row")
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    groups: dict[str, list[Mapping]] = {}
    for r in rows:
        groups.setdefault(str(r.get("param", "")), []).append(r)
    styles = {"global": "-", "local": "--", "undetermined": ":"}
    for name, rs in groups.items():
        rs = sorted(rs, key=lambda r: r[x])
        xs = [r[x] for r in rs]
        for kind, ls in styles.items():
            if kind in rs[0]:
                ax.plot(xs, [r[kind] for r in rs], ls=ls, marker="o", label=f"{kind}" + (f" ({name})" if name else ""))
    ax.set_xlabel(x)
    ax.set_ylabel("share of runs")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "Global vs local convergence of GD")
    return fig


def plot_rank(
    rows: Sequence[Mapping[str, Any]], *, x: str = "n", series: str = "m", value: str = "rank", title: str | None = None
) -> Figure:
    """``value`` against ``x``, one line per ``series`` value (e.g. rank of the KQ solution vs n for each m)."""
    if not rows:
        raise ValueError("rows: expected at least one row")
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    groups: dict[Any, list[Mapping]] = {}
    for r in rows:
        groups.setdefault(r.get(series), []).append(r)
    for key, rs in sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0])):
        rs = sorted(rs, key=lambda r: r[x])
        ax.plot([r[x] for r in rs], [r[value] for r in rs], marker="o", label=f"{series}={key}")
    ax.set_xlabel(x)
    ax.set_ylabel(value)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or f"{value} vs {x}")
    return fig


def plot_gen_svm(rows: Sequence[Mapping[str, Any]], *, title: str | None = None) -> Figure:
    """Per run: Gen-SVM correlation with GD (bars) and mean selected-set size (dots, right axis)."""
    if not rows:
        raise ValueError("rows: expected at least one row")
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    idx = np.arange(len(rows))
    ax.bar(
        idx, [r["correlation"] for r in rows], color="tab:blue", alpha=0.7, label=r"corr$(W_{GD}, W_{fin}+R\,W_{dir})$"
    )
    ax.bar(
        idx,
        [r.get("direction_correlation", np.nan) for r in rows],
        width=0.4,
        color="tab:orange",
        alpha=0.8,
        label=r"corr$(W_{GD}-W_{fin}, W_{dir})$",
    )
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("run")
    ax.set_ylabel("correlation")
    ax2 = ax.twinx()
    ax2.plot(idx, [r["mean_selected"] for r in rows], "ko", label="mean |O_i|")
    ax2.set_ylabel("mean selected tokens per input")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="lower right")
    ax.set_title(title or "Gen-SVM prediction of GD with a nonlinear head")
    return fig
