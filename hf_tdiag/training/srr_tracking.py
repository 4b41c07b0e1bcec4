"""The trainer's SRR hooks: per-layer SRR across training and of the trained model.

Across training (Yu et al. 2023, Fig. 4 style): ``--track-srr-every N|epoch``.

Every N optimizer steps (or at the end of every epoch), and once before the first step, the trainer measures
:func:`hf_tdiag.layer_srr` on the first ``--track-srr-samples`` evaluation images and keeps, per record, the
step, the epoch, and the per-layer means of R, Rᶜ, sparsity and SRR of the block outputs ``Z^ℓ`` (blocks
1…L, the embeddings ``Z^0`` apart) and, for CRATE, of the mid states ``Z^{ℓ−½}``. Records go to the tracker
(``srr/layer_<ℓ>/<term>``) and to ``<output_dir>/srr_history.json``; they are part of the checkpoint state,
so a resumed run continues the same history.
"""

from __future__ import annotations

import os

import torch

from .._atomic import write_json
from ..diagnostics.srr import TERMS, layer_srr
from .families import architecture_name

HISTORY_FILE = "srr_history.json"


def parse_every(value) -> int | str | None:
    """``None``/``0`` (off), a positive step count, or ``"epoch"``."""
    if value is None or value == 0 or value == "0":
        return None
    if value == "epoch":
        return "epoch"
    try:
        steps = int(value)
    except (TypeError, ValueError):
        steps = -1
    if isinstance(value, bool) or steps < 1:
        raise ValueError(f"track_srr_every: expected a positive number of steps or 'epoch', got {value!r}")
    return steps


def due(every, step: int, epoch_end: bool) -> bool:
    """Whether a record is due after optimizer step ``step`` (``epoch_end``: the epoch just finished)."""
    if every is None:
        return False
    if every == "epoch":
        return epoch_end
    return not epoch_end and step % every == 0


def _eval_report(run, samples: int, progress: bool):
    """:func:`layer_srr` of the current model on the first ``samples`` evaluation images (every process calls it)."""
    args = run.args
    count = min(samples, len(run.datasets.eval))
    subset = torch.utils.data.Subset(run.datasets.eval, range(count))
    # a private generator: iterating must not consume the global torch RNG (resume equality)
    loader = torch.utils.data.DataLoader(
        subset, batch_size=args.per_device_eval_batch_size, shuffle=False, generator=torch.Generator().manual_seed(0)
    )
    return layer_srr(
        run.unwrapped,
        loader,
        eps=args.srr_eps,
        lam=args.srr_lambda,
        batch_size=args.per_device_eval_batch_size,
        accelerator=run.accelerator,
        progress=progress,
    )


def record(run, epoch: int) -> dict:
    """Measure the current model on the tracking images (every process calls it); returns the record."""
    args, accelerator = run.args, run.accelerator
    report = _eval_report(run, args.track_srr_samples, progress=False)
    entry = {
        "step": run.completed_steps,
        "epoch": epoch,
        "num_samples": report.num_samples,
        "embeddings": report.embeddings["mean"] if report.embeddings else None,
    }
    for state in report.states:
        if state != "input":  # block l's input is block l-1's output: only its Rc (with U^l) differs
            entry[state] = {term: report.mean[state][term] for term in TERMS}
    run.srr_history.append(entry)
    if args.with_tracking:
        logs = {f"srr/layer_{ell}/{term}": entry["output"][term][ell - 1] for ell in report.layers for term in TERMS}
        logs.update({f"srr/embeddings/{term}": value for term, value in (entry["embeddings"] or {}).items()})
        accelerator.log(logs, step=run.completed_steps)
    if accelerator.is_main_process:
        write(run)
    return entry


def write(run) -> str:
    """``srr_history.json``: settings and every record so far (atomic replace)."""
    args = run.args
    path = os.path.join(args.output_dir, HISTORY_FILE)
    data = {
        "description": "per-layer SRR terms across training; layer l = output Z^l of block l (l = 1..L), "
        "embeddings = Z^0, mid = CRATE's Z^{l-1/2}; means over the first num_samples evaluation images",
        "every": args.track_srr_every,
        "eps": args.srr_eps,
        "lam": args.srr_lambda,
        "variant": architecture_name(run.config),
        "num_layers": run.config.num_hidden_layers,
        "layers": list(range(1, run.config.num_hidden_layers + 1)),
        "history": run.srr_history,
    }
    return write_json(path, data)


def layer_srr_step(run) -> dict:
    """``after_fit`` step: per-layer SRR of the trained model on evaluation images (all processes call it)."""
    from ..viz.srr import layer_srr_table, write_layer_srr

    args, accelerator = run.args, run.accelerator
    if not args.layer_srr_samples:
        return {}
    if run.fsdp:
        accelerator.print(
            "FSDP: skipping the per-layer SRR (parameters are sharded); run `hf-tdiag srr` on the saved model"
        )
        return {}
    report = _eval_report(run, args.layer_srr_samples, progress=not args.disable_tqdm)
    if accelerator.is_main_process:
        write_layer_srr(report, args.output_dir, title=f"{architecture_name(run.config)} on {run.raw.name}")
        accelerator.print(layer_srr_table(report))
    per_layer = report.per_layer("srr")  # block outputs Z^1..Z^L
    return {
        "layer_srr": per_layer,
        "layer_srr_embeddings": report.embeddings["mean"]["srr"] if report.embeddings else None,
        "layer_srr_samples": report.num_samples,
        "srr_mean_over_layers": float(sum(per_layer) / len(per_layer)),
    }


__all__ = ["HISTORY_FILE", "parse_every", "due", "record", "write", "layer_srr_step"]
