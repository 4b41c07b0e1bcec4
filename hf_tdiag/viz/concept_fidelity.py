"""Figures for concept fidelity (Semi-NMF concepts, Gram alignment, the KL bound).

* :func:`plot_concept_heatmaps` — concept codes over the patch grid, for a few images;
* :func:`plot_top_patches` — the top-activating patches of each concept;
* :func:`plot_kl_vs_bound` — per-image empirical KL against the bound's right-hand side;
* :func:`plot_mu_sweep` — δ_gram and the empirical KL as the Gram weight μ varies;
* :func:`plot_layer_sweep` — per layer ℓ (log scale): empirical KL against the certified and the estimated bound,
  and δ_rec/‖A‖_F, δ_gram; :func:`layer_sweep_data` returns the numbers it plots.

Figures are Agg-canvas ``Figure`` objects (see :mod:`hf_tdiag.viz`); save with ``save_figure``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from matplotlib.figure import Figure

from . import new_figure, new_subplots, save_figure

#: the KL bound, as matplotlib mathtext
KL_BOUND_MATH = (
    r"$\mathrm{KL} \leq \frac{1}{2}(\|W_c\|_{op} L_{ro})^2\, L_{block}^{2L_{suf}}"
    r"\,(\sqrt{N}\,\delta_{rec} + \alpha \|G\|_F\, \delta_{gram})^2$"
)

__all__ = [
    "token_codes_figure",
    "plot_concept_heatmaps",
    "plot_top_patches",
    "plot_kl_vs_bound",
    "plot_mu_sweep",
    "plot_layer_sweep",
    "layer_sweep_data",
    "save_figure",
]


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def _display_images(pixel_values) -> np.ndarray:
    """(B, C, H, W) pixel values -> (B, H, W) or (B, H, W, 3) in [0, 1] for imshow."""
    x = _np(pixel_values)
    if x.ndim != 4:
        raise ValueError(f"pixel_values: expected (images, channels, height, width), got shape {x.shape}")
    lo = x.min(axis=(1, 2, 3), keepdims=True)
    hi = x.max(axis=(1, 2, 3), keepdims=True)
    x = (x - lo) / np.maximum(hi - lo, 1e-12)
    return x[:, 0] if x.shape[1] == 1 else np.transpose(x[:, :3], (0, 2, 3, 1))


def _codes_grid(codes, grid) -> np.ndarray:
    c = _np(codes)
    if c.ndim != 3:
        raise ValueError(f"codes: expected (images, patches, concepts), got shape {c.shape}")
    gh, gw = grid
    if c.shape[1] != gh * gw:
        raise ValueError(f"codes: {c.shape[1]} patches do not fill a {gh}×{gw} grid")
    return c.reshape(c.shape[0], gh, gw, c.shape[2])


def _top_concepts(codes: np.ndarray, count: int) -> list[int]:
    strength = codes.reshape(-1, codes.shape[-1]).mean(0)
    return [int(i) for i in np.argsort(-strength)[:count]]


def plot_concept_heatmaps(
    pixel_values,
    codes,
    grid: tuple[int, int],
    *,
    n_images: int = 4,
    concepts: Sequence[int] | None = None,
    n_concepts: int = 5,
    title: str | None = None,
) -> Figure:
    """Rows: images; columns: the image, then each concept's code over the patch grid (overlaid)."""
    imgs = _display_images(pixel_values)
    c = _codes_grid(codes, grid)
    n_images = min(n_images, imgs.shape[0], c.shape[0])
    concepts = list(concepts) if concepts is not None else _top_concepts(c, min(n_concepts, c.shape[-1]))
    cols = 1 + len(concepts)
    fig = new_figure(1.6 * cols + 0.6, 1.6 * n_images + 0.5)
    axes = fig.subplots(n_images, cols, squeeze=False)
    H, W = imgs.shape[1], imgs.shape[2]
    for r in range(n_images):
        cmap = "gray" if imgs.ndim == 3 else None
        axes[r, 0].imshow(imgs[r], cmap=cmap, extent=(0, W, H, 0))
        axes[r, 0].set_ylabel(f"image {r}", fontsize=8)
        for j, k in enumerate(concepts):
            ax = axes[r, j + 1]
            ax.imshow(imgs[r], cmap=cmap, extent=(0, W, H, 0))
            heat = c[r, :, :, k]
            vmax = max(float(c[..., k].max()), 1e-12)
            im = ax.imshow(
                heat, cmap="inferno", alpha=0.65, vmin=0, vmax=vmax, extent=(0, W, H, 0), interpolation="nearest"
            )
            if r == 0:
                ax.set_title(f"concept {k}", fontsize=8)
        for ax in axes[r]:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.colorbar(im, ax=axes[:, -1].tolist(), shrink=0.6, label="code (last column scale)")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_top_patches(
    pixel_values,
    codes,
    grid: tuple[int, int],
    *,
    n_concepts: int = 6,
    top: int = 8,
    context: int = 1,
    concepts: Sequence[int] | None = None,
    title: str | None = None,
) -> Figure:
    """For each concept (row), the ``top`` patches with the largest code, cropped with ``context`` patches around."""
    imgs = _display_images(pixel_values)
    c = _codes_grid(codes, grid)
    gh, gw = grid
    H, W = imgs.shape[1], imgs.shape[2]
    ph, pw = H // gh, W // gw
    concepts = list(concepts) if concepts is not None else _top_concepts(c, min(n_concepts, c.shape[-1]))
    fig = new_figure(1.1 * top + 1.0, 1.2 * len(concepts) + 0.4)
    axes = fig.subplots(len(concepts), top, squeeze=False)
    flat = c.reshape(-1, c.shape[-1])
    for r, k in enumerate(concepts):
        order = np.argsort(-flat[:, k])[:top]
        for j in range(top):
            ax = axes[r, j]
            ax.set_xticks([])
            ax.set_yticks([])
            if j >= len(order):
                continue
            idx = int(order[j])
            b, rest = divmod(idx, gh * gw)
            y, x = divmod(rest, gw)
            y0, y1 = max(0, (y - context) * ph), min(H, (y + 1 + context) * ph)
            x0, x1 = max(0, (x - context) * pw), min(W, (x + 1 + context) * pw)
            crop = imgs[b, y0:y1, x0:x1]
            ax.imshow(crop, cmap="gray" if imgs.ndim == 3 else None, extent=(x0, x1, y1, y0))
            ax.add_patch(_rect(x * pw, y * ph, pw, ph))
            ax.set_title(f"{flat[idx, k]:.2g}", fontsize=6)
        axes[r, 0].set_ylabel(f"concept {k}", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def _rect(x, y, w, h):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, fill=False, edgecolor="cyan", linewidth=1.2)


def plot_kl_vs_bound(reports: Mapping[str, Mapping], title: str | None = None, kind: str = "estimated") -> Figure:
    """Scatter of per-input empirical KL (x) against ``bound_<kind>`` (y, ``kind`` "certified" or "estimated"), log–log."""
    if kind not in ("certified", "estimated"):
        raise ValueError(f"kind: expected 'certified' or 'estimated', got {kind!r}")
    if not isinstance(reports, Mapping) or not reports:
        raise ValueError("reports: expected a non-empty mapping label -> concept_fidelity report")
    key = f"bound_{kind}"
    fig = new_figure(5.6, 4.6)
    ax = fig.subplots()
    lo, hi = math.inf, 0.0
    for label, rep in reports.items():
        per = rep.get("per_image", {})
        if key not in per:
            raise ValueError(f"reports[{label!r}]: has no {key} (was it computed with bounds=False?)")
        kl = np.maximum(np.asarray(per["kl"], dtype=float), 1e-12)
        bd = np.maximum(np.asarray(per[key], dtype=float), 1e-12)
        frac = rep.get(f"frac_kl_below_{key}", float(np.mean(kl <= bd)))
        ax.scatter(kl, bd, s=10, alpha=0.6, label=f"{label} (KL ≤ bound: {100 * frac:.0f}%)")
        lo, hi = min(lo, kl.min(), bd.min()), max(hi, kl.max(), bd.max())
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="bound = KL")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"empirical $\mathrm{KL}(\sigma(g(A))\,\|\,\sigma(g(\hat{A})))$")
    ax.set_ylabel(f"{kind} bound (per input)")
    ax.legend(fontsize=7)
    ax.set_title(title or f"Empirical KL vs the {kind} bound (per input)\n" + KL_BOUND_MATH, fontsize=9)
    return fig


_SWEEP_CURVES = (
    ("kl", "empirical KL (mean)", "o-", "tab:red"),
    ("kl_max", "empirical KL (max)", "v:", "tab:red"),
    ("bound_certified", "certified bound (mean)", "s-", "tab:blue"),
    ("bound_certified_chain", r"certified chain $\frac{1}{2}(\|W_c\|\,\Delta)^2$ (mean)", "d--", "tab:cyan"),
    ("bound_estimated", "estimated bound (mean)", "^-", "tab:green"),
)


def layer_sweep_data(sweep: Mapping) -> dict[str, list]:
    """The numbers :func:`plot_layer_sweep` draws: ``layer`` and, per layer, each curve's value (NaN where absent)."""
    table = sweep.get("table") if isinstance(sweep, Mapping) else None
    if not table:
        raise ValueError("sweep: expected a concept_fidelity(..., layers=...) result with a non-empty 'table'")
    keys = [k for k, *_ in _SWEEP_CURVES] + ["delta_rec_rel", "delta_gram"]
    out = {"layer": [int(r["layer"]) for r in table]}
    for key in keys:
        out[key] = [float(r[key]) if r.get(key) is not None else float("nan") for r in table]
    return out


def plot_layer_sweep(sweep: Mapping, title: str | None = None, floor: float = 1e-12) -> Figure:
    """Per layer ℓ: empirical KL, the certified and estimated bounds (log scale), and δ_rec/‖A‖_F, δ_gram.

    Values below ``floor`` (an exact 0, e.g. the KL at ℓ = L with the CLS token untouched) are drawn at ``floor``.
    """
    data = layer_sweep_data(sweep)
    fig = new_figure(6.4, 6.2)
    ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2.2, 1]})
    for key, label, style, color in _SWEEP_CURVES:
        ys = np.maximum(np.asarray(data[key], dtype=float), floor)
        if np.isfinite(ys).any():
            ax.plot(data["layer"], ys, style, color=color, label=label, ms=4)
    ax.set_yscale("log")
    ax.set_ylabel("KL / bound (log scale)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="major")
    ax2.plot(data["layer"], data["delta_rec_rel"], "s--", color="tab:green", label=r"$\delta_{rec}\,/\,\|A\|_F$", ms=4)
    ax2.plot(data["layer"], data["delta_gram"], "o-", color="tab:blue", label="δ_gram", ms=4)
    ax2.set_xlabel("layer ℓ (hidden_states index; 0 = embeddings)")
    ax2.set_xticks(data["layer"])
    ax2.legend(fontsize=7)
    ax2.grid(alpha=0.3)
    ax.set_title(title or "Concept fidelity across layers", fontsize=9)
    return fig


def plot_mu_sweep(rows: Sequence[Mapping], title: str | None = None) -> Figure:
    """δ_gram and empirical KL (means over images) against the Gram weight μ; rows have ``gram_weight``, ``delta_gram``, ``kl``."""
    rows = sorted(rows, key=lambda r: float(r["gram_weight"]))
    if not rows:
        raise ValueError("rows: expected at least one {gram_weight, delta_gram, kl} row")
    mu = np.asarray([float(r["gram_weight"]) for r in rows])
    fig = new_figure(6.0, 4.0)
    ax = fig.subplots()
    ax.plot(mu, [r["delta_gram"] for r in rows], "o-", color="tab:blue", label="δ_gram")
    if "delta_rec_rel" in rows[0]:
        ax.plot(mu, [r["delta_rec_rel"] for r in rows], "s--", color="tab:green", label=r"$\delta_{rec}\,/\,\|A\|_F$")
    ax.set_xscale("symlog", linthresh=max(float(mu[mu > 0].min()) if (mu > 0).any() else 1.0, 1e-6))
    ax.set_xlabel("Gram weight μ")
    ax.set_ylabel("δ_gram, relative δ_rec")
    ax2 = ax.twinx()
    ax2.plot(mu, [r["kl"] for r in rows], "^-", color="tab:red", label="empirical KL")
    ax2.set_ylabel("empirical KL (mean)", color="tab:red")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8)
    ax.set_title(title or "Gram alignment: δ_gram and KL as μ varies", fontsize=9)
    return fig


def token_codes_figure(tokens: list[str], codes: torch.Tensor) -> Figure:
    """Heatmap of concept codes ``(tokens, k)`` of one text: one row per concept, one column per token."""
    c = codes.detach().double().cpu().numpy().T
    fig, axes = new_subplots(1, 1, (max(4.0, 0.28 * len(tokens) + 1.5), 0.35 * c.shape[0] + 1.2))
    ax = axes[0, 0]
    im = ax.imshow(c, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(tokens)))
    ax.set_xticklabels([t if t.strip() else "␣" for t in tokens], fontsize=7, rotation=90)
    ax.set_yticks(range(c.shape[0]))
    ax.set_yticklabels([f"c{k}" for k in range(c.shape[0])], fontsize=7)
    ax.set_xlabel("token")
    fig.colorbar(im, ax=ax, fraction=0.03, label="code")
    return fig
