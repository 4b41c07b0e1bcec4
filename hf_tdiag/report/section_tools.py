"""What every report section uses: figures into a section (a drawing failure keeps the numbers), a skipped
section, the model's description, one forward pass over the report's inputs, and the sections' titles."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from hf_tdiag.loading import LoadedModel

from ..viz import figure_to_png
from .html import Figure, Section
from .options import ReportInputs

logger = logging.getLogger("hf_tdiag.report.report")


def _png(fig) -> bytes:
    return figure_to_png(fig)


def _add_figures(section: Section, make: Callable[[], list]) -> None:
    """Append the (caption, matplotlib figure) pairs from ``make()``; if drawing fails, keep the section's numbers
    and tables but mark it as an error naming the figure problem."""
    try:
        section.figures += [Figure(caption, _png(fig)) for caption, fig in make()]
    except Exception as err:  # noqa: BLE001 - a plotting failure must not lose the computed numbers
        logger.exception("report section %s: figure failed", section.key)
        section.status = "error"
        section.note = (section.note + " " if section.note else "") + (
            f"Drawing a figure failed ({type(err).__name__}: {err}); the numbers and tables are complete."
        )


def _skip(key: str, title: str, reason: str) -> Section:
    return Section(key, title, status="skipped", note=reason)


def _arch(loaded: LoadedModel):
    from hf_tdiag.probes.describe import describe

    return describe(loaded.model)


@torch.no_grad()
def _forward(loaded: LoadedModel, inputs: ReportInputs, output_attentions: bool = False, batch_size: int = 64):
    """Logits (and optionally the first sample's attentions) over the inputs, batch by batch."""
    from hf_tdiag.probes.token_states import forward_kwargs, model_device

    device = model_device(loaded.model)
    n = inputs.num_samples
    logits, first_attn = [], None
    for start in range(0, n, batch_size):
        if isinstance(inputs.batch, torch.Tensor):
            chunk = inputs.batch[start : start + batch_size]
        else:
            chunk = {k: v[start : start + batch_size] for k, v in inputs.batch.items() if isinstance(v, torch.Tensor)}
        kwargs = {k: v.to(device) for k, v in forward_kwargs(loaded.model, chunk).items()}
        out = loaded.model(**kwargs, output_attentions=output_attentions and start == 0)
        if getattr(out, "logits", None) is not None:
            logits.append(out.logits.float().cpu())
        if output_attentions and start == 0 and out.attentions:
            first_attn = torch.stack([a[0] for a in out.attentions]).float().cpu()
    return (torch.cat(logits) if logits else None), first_attn


_TITLES = {
    "summary": "Model and predictions",
    "srr": "Sparse rate reduction per layer",
    "schatten": "Generalization-bound proxies (spectrum-adaptive Schatten vs Edelman)",
    "concept_fidelity": "Concept fidelity",
    "attention_svm": "Attention maps and attention-as-SVM",
    "objective_ledger": "Objective ledger of the white-box blocks",
}
