"""Attention maps: the CLS token's attention over the patch grid drawn on the input image (per head of one block,
and the mean over heads per block), and token-to-token attention of text models."""

from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.figure import Figure

from .._validation import block_number
from . import new_subplots
from .images import _image_array


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


def _overlay(ax, image: np.ndarray, amap: np.ndarray, title: str, vmax: float | None = None) -> None:
    h, w = image.shape[:2]
    ax.imshow(image, cmap="gray" if image.ndim == 2 else None, extent=(0, w, h, 0), interpolation="nearest")
    ax.imshow(amap, cmap="inferno", alpha=0.55, extent=(0, w, h, 0), interpolation="nearest", vmin=0, vmax=vmax)
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


def _overlay_grid(image, maps: np.ndarray, titles: list[str], suptitle: str) -> Figure:
    """One panel per map (up to 6 a row), each ``_overlay``-ed on ``image`` on one colour scale (0 to the largest
    weight, shown by the colour bar); unused panels blank."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    img = _image_array(image)
    n = len(titles)
    cols = min(n, 6)
    rows = math.ceil(n / cols)
    vmax = float(np.max(maps[:n])) if n else 1.0
    vmax = vmax if vmax > 0 else 1.0
    fig, axes = new_subplots(rows, cols, (1.9 * cols + 0.9, 2.0 * rows + 0.3), layout="constrained")
    for k in range(rows * cols):
        ax = axes[k // cols][k % cols]
        if k < n:
            _overlay(ax, img, maps[k], titles[k], vmax=vmax)
        else:
            ax.axis("off")
    bar = fig.colorbar(
        ScalarMappable(Normalize(0, vmax), cmap="inferno"), ax=[a for row in axes for a in row], shrink=0.85
    )
    bar.set_label("attention weight of CLS", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    fig.suptitle(suptitle, fontsize=10)
    return fig


def _check_block(layer, num_layers: int) -> int:
    return block_number(layer, num_layers)


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
    fig, axes = new_subplots(1, 1, (side + 1.2, side), layout="constrained")
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
    fig, axes = new_subplots(1, 1, (min(12.0, 2.5 + 0.3 * n), 1.6 + 0.32 * layers), layout="constrained")
    ax = axes[0][0]
    im = ax.imshow(rows, cmap="inferno", aspect="auto", interpolation="nearest")
    ax.set_xticks(range(n), tokens, rotation=90, fontsize=7 if n <= 32 else 5)
    ax.set_yticks(range(layers), [str(i) for i in range(1, layers + 1)], fontsize=8)
    ax.set_ylabel("layer (block 1..L)")
    ax.set_title(f"Attention of {tokens[0]!s} to each token, mean over heads", fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8)
    return fig


__all__ = [
    "attention_heads_figure",
    "attention_layers_figure",
    "cls_attention_grid",
    "first_token_attention_figure",
    "token_attention_figure",
]
