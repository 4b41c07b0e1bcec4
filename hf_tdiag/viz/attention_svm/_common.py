"""Helpers shared by the attention-SVM figures."""

from __future__ import annotations

import numpy as np


def as_array(x) -> np.ndarray:
    """A float numpy array from a tensor, list or array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=float)
