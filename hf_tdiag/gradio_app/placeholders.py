"""What the Space's plot areas show before their first run: a light figure saying what will appear there."""

from __future__ import annotations

from matplotlib.figure import Figure

from hf_tdiag.viz import new_figure

#: the text of each plot area before its first run, by the plot's ``elem_id`` (or a short key)
PLACEHOLDERS = {
    "crate-heads": "CLS attention of each head over the image (layer chosen on the left) appears here after Run.",
    "crate-layers": "CLS attention per layer, averaged over heads, appears here after Run.",
    "crate-srr": r"Per-layer $R$, $R^c$, sparsity and SRR of this image appear here after Run.",
    "bounds-heatmap": "The optimal Schatten index p per matrix (layer × matrix type) appears here after Compute bounds.",
    "bounds-spectra": r"The spectral decay $\sigma_i / \sigma_1$ of every matrix, per matrix type, appears here.",
    "bounds-contrib": r"Each matrix's contribution $c(W, p)$ against $p$, its minimum marked, appears here.",
    "concepts-heatmaps": "Concept codes over the patch grid of the first images appear here after Fit concepts.",
    "concepts-top": "The top-activating patches of each concept appear here.",
    "concepts-kl": "Each image's empirical KL against the estimated bound (log–log) appears here.",
    "svm-curves": r"Correlation of the GD iterates with $W_{mm}$ (and $KQ^T$ with the nuclear-norm SVM) appears here "
    "after Run experiment.",
    "svm-head-plot": "The head's margins against the SVM's, and its attention probabilities, appear here after "
    "Diagnose head.",
    "text-attention": "Token-to-token attention of the chosen block on the first text appears here after Run.",
    "text-srr": r"Per-layer $R$, $R^c$, sparsity and SRR of the texts' real tokens appear here after Run.",
    "text-ledger": "A text CRATE's objective ledger (each step's objective before and after it) appears here.",
}


def placeholder_figure(key: str, width: float = 9.0, height: float = 1.2) -> Figure:
    """A blank figure of ``width`` × ``height`` inches with the placeholder text of ``key``, centred and grey."""
    fig = new_figure(width, height, layout=None)
    # one line each (no wrap=True: wrapping measures the text again and again, 2.5x the time of a Space start)
    fig.text(0.5, 0.5, PLACEHOLDERS[key], ha="center", va="center", color="#6e7781", fontsize=10.5)
    return fig


__all__ = ["PLACEHOLDERS", "placeholder_figure"]
