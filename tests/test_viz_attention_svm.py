"""The head-diagnostic figure draws whatever the margins are, including all-equal ones."""

import numpy as np
import pytest

from hf_tdiag.viz.attention_svm import _hist_range, plot_head_diagnostic


def _diag(head_margins, svm_margins):
    return {
        "layer": 0,
        "head": 1,
        "correlation": 0.5,
        "head_margins": list(head_margins),
        "svm_margins": list(svm_margins),
        "svm_margin": 0.25,
        "max_probs": [0.2, 0.9, 0.99],
        "one_hot_threshold": 0.9,
        "one_hot_fraction": 2 / 3,
        "margin_ratio": 0.8,
    }


@pytest.mark.parametrize(
    "head,svm",
    [
        ([0.3, 0.3, 0.3], [0.3, 0.3 + 1e-16, 0.3]),  # identical inputs: every margin the same
        ([0.0, 0.0, 0.0], []),
        ([-1.0, 0.5, 2.0], [0.25, 0.25, 0.4]),
    ],
)
def test_histograms_cover_all_margins(head, svm):
    fig = plot_head_diagnostic(_diag(head, svm))
    ax = fig.axes[0]
    counted = sum(p.get_height() for p in ax.patches)
    assert counted == len(head) + len(svm)  # every finite margin lands in a bin


def test_hist_range_widens_only_degenerate_data():
    assert _hist_range(np.array([1.0, 3.0])) == (1.0, 3.0)
    lo, hi = _hist_range(np.array([2.0, 2.0]))
    assert lo < 2.0 < hi
    assert _hist_range(np.array([np.nan])) is None
