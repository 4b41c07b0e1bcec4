"""Figures for the attention-as-SVM experiments and the head diagnostic (``Figure`` objects, no pyplot state).

* :func:`plot_correlation_curves` — correlation of GD's direction with ``W_mm`` per iteration;
* :func:`plot_global_frequency` — share of runs converging globally / locally vs ``d``;
* :func:`plot_rank` — rank of ``W_mm`` / of GD's solution vs ``m`` and ``n``;
* :func:`plot_gen_svm` — Gen-SVM prediction correlation and selected-set sizes;
* :func:`plot_head_diagnostic` — a head's margins against the SVM margin, and its attention peakedness.

Save with :func:`hf_tdiag.viz.save_figure`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from . import new_figure


def _arr(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=float)


def plot_correlation_curves(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, title: str | None = None,
                            threshold: float | None = 0.99) -> Figure:
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


def plot_rank(rows: Sequence[Mapping[str, Any]], *, x: str = "n", series: str = "m", value: str = "rank",
              title: str | None = None) -> Figure:
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
    ax.bar(idx, [r["correlation"] for r in rows], color="tab:blue", alpha=0.7, label=r"corr$(W_{GD}, W_{fin}+R\,W_{dir})$")
    ax.bar(idx, [r.get("direction_correlation", np.nan) for r in rows], width=0.4, color="tab:orange", alpha=0.8,
           label=r"corr$(W_{GD}-W_{fin}, W_{dir})$")
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


def _hist_range(*arrays: np.ndarray) -> tuple[float, float] | None:
    """A histogram range covering the finite values, widened when they (nearly) coincide so the bins have width."""
    values = np.concatenate([a[np.isfinite(a)] for a in arrays]) if arrays else np.empty(0)
    if values.size == 0:
        return None
    lo, hi = float(values.min()), float(values.max())
    if hi - lo <= 1e-9 * max(1.0, abs(hi)):
        half = max(1e-3 * abs(hi), 1e-3)
        lo, hi = lo - half, hi + half
    return lo, hi


def plot_head_diagnostic(diag, *, title: str | None = None) -> Figure:
    """Histogram of the head's normalized margins (with the SVM margin marked) and of its max attention."""
    d = diag.to_dict() if hasattr(diag, "to_dict") else dict(diag)
    fig = new_figure(9.0, 3.8)
    ax1, ax2 = fig.subplots(1, 2)
    hm = _arr(d["head_margins"])
    sm = _arr(d.get("svm_margins", []))
    span = _hist_range(hm, sm)
    ax1.hist(hm[np.isfinite(hm)], bins=20, range=span, alpha=0.7, label="head (W_h/‖W_h‖)")
    if sm.size:
        ax1.hist(sm[np.isfinite(sm)], bins=20, range=span, alpha=0.5, label="SVM (W_mm/‖W_mm‖)")
    if d.get("svm_margin"):
        ax1.axvline(d["svm_margin"], color="k", ls="--", lw=1, label="SVM margin 1/‖W_mm‖")
    ax1.set_xlabel("smallest normalized logit gap per query")
    ax1.set_ylabel("queries")
    ax1.legend(fontsize=7)
    ax2.hist(_arr(d["max_probs"]), bins=20, range=(0, 1), color="tab:green", alpha=0.8)
    ax2.axvline(d["one_hot_threshold"], color="k", ls="--", lw=1)
    ax2.set_xlabel("largest attention probability")
    ax2.set_ylabel("queries")
    corr = d.get("correlation")
    fig.suptitle(
        title
        or f"layer {d['layer']} head {d['head']}: corr(W_h, W_mm) = {corr:.3f}, "
        f"margin ratio = {d['margin_ratio']:.3f}, one-hot = {d['one_hot_fraction']:.2f}",
        fontsize=9,
    )
    return fig
