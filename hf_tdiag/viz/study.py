"""Figures of the SRR-vs-generalization study: each measure against the generalization gap, coloured by variant."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["measure_scatter_grid", "measure_scatter"]

_VARIANT_COLORS = {
    "crate": "#1f77b4",
    "crate-c": "#ff7f0e",
    "crate-n": "#2ca02c",
    "crate-t": "#d62728",
    "crate-fix": "#9467bd",
    "crate-identity": "#8c564b",
}


def _colour(variant: str, palette: dict[str, str]) -> str:
    if variant not in palette:
        extra = ["#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
        palette[variant] = extra[len(palette) % len(extra)]
    return palette[variant]


def measure_scatter(ax, records: Sequence[Mapping], measure: str, label: str | None = None, row: Mapping | None = None):
    """One panel: ``measure`` (x) against the generalization gap (y), a dot per run coloured by its variant."""
    palette = dict(_VARIANT_COLORS)
    seen = set()
    xs = []
    for rec in records:
        value = rec.get("measures", {}).get(measure)
        gap = rec.get("train", {}).get("generalization_gap")
        if value is None or gap is None or not math.isfinite(value) or not math.isfinite(gap):
            continue
        xs.append(value)
        variant = str(rec.get("hparams", {}).get("variant", "?"))
        ax.scatter(
            value,
            gap,
            s=22,
            color=_colour(variant, palette),
            alpha=0.85,
            edgecolors="none",
            label=variant if variant not in seen else None,
        )
        seen.add(variant)
    if xs and min(xs) > 0 and max(xs) / min(xs) > 100:
        ax.set_xscale("log")  # heavy-tailed measures (1/σ², 1/γ²)
    title = label or measure
    if row is not None and row.get("tau") is not None:
        psi = row.get("psi")
        title += f"\nτ={row['tau']:+.3f}" + (f"  Ψ={psi:+.3f}" if psi is not None else "")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(measure, fontsize=8)
    ax.set_ylabel("generalization gap", fontsize=8)
    ax.tick_params(labelsize=7)
    return ax


def measure_scatter_grid(records: Sequence[Mapping], table: Sequence[Mapping], ncols: int = 3):
    """A figure with one :func:`measure_scatter` panel per row of the correlation ``table`` (and one shared legend)."""
    from matplotlib.figure import Figure

    if not table:
        raise ValueError("table: expected at least one measure row, got none")
    n = len(table)
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(3.4 * ncols, 3.0 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, row in enumerate(table):
        measure_scatter(axes[i // ncols][i % ncols], records, row["measure"], row=row)
    for j in range(n, nrows * ncols):
        axes[j // ncols][j % ncols].axis("off")
    handles, labels = [], []
    for ax in axes.ravel():
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05 if handles else 0, 1, 1))
    return fig
