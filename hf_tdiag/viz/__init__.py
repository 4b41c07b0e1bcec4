"""Matplotlib figures shared by the command line, recipes, report and Space.

Figures are ``matplotlib.figure.Figure`` objects drawn with the Agg canvas and
no pyplot state, so they work headless and never change the user's backend;
save them with :func:`save_figure` (or ``fig.savefig``).

* :func:`plot_layer_srr` — per-layer curves of R, Rᶜ, sparsity and SRR
  (mean ± std over samples), several models / settings on one figure.

One submodule per capability: :mod:`hf_tdiag.viz.schatten` (bound proxies, spectra,
optimal p), :mod:`hf_tdiag.viz.concept_fidelity` (concept heatmaps, KL vs bound),
:mod:`hf_tdiag.viz.attention_svm` (correlation curves, head diagnostic) and
:mod:`hf_tdiag.viz.study` (measure-vs-gap scatter plots).
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

SRR_TERM_LABELS = {
    "R": r"coding rate $R(Z)$",
    "Rc": r"compression term $R^c(Z;\,U)$",
    "sparsity": r"sparsity $\|Z\|_0\,/\,(dN)$",
    "srr": r"SRR $= R^c - R + \lambda \cdot \mathrm{sparsity}$",
}
SRR_STATE_LABELS = {
    "output": r"$Z^{\ell}$",
    "input": r"$Z^{\ell-1}$ (with $U^{\ell}$)",
    "mid": r"$Z^{\ell-1/2}$",
    "official": "official",
}
_STATE_STYLE = {"output": ("-", "o"), "input": (":", "^"), "mid": ("--", "s"), "official": ("-", "D")}
# x position of block l's state: the embeddings Z^0 at 0, block l's output at l, its mid state at l - 1/2
_STATE_OFFSET = {"output": 0.0, "official": 0.0, "mid": -0.5, "input": -1.0}
DEFAULT_SRR_STATES = ("output", "mid", "official")


def new_figure(width: float = 6.4, height: float = 4.4, layout: str | None = "constrained", **kwargs) -> Figure:
    """A Figure on an Agg canvas (constrained layout by default), independent of pyplot."""
    fig = Figure(figsize=(width, height), layout=layout, **kwargs)
    FigureCanvasAgg(fig)
    return fig


def new_subplots(rows: int, cols: int, figsize: tuple[float, float], **kwargs):
    """``(figure, axes grid)`` on an Agg canvas without pyplot (``layout`` as given; none by default)."""
    fig = new_figure(*figsize, layout=kwargs.pop("layout", None), **kwargs)
    return fig, fig.subplots(rows, cols, squeeze=False)


def figure_to_png(fig: Figure, dpi: int = 110) -> bytes:
    """PNG bytes of ``fig``."""
    if not isinstance(fig, Figure):
        raise TypeError(f"fig: expected a matplotlib Figure, got {type(fig).__name__}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def png_to_data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` URI of PNG bytes."""
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("png: expected PNG bytes (missing PNG signature)")
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def save_figure(fig: Figure, path, dpi: int = 120) -> str:
    """Write ``fig`` to ``path`` atomically (format from the suffix, PNG by default); return the path."""
    from .._atomic import save_figure as _save_atomic

    return _save_atomic(fig, path, dpi=dpi)


def _as_report_dict(report) -> dict[str, Any]:
    data = report.to_dict() if hasattr(report, "to_dict") else report
    if not isinstance(data, Mapping) or "mean" not in data or "layers" not in data:
        raise TypeError(f"reports: expected SRRReport objects (or their to_dict()), got {type(report).__name__}")
    return dict(data)


def _default_label(data: Mapping) -> str:
    settings = data.get("settings", {})
    name = str(settings.get("model", "model"))
    name = os.path.basename(name.rstrip("/")) or name
    extra = settings.get("variant") or (settings.get("source") if settings.get("family") != "crate" else None)
    return f"{name} ({extra})" if extra else name


def _named_reports(reports, labels) -> list[tuple[str, dict[str, Any]]]:
    if isinstance(reports, Mapping) and "mean" not in reports:
        items = [(str(k), _as_report_dict(v)) for k, v in reports.items()]
    elif isinstance(reports, Sequence) and not isinstance(reports, (str, bytes)):
        items = [(None, _as_report_dict(r)) for r in reports]
    else:
        items = [(None, _as_report_dict(reports))]
    if not items:
        raise ValueError("reports: expected at least one report, got none")
    if labels is not None:
        labels = list(labels)
        if len(labels) != len(items):
            raise ValueError(f"labels: expected {len(items)} labels (one per report), got {len(labels)}")
        items = [(str(lab), d) for lab, (_, d) in zip(labels, items)]
    return [(lab if lab is not None else _default_label(d), d) for lab, d in items]


def _state_curve(data: Mapping, state: str, term: str, with_std: bool):
    """``(x, mean, std)`` of one state; the block outputs start at x = 0 with the embeddings ``Z^0``."""
    layers = list(data["layers"])
    x = [ell + _STATE_OFFSET.get(state, 0.0) for ell in layers]
    mean = list(data["mean"][state][term])
    std = list(data["std"][state][term]) if with_std and "std" in data else None
    embeddings = data.get("embeddings")
    if state == "output" and embeddings:
        x, mean = [0] + x, [embeddings["mean"][term]] + mean
        if std is not None:
            std = [embeddings["std"][term]] + std
    return x, mean, std


def plot_layer_srr(
    reports,
    *,
    labels: Sequence[str] | None = None,
    terms: Sequence[str] = ("R", "Rc", "sparsity", "srr"),
    states: Sequence[str] | None = None,
    show_std: bool = True,
    title: str | None = None,
) -> Figure:
    """Per-layer mean (± std band) of each SRR term, one panel per term, one colour per report.

    ``reports``: an ``SRRReport`` (or its ``to_dict()``), a list of them, or a ``{label: report}`` dict —
    e.g. CRATE vs CRATE-C vs CRATE-N vs CRATE-T, or a ViT's query/key/value. x = 0 is the embedding output
    ``Z^0``, x = ℓ the output ``Z^ℓ`` of block ℓ (solid); CRATE's mid states ``Z^{ℓ−½}`` sit at ℓ − ½ (dashed).
    ``states`` picks the states drawn (default: ``output``, ``mid`` and ``official``; add ``input`` for the
    block inputs ``Z^{ℓ−1}`` measured with ``U^ℓ``, dotted at ℓ − 1).
    """
    named = _named_reports(reports, labels)
    terms = list(terms)
    unknown = [t for t in terms if t not in SRR_TERM_LABELS]
    if unknown or not terms:
        raise ValueError(f"terms: expected a non-empty subset of {list(SRR_TERM_LABELS)}, got {terms}")
    wanted = tuple(states) if states is not None else DEFAULT_SRR_STATES
    cols = min(len(terms), 2)
    rows = (len(terms) + cols - 1) // cols
    fig = new_figure(5.2 * cols, 3.6 * rows)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    colors = [f"C{i % 10}" for i in range(len(named))]
    drawn = 0
    for ax, term in zip(axes, terms):
        for color, (label, data) in zip(colors, named):
            shown = [s for s in data["mean"] if s in wanted]
            for state in shown:
                x, mean, std = _state_curve(data, state, term, show_std)
                style, marker = _STATE_STYLE.get(state, (":", "^"))
                line_label = f"{label} · {SRR_STATE_LABELS.get(state, state)}" if len(shown) > 1 else label
                ax.plot(x, mean, linestyle=style, marker=marker, color=color, markersize=4, label=line_label)
                if std is not None:
                    lo = [m - s for m, s in zip(mean, std)]
                    hi = [m + s for m, s in zip(mean, std)]
                    ax.fill_between(x, lo, hi, color=color, alpha=0.12, linewidth=0)
                drawn += 1
        ax.set_title(SRR_TERM_LABELS[term], fontsize=10)
        ax.set_xlabel("layer ℓ (0 = embeddings, ℓ = output of block ℓ)")
        ax.grid(True, alpha=0.3)
        if named and named[0][1]["layers"]:
            ax.set_xticks([0] + list(named[0][1]["layers"]))
    for ax in axes[len(terms) :]:
        ax.set_visible(False)
    if drawn == 0:
        raise ValueError(f"states: none of {list(wanted)} is in the reports")
    handles, texts = axes[0].get_legend_handles_labels()
    fig.legend(handles, texts, loc="outside lower center", ncol=min(4, len(texts)), fontsize=8, frameon=False)
    if title is None:
        first = named[0][1].get("settings", {})
        if "eps" in first:
            title = (
                f"Sparse rate reduction per layer (ε={first['eps']}, λ={first.get('lam')}, "
                f"{named[0][1].get('num_samples', '?')} samples)"
            )
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


__all__ = ["SRR_TERM_LABELS", "SRR_STATE_LABELS", "DEFAULT_SRR_STATES", "new_figure", "save_figure", "plot_layer_srr"]
