"""The head-diagnostic figure: a head's normalized margins against the SVM margin, and how one-hot its attention is."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .. import new_figure
from ._common import as_array as _arr


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
    ax1.hist(hm[np.isfinite(hm)], bins=20, range=span, alpha=0.7, label=r"head ($W_h / \|W_h\|$)")
    if sm.size:
        ax1.hist(sm[np.isfinite(sm)], bins=20, range=span, alpha=0.5, label=r"SVM ($W_{mm} / \|W_{mm}\|$)")
    if d.get("svm_margin"):
        ax1.axvline(d["svm_margin"], color="k", ls="--", lw=1, label=r"SVM margin $1 / \|W_{mm}\|$")
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
