"""SRR figures beyond the per-layer curves, and the per-layer SRR report of a trained model.

* :func:`plot_mssa_step` — Rᶜ along one MSSA step over step sizes, per variant (Hu, Zou & Xu 2024, Fig. 1);
* :func:`plot_srr_history` — Rᶜ, sparsity and SRR per layer across training (Yu et al. 2023, Fig. 4 style);
* :func:`plot_probe_vs_srr` — linear-probe accuracy of every layer next to its SRR (Hu et al., rebuttal Fig. 1).

:func:`hf_tdiag.training.srr_tracking.layer_srr_step` (an ``after_fit`` step of :func:`hf_tdiag.training.train`)
it measures :func:`hf_tdiag.layer_srr` on the first ``--layer_srr_samples`` evaluation images, writes
``layer_srr.json`` and ``layer_srr.png`` (:func:`hf_tdiag.viz.plot_layer_srr`) into the output folder,
prints :func:`layer_srr_table` and returns the entries the results and the model card carry.
"""

from __future__ import annotations

import os

from . import new_figure, plot_layer_srr, save_figure

_VARIANT_NAMES = {
    "crate": "CRATE (learned W)",
    "crate-c": "CRATE-C (U)",
    "crate-n": "CRATE-N (−U)",
    "crate-t": "CRATE-T (Uᵀ)",
}


def plot_mssa_step(result: dict, title: str | None = None):
    """``Rᶜ(Z + κ·MSSA(Z); U) − Rᶜ(Z; U)`` against κ, mean ± std over seeds, one line per variant."""
    import numpy as np

    fig = new_figure(6.0, 4.2)
    ax = fig.subplots()
    steps = np.asarray(result["step_sizes"])
    for i, variant in enumerate(result["variants"]):
        curves = np.asarray(result["Rc"][variant])
        delta = curves - curves[:, :1]
        mean, std = delta.mean(0), delta.std(0)
        ax.plot(steps, mean, marker="o", markersize=3, color=f"C{i}", label=_VARIANT_NAMES.get(variant, variant))
        ax.fill_between(steps, mean - std, mean + std, color=f"C{i}", alpha=0.15, linewidth=0)
    ax.axhline(0.0, color="0.5", linewidth=0.8)
    ax.set_xlabel(r"step size $\kappa$ of $Z + \kappa \cdot \mathrm{MSSA}(Z)$")
    ax.set_ylabel(r"$R^c(Z_\kappa;\,U) - R^c(Z;\,U)$")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    st = result.get("settings", {})
    ax.set_title(
        title
        or f"Rᶜ along one MSSA step (N={st.get('num_tokens')}, d={st.get('hidden_size')}, "
        f"K={st.get('num_heads')}, {len(st.get('seeds', []))} seeds)",
        fontsize=10,
    )
    return fig


def plot_srr_history(data: dict, terms=("Rc", "sparsity", "srr"), title: str | None = None):
    """Per-layer ``terms`` (x = 0 embeddings, x = ℓ block output) for every record of ``srr_history.json``,
    coloured by training step (early = dark, late = bright)."""
    from matplotlib import colormaps

    from . import SRR_TERM_LABELS

    records = data["history"]
    if not records:
        raise ValueError("data: the SRR history has no records")
    fig = new_figure(4.2 * len(terms), 3.8)
    axes = fig.subplots(1, len(terms), squeeze=False).ravel()
    cmap, last = colormaps["viridis"], max(r["step"] for r in records) or 1
    for ax, term in zip(axes, terms):
        for r in records:
            values = list(r["output"][term])
            xs = list(range(1, len(values) + 1))
            if r.get("embeddings"):
                xs, values = [0] + xs, [r["embeddings"][term]] + values
            ax.plot(xs, values, color=cmap(r["step"] / last), marker="o", markersize=2.5, linewidth=1.2)
        ax.set_title(SRR_TERM_LABELS.get(term, term), fontsize=10)
        ax.set_xlabel("layer ℓ (0 = embeddings)")
        ax.grid(True, alpha=0.3)
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    fig.colorbar(ScalarMappable(Normalize(0, last), cmap), ax=list(axes), label="optimizer step", shrink=0.8)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def plot_probe_vs_srr(result: dict, title: str | None = None):
    """Linear-probe test accuracy of every layer's output (left axis) next to its SRR (right axis)."""
    fig = new_figure(6.4, 4.2)
    ax = fig.subplots()
    layers = result["layers"]
    ax.plot(layers, result["probe_accuracy"], marker="o", color="C0", label="linear-probe accuracy")
    ax.set_xlabel("layer ℓ (0 = embeddings, ℓ = output of block ℓ)")
    ax.set_ylabel("linear-probe test accuracy", color="C0")
    ax.set_xticks(layers)
    ax.grid(True, alpha=0.3)
    twin = ax.twinx()
    twin.plot(layers, result["srr"], marker="s", linestyle="--", color="C3", label="SRR (lower is better)")
    twin.set_ylabel(r"SRR $= R^c - R + \lambda \cdot \mathrm{sparsity}$", color="C3")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    fig.legend(handles, [h.get_label() for h in handles], loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    ax.set_title(title or "Linear separability vs sparse rate reduction per layer", fontsize=10)
    return fig


def _row(name: str, srr: float, R: float, Rc: float, sp: float) -> str:
    return f"  {name:<10}: SRR {srr:9.4f}   R {R:9.4f}   Rc {Rc:9.4f}   sparsity {sp:.4f}"


def layer_srr_table(report, state: str | None = None) -> str:
    """One line per layer (``embeddings`` = ``Z^0``, ``layer ℓ`` = block ℓ's output): SRR, R, Rᶜ, sparsity means."""
    state = state or report.states[0]
    mean = report.mean[state]
    lines = [f"per-layer SRR ({state}, mean over {report.num_samples} samples):"]
    if report.embeddings is not None and state == "output":
        e = report.embeddings["mean"]
        lines.append(_row("embeddings", e["srr"], e["R"], e["Rc"], e["sparsity"]))
    for i, ell in enumerate(report.layers):
        lines.append(_row(f"layer {ell:2d}", mean["srr"][i], mean["R"][i], mean["Rc"][i], mean["sparsity"][i]))
    return "\n".join(lines)


def write_layer_srr(report, output_dir: str, title: str | None = None) -> tuple[str, str]:
    """``layer_srr.json`` and ``layer_srr.png`` of ``report`` in ``output_dir``; returns both paths."""
    json_path = os.path.join(output_dir, "layer_srr.json")
    report.to_json(json_path)
    png_path = save_figure(plot_layer_srr(report, title=title), os.path.join(output_dir, "layer_srr.png"))
    return json_path, png_path


__all__ = [
    "layer_srr_table",
    "write_layer_srr",
    "plot_mssa_step",
    "plot_srr_history",
    "plot_probe_vs_srr",
]
