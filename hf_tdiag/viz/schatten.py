"""Figures for the Schatten / Edelman bound proxies (matplotlib ``Figure`` objects, no pyplot state).

Inputs are :class:`hf_tdiag.probes.spectrum.SpectrumBoundReport` objects, or for the
scaling plots any rows with ``num_layers``, ``hidden_size``, ``ours`` and ``edelman``
(e.g. ``report.summary()``).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
from matplotlib.figure import Figure

TYPE_LABELS = {"qk": "QK (per head)", "v": "Ṽ (per head)", "m_in": "M_in", "ista": "ISTA D (as M_in)", "m_out": "M_out"}
PROXY_STYLE = {"ours": ("B_ours (spectrum-adaptive)", "-", "o"), "edelman": ("B_Edelman", "--", "s")}


def _rows(rows: Iterable[Mapping[str, Any] | Any]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        r = r.summary() if hasattr(r, "summary") else dict(r)
        for key in ("num_layers", "hidden_size", "ours", "edelman"):
            if key not in r:
                raise ValueError(f"rows: each row needs {key!r}; got keys {sorted(r)}")
        out.append(r)
    if not out:
        raise ValueError("rows: expected at least one model row, got none")
    return out


def _normalizers(rows: list[dict[str, Any]]) -> dict[str, float]:
    base = min(rows, key=lambda r: (r["num_layers"], r["hidden_size"]))
    return {k: float(base[k]) for k in PROXY_STYLE}


def _scaling(rows, x_key: str, group_key: str, title: str) -> Figure:
    rows = _rows(rows)
    norm = _normalizers(rows)
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.add_subplot()
    groups = sorted({r[group_key] for r in rows})
    colors = [f"C{i % 10}" for i in range(len(groups))]
    for color, g in zip(colors, groups):
        sel = sorted((r for r in rows if r[group_key] == g), key=lambda r: r[x_key])
        xs = [r[x_key] for r in sel]
        for key, (label, ls, marker) in PROXY_STYLE.items():
            ys = [r[key] / norm[key] for r in sel]
            ax.plot(xs, ys, ls=ls, marker=marker, color=color, label=f"{label}, {group_key.replace('_', ' ')}={g}")
    ax.set_yscale("log")
    ax.set_xlabel("hidden size N" if x_key == "hidden_size" else "depth L")
    ax.set_ylabel("proxy / proxy of the smallest model")
    ax.set_title(title)
    ax.set_xticks(sorted({r[x_key] for r in rows}))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    return fig


def plot_proxies_vs_width(rows) -> Figure:
    """Both proxies vs N, one line pair per depth L, normalised to the smallest model (log scale)."""
    return _scaling(rows, "hidden_size", "num_layers", "Bound proxies vs width (fixed depth)")


def plot_proxies_vs_depth(rows) -> Figure:
    """Both proxies vs L, one line pair per width N, normalised to the smallest model (log scale)."""
    return _scaling(rows, "num_layers", "hidden_size", "Bound proxies vs depth (fixed width)")


def _types(report) -> list[str]:
    return [t for t in TYPE_LABELS if any(m.type == t for m in report.matrices)]


def plot_spectral_decay(report) -> Figure:
    """σᵢ/σ₁ against i for every matrix, one panel per matrix type, coloured by layer (log scale)."""
    types = _types(report)
    fig = Figure(figsize=(3.2 * len(types), 3.4), layout="constrained")
    axes = fig.subplots(1, len(types), squeeze=False)[0]
    cmap = _layer_colors(report.num_layers)
    for ax, t in zip(axes, types):
        for m in report.matrices:
            if m.type != t or m.rank == 0:
                continue
            s = m.singular_values
            ax.plot(np.arange(1, len(s) + 1), s / s[0], color=cmap[m.layer], lw=0.7, alpha=0.7)
        ax.set_yscale("log")
        ax.set_xlabel("index i")
        ax.set_title(TYPE_LABELS[t], fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("σᵢ / σ₁")
    fig.suptitle(f"Spectral decay — {report.model} (colour: layer, dark = first)", fontsize=9)
    return fig


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
        mean = [ps[layers == layer].mean() for layer in range(report.num_layers)]
        ax.plot(np.arange(report.num_layers) + offset, mean, color=f"C{i}", marker="o", label=TYPE_LABELS[t])
    ax.set_xlabel("layer ℓ")
    ax.set_ylabel("optimal p")
    ax.set_ylim(-0.05, 2.05)
    ax.set_xticks(range(report.num_layers))
    ax.set_title(f"Optimal Schatten index per matrix — {report.model}", fontsize=9)
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
            curves = np.stack([m.contributions for m in report.matrices if m.type == t and m.layer == layer])
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
    fig.suptitle(f"Contribution vs Schatten index — {report.model} (colour: layer)", fontsize=9)
    return fig


def _layer_colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(i / max(n - 1, 1)) for i in range(n)]


def save_report_figures(report, out_dir: str, prefix: str = "") -> dict[str, str]:
    """Write the three per-model figures as PNG into ``out_dir``; returns name -> path."""
    import os

    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for name, fn in (
        ("spectral_decay", plot_spectral_decay),
        ("optimal_p", plot_optimal_p),
        ("contribution_vs_p", plot_contribution_vs_p),
    ):
        path = os.path.join(out_dir, f"{prefix}{name}.png")
        fn(report).savefig(path, dpi=120)
        paths[name] = path
    return paths


__all__ = [
    "plot_contribution_vs_p",
    "plot_optimal_p",
    "plot_proxies_vs_depth",
    "plot_proxies_vs_width",
    "plot_spectral_decay",
    "save_report_figures",
]
