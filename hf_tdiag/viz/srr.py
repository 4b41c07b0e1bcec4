"""The per-layer SRR report of a trained model: JSON, figure and console table.

:func:`layer_srr_step` is an ``after_fit`` step of :func:`hf_tdiag.training.train` (the recipes pass it):
it measures :func:`hf_tdiag.layer_srr` on the first ``--layer_srr_samples`` evaluation images, writes
``layer_srr.json`` and ``layer_srr.png`` (:func:`hf_tdiag.viz.plot_layer_srr`) into the output folder,
prints :func:`layer_srr_table` and returns the entries the results and the model card carry.
"""

from __future__ import annotations

import os

from . import plot_layer_srr, save_figure


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


def layer_srr_step(run) -> dict:
    """``after_fit`` step: per-layer SRR of the trained model on evaluation images (all processes call it)."""
    import torch

    from ..probes.srr import layer_srr

    args, accelerator = run.args, run.accelerator
    if not args.layer_srr_samples:
        return {}
    if run.fsdp:
        accelerator.print("FSDP: skipping the per-layer SRR (parameters are sharded); run `hf-tdiag srr` on the saved model")
        return {}
    count = min(args.layer_srr_samples, len(run.datasets.eval))
    subset = torch.utils.data.Subset(run.datasets.eval, range(count))
    loader = torch.utils.data.DataLoader(subset, batch_size=args.per_device_eval_batch_size, shuffle=False)
    report = layer_srr(
        run.unwrapped,
        loader,
        eps=args.srr_eps,
        lam=args.srr_lambda,
        batch_size=args.per_device_eval_batch_size,
        accelerator=accelerator,
        progress=not args.disable_tqdm,
    )
    if accelerator.is_main_process:
        write_layer_srr(report, args.output_dir, title=f"{run.config.variant} on {run.raw.name}")
        accelerator.print(layer_srr_table(report))
    per_layer = report.per_layer("srr")  # block outputs Z^1..Z^L
    return {
        "layer_srr": per_layer,
        "layer_srr_embeddings": report.embeddings["mean"]["srr"] if report.embeddings else None,
        "layer_srr_samples": report.num_samples,
        "srr_mean_over_layers": float(sum(per_layer) / len(per_layer)),
    }


__all__ = ["layer_srr_table", "write_layer_srr", "layer_srr_step"]
