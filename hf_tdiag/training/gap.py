"""Evaluation in eval mode and the generalization gap (Hu, Zou & Xu 2024, Sec. 6).

``generalization gap = validation loss − training loss``, both the mean
cross-entropy of the trained model in eval mode (no dropout, no augmentation),
the training loss over the *full* training set.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._caller_state import module_modes, restore_modes
from .._progress import tqdm
from .._validation import finite_float


@torch.no_grad()
def evaluate_classifier(model, dataloader, accelerator=None, desc: str = "eval", disable_tqdm: bool = False) -> dict:
    """Mean cross-entropy, accuracy and sample count of ``model`` over ``dataloader``.

    With an ``accelerate.Accelerator`` and a prepared dataloader, per-sample losses and predictions are gathered
    with ``gather_for_metrics`` so every sample counts once however many processes share the data.
    """
    saved_modes = module_modes(model)
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    show = not disable_tqdm and (accelerator is None or accelerator.is_local_main_process)
    try:
        for batch in tqdm(dataloader, desc=desc, leave=False, disable=not show):
            logits = model(pixel_values=batch["pixel_values"]).logits
            labels = batch["labels"]
            losses = F.cross_entropy(logits.float(), labels, reduction="none")
            hits = (logits.argmax(-1) == labels).long()
            if accelerator is not None:
                losses, hits = accelerator.gather_for_metrics((losses, hits))
            total_loss += float(losses.double().sum())
            correct += int(hits.sum())
            count += int(hits.numel())
    finally:
        restore_modes(saved_modes)
    if count == 0:
        raise ValueError("dataloader: no samples to evaluate")
    return {"loss": total_loss / count, "accuracy": correct / count, "samples": count}


def generalization_gap(val_loss: float, train_loss: float) -> float:
    """``gap = L_val − L_train`` (eval-mode mean cross-entropies)."""
    return finite_float(val_loss, "val_loss") - finite_float(train_loss, "train_loss")


__all__ = ["evaluate_classifier", "generalization_gap"]
