"""Figures for the Schatten / Edelman bound proxies (matplotlib ``Figure`` objects, no pyplot state).

Inputs are :class:`hf_tdiag.diagnostics.schatten_report.SchattenReport` objects, or for the
scaling plots any rows with ``num_layers``, ``hidden_size``, ``schatten_bound`` and ``edelman_bound``
(e.g. ``report.summary()``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from . import new_subplots

TYPE_LABELS = {"qk": "QK (per head)", "v": "Ṽ (per head)", "m_in": "M_in", "ista": "ISTA D (as M_in)", "m_out": "M_out",
               "ista_d": "CRATE-α D (as M_in)", "ista_d1": "CRATE-α D₁ᵀ (as M_out)"}  # fmt: skip
PROXY_STYLE = {
    "schatten_bound": ("B_Schatten (spectrum-adaptive)", "-", "o"),
    "edelman_bound": ("B_Edelman", "--", "s"),
}


AXIS_LABELS = {"hidden_size": ("hidden size N", "N"), "num_layers": ("depth L", "L")}
# the paper normalises every curve at its smallest miniature: N = 128 (vs width) and L = 2 (vs depth)
PAPER_NORMALIZE_AT = {"hidden_size": 128, "num_layers": 2}
NORM_LABELS = {
    "norm_2_1": "(2,1) norm ‖W‖_{2,1}",
    "norm_1_1": "(1,1) norm ‖W‖_{1,1}",
    "spectral_norm": "spectral norm ‖W‖₂",
}


def model_label(name: str) -> str:
    """A model name fit for a title: a Hub id as is; a local folder as its last two path components (no local path)."""
    name = str(name).rstrip("/\\")
    if os.path.isabs(name) or os.path.exists(name) or name.startswith("."):
        parts = [p for p in name.replace("\\", "/").split("/") if p and p != "."]
        return "/".join(parts[-2:]) if parts else name
    return name


def _title_name(report) -> str:
    """The model once: its name, then its type only when the name does not already say it, then its sizes."""
    name = model_label(report.model)
    kind = "" if str(report.model_type).lower() in name.lower() else f"{report.model_type}, "
    return f"{name} ({kind}L={report.num_layers}, N={report.hidden_size}, H={report.num_heads})"


def _rows(rows: Iterable[Mapping[str, Any] | Any]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        r = r.summary() if hasattr(r, "summary") else dict(r)
        for key in ("num_layers", "hidden_size", "schatten_bound", "edelman_bound"):
            if key not in r:
                raise ValueError(f"rows: each row needs {key!r}; got keys {sorted(r)}")
        out.append(r)
    if not out:
        raise ValueError("rows: expected at least one model row, got none")
    return out


def scaling_curves(rows, x_key: str, normalize_at: Mapping[str, int] | None = None) -> dict[tuple, dict[str, Any]]:
    """Per-curve normalised proxies, as the paper plots them: ``(group, proxy) -> {"x", "y", "raw", "at"}``.

    A curve is one proxy (``"schatten_bound"`` or ``"edelman_bound"``) against ``x_key`` (``"hidden_size"`` or ``"num_layers"``)
    at one value of the other axis (``group``); it is divided by its own value at ``normalize_at[x_key]``
    (default N = 128, L = 2, the paper's choice), or at its smallest x when that value is not on the curve.
    """
    if x_key not in AXIS_LABELS:
        raise ValueError(f"x_key: expected 'hidden_size' or 'num_layers', got {x_key!r}")
    rows = _rows(rows)
    group_key = "num_layers" if x_key == "hidden_size" else "hidden_size"
    at = dict(PAPER_NORMALIZE_AT, **(normalize_at or {}))[x_key]
    curves = {}
    for g in sorted({r[group_key] for r in rows}):
        sel = sorted((r for r in rows if r[group_key] == g), key=lambda r: r[x_key])
        xs = [r[x_key] for r in sel]
        base_i = xs.index(at) if at in xs else 0
        for key in PROXY_STYLE:
            raw = np.array([float(r[key]) for r in sel])
            curves[(g, key)] = {"x": xs, "y": raw / raw[base_i], "raw": raw, "at": xs[base_i]}
    return curves


def _scaling(rows, x_key: str, title: str, normalize_at=None, ax=None) -> Figure:
    curves = scaling_curves(rows, x_key, normalize_at)
    group_key = "num_layers" if x_key == "hidden_size" else "hidden_size"
    if ax is None:
        fig = Figure(figsize=(6.4, 4.4), layout="constrained")
        ax = fig.add_subplot()
    groups = sorted({g for g, _ in curves})
    ats = sorted({c["at"] for c in curves.values()})
    for i, g in enumerate(groups):
        for key, (label, ls, marker) in PROXY_STYLE.items():
            c = curves[(g, key)]
            ax.plot(
                c["x"],
                c["y"],
                ls=ls,
                marker=marker,
                color=f"C{i % 10}",
                label=f"{label}, {AXIS_LABELS[group_key][1]}={g}",
            )
    ax.set_yscale("log")
    ax.set_xlabel(AXIS_LABELS[x_key][0])
    sym = AXIS_LABELS[x_key][1]
    at_text = f"{sym}={ats[0]}" if len(ats) == 1 else f"the curve's smallest {sym}"
    ax.set_ylabel(f"proxy / same curve at {at_text}")
    ax.set_title(title, fontsize=10)
    ax.set_xticks(sorted({x for c in curves.values() for x in c["x"]}))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    return ax.figure


def plot_proxies_vs_width(
    rows, normalize_at: Mapping[str, int] | None = None, title: str | None = None, ax=None
) -> Figure:
    """Both proxies vs N, one line pair per depth L, each curve divided by its value at N = 128 (log scale)."""
    return _scaling(rows, "hidden_size", title or "Bound proxies vs width (fixed depth)", normalize_at, ax)


def plot_proxies_vs_depth(
    rows, normalize_at: Mapping[str, int] | None = None, title: str | None = None, ax=None
) -> Figure:
    """Both proxies vs L, one line pair per width N, each curve divided by its value at L = 2 (log scale)."""
    return _scaling(rows, "num_layers", title or "Bound proxies vs depth (fixed width)", normalize_at, ax)


def plot_init_vs_trained(rows_init, rows_trained, x_key: str, normalize_at: Mapping[str, int] | None = None) -> Figure:
    """Both proxies vs ``x_key`` at initialisation and after training, side by side, normalised per curve (log scale).

    The y-limits are shared, so the growth of each proxy can be compared between the panels.
    """
    fig = Figure(figsize=(11.0, 4.2), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    what = "width (fixed depth)" if x_key == "hidden_size" else "depth (fixed width)"
    for ax, rows, stage in zip(axes, (rows_init, rows_trained), ("at initialisation", "after training")):
        _scaling(rows, x_key, f"Bound proxies vs {what}, {stage}", normalize_at, ax)
    return fig


def p_opt_summary(rows, types: Iterable[str] = ("qk", "v", "m_in", "m_out")) -> dict[str, dict[str, float]]:
    """Mean over grid rows of ``mean_p_opt_<type>`` and ``frac_p0_<type>`` (rows from :func:`hf_tdiag.study.schatten_grid.grid_rows`)."""
    rows = list(rows)
    return {
        t: {
            "mean_p_opt": float(np.mean([r[f"mean_p_opt_{t}"] for r in rows])),
            "frac_p0": float(np.mean([r[f"frac_p0_{t}"] for r in rows])),
        }
        for t in types
    }


def plot_p_opt_init_vs_trained(rows_init, rows_trained) -> Figure:
    """Per matrix type: the mean optimal p against depth, one line per width, at initialisation (dashed) and trained."""
    rows_init, rows_trained = list(rows_init), list(rows_trained)
    types = [t for t in ("qk", "v", "m_in", "m_out") if f"mean_p_opt_{t}" in rows_init[0]]
    widths = sorted({r["hidden_size"] for r in rows_init})
    fig = Figure(figsize=(3.0 * len(types), 3.4), layout="constrained")
    axes = fig.subplots(1, len(types), sharey=True)
    for ax, t in zip(axes, types):
        for i, n in enumerate(widths):
            for rows, ls, stage in ((rows_init, "--", "init"), (rows_trained, "-", "trained")):
                sel = sorted((r for r in rows if r["hidden_size"] == n), key=lambda r: r["num_layers"])
                ax.plot(
                    [r["num_layers"] for r in sel],
                    [r[f"mean_p_opt_{t}"] for r in sel],
                    ls=ls,
                    marker="o",
                    ms=3,
                    color=f"C{i}",
                    label=f"N={n}, {stage}",
                )
        ax.set_title(TYPE_LABELS[t], fontsize=9)
        ax.set_xlabel("depth L")
        ax.set_ylim(-0.05, 2.05)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("mean optimal p")
    axes[0].legend(fontsize=6)
    fig.suptitle(
        "Optimal Schatten index per matrix type: at initialisation (dashed) and after training (solid)", fontsize=9
    )
    return fig


def plot_spectra_init_vs_trained(report_init, report_trained) -> Figure:
    """σᵢ/σ₁ of every matrix of one model at initialisation (grey) and after training (coloured by layer)."""
    return _spectral_decay_figure(
        report_trained,
        report_init,
        ylabel=r"$\sigma_i\,/\,\sigma_1$  (grey: at initialisation)",
        title=f"Spectral decay at initialisation and after training — {_title_name(report_trained)}",
    )


def _types(report) -> list[str]:
    return [t for t in TYPE_LABELS if any(m.type == t for m in report.matrices)]


def _spectral_decay_figure(report, background=None, *, ylabel: str, title: str) -> Figure:
    """σᵢ/σ₁ against i per matrix type (log scale), coloured by layer; ``background``'s matrices in grey behind."""
    types = _types(report)
    fig = Figure(figsize=(3.2 * len(types), 3.4), layout="constrained")
    axes = fig.subplots(1, len(types), squeeze=False)[0]
    cmap = _layer_colors(report.num_layers)
    width = 0.7 if background is None else 0.8
    for ax, t in zip(axes, types):
        layers = [(background, lambda m: "0.6", 0.6, 0.5)] if background is not None else []
        for rep, color, lw, alpha in layers + [(report, lambda m: cmap[m.layer - 1], width, width)]:
            for m in rep.matrices:
                if m.type == t and m.rank > 0:
                    s = m.singular_values
                    ax.plot(np.arange(1, len(s) + 1), s / s[0], color=color(m), lw=lw, alpha=alpha)
        ax.set_yscale("log")
        ax.set_xlabel("index i")
        ax.set_title(TYPE_LABELS[t], fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel(ylabel)
    _layer_colorbar(fig, axes, report.num_layers)
    fig.suptitle(title, fontsize=9)
    return fig


def plot_spectral_decay(report) -> Figure:
    """σᵢ/σ₁ against i for every matrix, one panel per matrix type, coloured by layer (log scale)."""
    return _spectral_decay_figure(
        report, ylabel=r"$\sigma_i\,/\,\sigma_1$", title=f"Spectral decay — {_title_name(report)}"
    )


def plot_optimal_p(report) -> Figure:
    """The optimal Schatten index p per matrix type and layer (heads as dots, mean as line)."""
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    types = _types(report)
    for i, t in enumerate(types):
        recs = [m for m in report.matrices if m.type == t]
        layers = np.array([m.layer for m in recs])
        ps = np.array([m.p_opt for m in recs])
        offset = (i - (len(types) - 1) / 2) * 0.08
        ax.scatter(layers + offset, ps, s=10, color=f"C{i}", alpha=0.5)
        mean = [ps[layers == layer].mean() for layer in range(1, report.num_layers + 1)]
        ax.plot(np.arange(1, report.num_layers + 1) + offset, mean, color=f"C{i}", marker="o", label=TYPE_LABELS[t])
    ax.set_xlabel("layer ℓ (block 1..L)")
    ax.set_ylabel("optimal p")
    ax.set_ylim(-0.05, 2.05)
    ax.set_xticks(range(1, report.num_layers + 1))
    ax.set_title(f"Optimal Schatten index per matrix — {_title_name(report)}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def plot_contribution_vs_p(report) -> Figure:
    """c(W, p) on the p grid, mean over heads per layer, one panel per type; the minimum is marked (log scale)."""
    types = _types(report)
    fig = Figure(figsize=(3.2 * len(types), 3.4), layout="constrained")
    axes = fig.subplots(1, len(types), squeeze=False)[0]
    cmap = _layer_colors(report.num_layers)
    grid = np.asarray(report.p_grid)
    for ax, t in zip(axes, types):
        for layer in range(report.num_layers):
            curves = np.stack([m.contributions for m in report.matrices if m.type == t and m.layer == layer + 1])
            curve = curves.mean(axis=0)
            if not np.any(curve > 0):
                continue
            ax.plot(grid, curve, color=cmap[layer], lw=1.0)
            k = int(np.argmin(curve))
            ax.plot(grid[k], curve[k], marker="o", color=cmap[layer], ms=3)
        ax.set_yscale("log")
        ax.set_xlabel("p")
        ax.set_title(TYPE_LABELS[t], fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("c(W, p)  (mean over heads)")
    _layer_colorbar(fig, axes, report.num_layers)
    fig.suptitle(f"Contribution vs Schatten index — {_title_name(report)}", fontsize=9)
    return fig


def _layer_colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(i / max(n - 1, 1)) for i in range(n)]


def _layer_colorbar(fig: Figure, axes, num_layers: int) -> None:
    """A colour bar mapping the line colours of :func:`_layer_colors` (index ℓ − 1 of block ℓ) to blocks 1 … L."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm

    bounds = np.arange(num_layers + 1) - 0.5
    cmap = colormaps["viridis"].resampled(max(num_layers, 2))
    sm = ScalarMappable(norm=BoundaryNorm(bounds, cmap.N), cmap=cmap)
    bar = fig.colorbar(sm, ax=list(axes), label="layer ℓ (block 1..L)", pad=0.01, aspect=30)
    ticks = range(0, num_layers, max(1, num_layers // 8))
    bar.set_ticks(ticks, labels=[str(i + 1) for i in ticks])


def optimal_p_counts(report) -> dict[str, np.ndarray]:
    """How many matrices of each type have each p of the grid as their optimum: type -> counts aligned with ``p_grid``."""
    grid = np.asarray(report.p_grid)
    out = {}
    for t in _types(report):
        ps = np.array([m.p_opt for m in report.matrices if m.type == t])
        out[t] = np.array([(np.isclose(ps, p, rtol=0, atol=1e-12)).sum() for p in grid])
    return out


def plot_optimal_p_histogram(report) -> Figure:
    """Histogram of the optimal p per matrix type (grouped bars on the p grid); says so when every p_opt is 0."""
    counts = optimal_p_counts(report)
    grid = np.asarray(report.p_grid)
    fig = Figure(figsize=(6.4, 3.8), layout="constrained")
    ax = fig.add_subplot()
    step = grid[1] - grid[0] if len(grid) > 1 else 1.0
    width = 0.8 * step / max(len(counts), 1)
    for i, (t, c) in enumerate(counts.items()):
        offset = (i - (len(counts) - 1) / 2) * width
        ax.bar(grid + offset, c, width=width, color=f"C{i}", label=f"{TYPE_LABELS[t]} ({int(c.sum())})")
    ax.set_xlabel("optimal Schatten index p (grid {0, 1/m, …, 2})")
    ax.set_ylabel("number of matrices")
    ax.set_xlim(-step, 2 + step)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    title = f"Optimal p per matrix type — {_title_name(report)}"
    if getattr(report, "degenerate", False):
        title += "\np_opt = 0 for every matrix: B_Schatten depends only on shapes and ranks"
    ax.set_title(title, fontsize=9)
    return fig


def norm_scaling_rows(reports, num_layers: int | None = 2) -> list[dict[str, Any]]:
    """One row per matrix of every report with ``num_layers`` layers (all when None): type, layer, head, N, norms."""
    rows = []
    for r in reports:
        if num_layers is not None and r.num_layers != num_layers:
            continue
        for m in r.matrices:
            rows.append(
                {
                    "model": r.model,
                    "hidden_size": r.hidden_size,
                    "num_layers": r.num_layers,
                    "type": m.type,
                    "layer": m.layer,
                    "head": m.head,
                    **{k: getattr(m, k) for k in NORM_LABELS},
                }
            )
    if not rows:
        raise ValueError(f"reports: none has num_layers = {num_layers}; got {sorted({r.num_layers for r in reports})}")
    return rows


def plot_norm_scaling(reports, num_layers: int | None = 2) -> Figure:
    """(2,1), (1,1) and spectral norms of every matrix vs N at fixed depth (the paper's norm-scaling figure), log-log.

    Dots: single matrices (heads and layers); lines: the mean per matrix type.
    """
    rows = norm_scaling_rows(reports, num_layers)
    types = [t for t in TYPE_LABELS if any(r["type"] == t for r in rows)]
    widths = sorted({r["hidden_size"] for r in rows})
    fig = Figure(figsize=(12.0, 3.8), layout="constrained")
    axes = fig.subplots(1, len(NORM_LABELS))
    for ax, (key, label) in zip(axes, NORM_LABELS.items()):
        for i, t in enumerate(types):
            sel = [r for r in rows if r["type"] == t]
            ax.scatter([r["hidden_size"] for r in sel], [r[key] for r in sel], s=6, color=f"C{i}", alpha=0.35)
            means = [np.mean([r[key] for r in sel if r["hidden_size"] == n]) for n in widths]
            ax.plot(widths, means, marker="o", color=f"C{i}", label=TYPE_LABELS[t])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(widths, [str(n) for n in widths])
        ax.set_xlabel("hidden size N")
        ax.set_title(label, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    depth = f"L = {num_layers}" if num_layers is not None else "all depths"
    fig.suptitle(f"Norms of the bound's matrices vs width ({depth}; dots: matrices, lines: mean per type)", fontsize=9)
    return fig


def save_report_figures(report, out_dir: str, prefix: str = "") -> dict[str, str]:
    """Write the four per-model figures as PNG into ``out_dir``; returns name -> path."""
    from . import save_figure

    paths = {}
    for name, fn in (
        ("spectral_decay", plot_spectral_decay),
        ("optimal_p", plot_optimal_p),
        ("optimal_p_histogram", plot_optimal_p_histogram),
        ("contribution_vs_p", plot_contribution_vs_p),
    ):
        path = os.path.join(out_dir, f"{prefix}{name}.png")
        paths[name] = save_figure(fn(report), path)
    return paths


def optimal_p_heatmap(report) -> Figure:
    """Heatmap of the optimal Schatten index p per matrix: layers (rows) × matrix type/head (columns).

    ``report`` is a :class:`hf_tdiag.diagnostics.schatten_report.SchattenReport`; each cell is one record's ``p_opt``.
    """
    order = {"qk": 0, "v": 1, "m_in": 2, "ista": 2, "ista_d": 2, "m_out": 3, "ista_d1": 3}
    columns = sorted(
        {(m.type, -1 if m.head is None else m.head) for m in report.matrices}, key=lambda c: (order.get(c[0], 9), c[1])
    )
    if not columns:
        raise ValueError("report: has no matrices")
    col_index = {c: j for j, c in enumerate(columns)}
    grid = np.full((report.num_layers, len(columns)), np.nan)
    for m in report.matrices:
        grid[m.layer - 1, col_index[(m.type, -1 if m.head is None else m.head)]] = m.p_opt
    width = min(16.0, 2.5 + 0.32 * len(columns))
    fig, axes = new_subplots(1, 1, (width, 1.8 + 0.35 * report.num_layers), layout="constrained")
    ax = axes[0][0]
    im = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=2.0, aspect="auto", interpolation="nearest")
    labels = [t if h < 0 else f"{t} h{h}" for t, h in columns]
    ax.set_xticks(range(len(columns)), labels, rotation=90, fontsize=6 if len(columns) > 24 else 8)
    ax.set_yticks(range(report.num_layers), [str(i) for i in range(1, report.num_layers + 1)], fontsize=8)
    ax.set_ylabel("layer (block 1..L)")
    if grid.size <= 400:
        for (i, j), v in np.ndenumerate(grid):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=6, color="w" if v < 1.2 else "k")
    fig.colorbar(im, ax=ax, label="optimal p")
    ax.set_title("Optimal Schatten index p per matrix", fontsize=10)
    return fig


__all__ = [
    "optimal_p_heatmap",
    "model_label",
    "norm_scaling_rows",
    "optimal_p_counts",
    "p_opt_summary",
    "plot_contribution_vs_p",
    "plot_init_vs_trained",
    "plot_norm_scaling",
    "plot_p_opt_init_vs_trained",
    "plot_spectra_init_vs_trained",
    "plot_optimal_p",
    "plot_optimal_p_histogram",
    "plot_proxies_vs_depth",
    "plot_proxies_vs_width",
    "plot_spectral_decay",
    "save_report_figures",
    "scaling_curves",
]
