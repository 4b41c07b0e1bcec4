"""Input galleries: the inputs with the model's predicted label and its probability."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from . import new_subplots


def _image_array(image) -> np.ndarray:
    arr = np.asarray(image, dtype=np.float64)
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim not in (2, 3):
        raise ValueError(f"image: expected an (H, W) or (H, W, C) image, got shape {arr.shape}")
    lo, hi = float(arr.min()), float(arr.max())
    return (arr - lo) / (hi - lo) if hi > lo else np.zeros_like(arr)


def predictions_figure(images: list, labels: list[str], probs: list[float], truths: list[str] | None = None) -> Figure:
    """Small gallery of inputs with the predicted label and its probability (and the true label if known)."""
    n = len(images)
    if n == 0 or len(labels) != n or len(probs) != n:
        raise ValueError(f"images/labels/probs: expected equal non-zero lengths, got {n}, {len(labels)}, {len(probs)}")
    cols = min(n, 8)
    rows = math.ceil(n / cols)
    fig, axes = new_subplots(rows, cols, (1.5 * cols, 1.7 * rows))
    for i in range(rows * cols):
        ax = axes[i // cols][i % cols]
        ax.axis("off")
        if i < n:
            img = _image_array(images[i])
            ax.imshow(img, cmap="gray" if img.ndim == 2 else None, interpolation="nearest")
            title = f"{labels[i]} ({probs[i]:.2f})"
            if truths is not None:
                title += f"\ntrue {truths[i]}"
            ax.set_title(title, fontsize=7)
    return fig


__all__ = ["predictions_figure"]
