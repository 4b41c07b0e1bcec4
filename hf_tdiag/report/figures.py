"""Figures the report and the Space draw themselves (everything else comes from the capability ``viz*`` modules).

Only the attention-map overlays live here: the CLS token's attention over the patch grid, drawn on top of the input
image, per head of one layer and as a per-layer mean over heads. Plus helpers to turn matplotlib figures into PNG
bytes / base64 for the self-contained HTML report.
"""

from __future__ import annotations

import base64
import io
import math

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .._validation import integer


def _subplots(rows: int, cols: int, figsize: tuple[float, float], **kwargs):
    """``(figure, axes grid)`` on an Agg canvas, without pyplot (the user's backend is never touched)."""
    fig = Figure(figsize=figsize, **kwargs)
    FigureCanvasAgg(fig)
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


def cls_attention_grid(attentions: torch.Tensor, grid: tuple[int, int]) -> np.ndarray:
    """CLS-query attention to the patch tokens: ``(L, K, N, N) -> (L, K, gh, gw)``.

    The patch tokens are the last ``gh*gw`` tokens (CLS and any distillation/register tokens come first).
    """
    if (
        not isinstance(attentions, torch.Tensor)
        or attentions.dim() != 4
        or attentions.shape[-1] != attentions.shape[-2]
    ):
        shape = tuple(attentions.shape) if isinstance(attentions, torch.Tensor) else type(attentions).__name__
        raise ValueError(f"attentions: expected a tensor (layers, heads, N, N), got {shape}")
    gh, gw = int(grid[0]), int(grid[1])
    n = attentions.shape[-1]
    prefix = n - gh * gw
    if prefix < 1:
        raise ValueError(f"grid: {gh}x{gw} patches need at least {gh * gw + 1} tokens (CLS first), attentions have {n}")
    maps = attentions[:, :, 0, prefix:].detach().to(torch.float64).cpu().numpy()
    if not np.isfinite(maps).all():
        raise ValueError("attentions: contain NaN or inf")
    return maps.reshape(maps.shape[0], maps.shape[1], gh, gw)


def _image_array(image) -> np.ndarray:
    arr = np.asarray(image, dtype=np.float64)
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim not in (2, 3):
        raise ValueError(f"image: expected an (H, W) or (H, W, C) image, got shape {arr.shape}")
    lo, hi = float(arr.min()), float(arr.max())
    return (arr - lo) / (hi - lo) if hi > lo else np.zeros_like(arr)


def _overlay(ax, image: np.ndarray, amap: np.ndarray, title: str) -> None:
    h, w = image.shape[:2]
    ax.imshow(image, cmap="gray" if image.ndim == 2 else None, extent=(0, w, h, 0), interpolation="nearest")
    ax.imshow(amap, cmap="inferno", alpha=0.55, extent=(0, w, h, 0), interpolation="nearest")
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


def _overlay_grid(image, maps: np.ndarray, titles: list[str], suptitle: str) -> Figure:
    """One panel per map (up to 6 a row), each ``_overlay``-ed on ``image``; unused panels blank."""
    img = _image_array(image)
    n = len(titles)
    cols = min(n, 6)
    rows = math.ceil(n / cols)
    fig, axes = _subplots(rows, cols, (1.9 * cols, 2.0 * rows + 0.3))
    for k in range(rows * cols):
        ax = axes[k // cols][k % cols]
        if k < n:
            _overlay(ax, img, maps[k], titles[k])
        else:
            ax.axis("off")
    fig.suptitle(suptitle, fontsize=10)
    return fig


def _check_block(layer, num_layers: int) -> int:
    layer = integer(layer, "layer")
    if not 1 <= layer <= num_layers:
        raise ValueError(f"layer: expected a block number 1..{num_layers}, got {layer!r}")
    return layer


def attention_heads_figure(image, attentions: torch.Tensor, grid: tuple[int, int], layer: int) -> Figure:
    """CLS attention of every head of block ``layer`` (1..L) over ``image`` (attentions ``(L, K, N, N)`` of one
    input: ``attentions[l-1]`` is block l's)."""
    maps = cls_attention_grid(attentions, grid)
    layer = _check_block(layer, maps.shape[0])
    titles = [f"head {k}" for k in range(maps.shape[1])]
    return _overlay_grid(image, maps[layer - 1], titles, f"CLS attention over the image, layer {layer}")


def attention_layers_figure(image, attentions: torch.Tensor, grid: tuple[int, int]) -> Figure:
    """Mean over heads of the CLS attention, one panel per layer (attentions ``(L, K, N, N)`` of one input)."""
    maps = cls_attention_grid(attentions, grid).mean(axis=1)
    titles = [f"layer {i}" for i in range(1, maps.shape[0] + 1)]
    return _overlay_grid(image, maps, titles, "CLS attention (mean over heads) per layer")


def token_attention_figure(tokens: list[str], attentions: torch.Tensor, layer: int) -> Figure:
    """Token-to-token attention of block ``layer`` (1..L), mean over heads, tokens as tick labels (attentions
    ``(L, K, N, N)``)."""
    if attentions.dim() != 4 or attentions.shape[-1] != len(tokens):
        raise ValueError(
            f"attentions: expected (layers, heads, {len(tokens)}, {len(tokens)}), got {tuple(attentions.shape)}"
        )
    layer = _check_block(layer, attentions.shape[0])
    matrix = attentions[layer - 1].mean(0).detach().to(torch.float64).cpu().numpy()
    n = len(tokens)
    side = min(9.0, 2.0 + 0.28 * n)
    fig, axes = _subplots(1, 1, (side + 1.2, side), layout="constrained")
    ax = axes[0][0]
    im = ax.imshow(matrix, cmap="inferno", interpolation="nearest")
    size = 7 if n <= 32 else 5
    ax.set_xticks(range(n), tokens, rotation=90, fontsize=size)
    ax.set_yticks(range(n), tokens, fontsize=size)
    ax.set_xlabel("attended token (key)")
    ax.set_ylabel("query token")
    ax.set_title(f"Attention, layer {layer}, mean over heads", fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8)
    return fig


def first_token_attention_figure(tokens: list[str], attentions: torch.Tensor) -> Figure:
    """Attention of the first token to every token, mean over heads: layers (rows) × tokens (columns)."""
    if attentions.dim() != 4 or attentions.shape[-1] != len(tokens):
        raise ValueError(
            f"attentions: expected (layers, heads, {len(tokens)}, {len(tokens)}), got {tuple(attentions.shape)}"
        )
    rows = attentions[:, :, 0, :].mean(1).detach().to(torch.float64).cpu().numpy()
    n, layers = len(tokens), rows.shape[0]
    fig, axes = _subplots(1, 1, (min(12.0, 2.5 + 0.3 * n), 1.6 + 0.32 * layers), layout="constrained")
    ax = axes[0][0]
    im = ax.imshow(rows, cmap="inferno", aspect="auto", interpolation="nearest")
    ax.set_xticks(range(n), tokens, rotation=90, fontsize=7 if n <= 32 else 5)
    ax.set_yticks(range(layers), [str(i) for i in range(1, layers + 1)], fontsize=8)
    ax.set_ylabel("layer (block 1..L)")
    ax.set_title(f"Attention of {tokens[0]!s} to each token, mean over heads", fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8)
    return fig


def token_codes_figure(tokens: list[str], codes: torch.Tensor) -> Figure:
    """Heatmap of concept codes ``(tokens, k)`` of one text: one row per concept, one column per token."""
    c = codes.detach().double().cpu().numpy().T
    fig, axes = _subplots(1, 1, (max(4.0, 0.28 * len(tokens) + 1.5), 0.35 * c.shape[0] + 1.2))
    ax = axes[0, 0]
    im = ax.imshow(c, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(tokens)))
    ax.set_xticklabels([t if t.strip() else "␣" for t in tokens], fontsize=7, rotation=90)
    ax.set_yticks(range(c.shape[0]))
    ax.set_yticklabels([f"c{k}" for k in range(c.shape[0])], fontsize=7)
    ax.set_xlabel("token")
    fig.colorbar(im, ax=ax, fraction=0.03, label="code")
    return fig


def predictions_figure(images: list, labels: list[str], probs: list[float], truths: list[str] | None = None) -> Figure:
    """Small gallery of inputs with the predicted label and its probability (and the true label if known)."""
    n = len(images)
    if n == 0 or len(labels) != n or len(probs) != n:
        raise ValueError(f"images/labels/probs: expected equal non-zero lengths, got {n}, {len(labels)}, {len(probs)}")
    cols = min(n, 8)
    rows = math.ceil(n / cols)
    fig, axes = _subplots(rows, cols, (1.5 * cols, 1.7 * rows))
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


def optimal_p_heatmap(report) -> Figure:
    """Heatmap of the optimal Schatten index p per matrix: layers (rows) × matrix type/head (columns).

    ``report`` is a :class:`hf_tdiag.probes.spectrum.SpectrumBoundReport`; each cell is one record's ``p_opt``.
    """
    order = {"qk": 0, "v": 1, "m_in": 2, "ista": 2, "m_out": 3}
    columns = sorted(
        {(m.type, -1 if m.head is None else m.head) for m in report.matrices}, key=lambda c: (order.get(c[0], 9), c[1])
    )
    if not columns:
        raise ValueError("report: has no matrices")
    col_index = {c: j for j, c in enumerate(columns)}
    grid = np.full((report.num_layers, len(columns)), np.nan)
    for m in report.matrices:
        grid[m.layer, col_index[(m.type, -1 if m.head is None else m.head)]] = m.p_opt
    width = min(16.0, 2.5 + 0.32 * len(columns))
    fig, axes = _subplots(1, 1, (width, 1.8 + 0.35 * report.num_layers), layout="constrained")
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
    "attention_heads_figure",
    "attention_layers_figure",
    "cls_attention_grid",
    "first_token_attention_figure",
    "token_attention_figure",
    "figure_to_png",
    "png_to_data_uri",
    "predictions_figure",
]
