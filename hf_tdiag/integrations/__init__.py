"""Hooks for ``transformers.Trainer``: per-layer SRR tracking and the SRR regulariser.

* :class:`SRRCallback` (:mod:`.srr_callback`) measures :func:`hf_tdiag.layer_srr` on a fixed evaluation subset
  every N steps and at each evaluation, logs the scalars through ``Trainer.log`` (so every ``report_to`` backend
  receives them) and writes the per-layer history beside the checkpoints;
* :class:`SRRTrainer` (:mod:`.srr_trainer`) trains with ``CE + β·SRR(Z^ℓ; U^ℓ)``, the loss of the project's own
  loop (:func:`hf_tdiag.training.loop.compute_loss`), and attaches any :class:`SRRCallback` it is given;
* :func:`readable_weights` (:mod:`.big_model`) keeps the weights of a model dispatched with Accelerate's big-model
  inference (``device_map`` with CPU/disk offload) readable on the CPU for code of your own; the diagnostics take
  such a model as it is (:mod:`hf_tdiag.probes.offload`).
"""

from __future__ import annotations

from .._lazy import lazy_exports as _lazy_exports

_LAZY = {
    "SRRCallback": "hf_tdiag.integrations.srr_callback:SRRCallback",
    "SRRTrainer": "hf_tdiag.integrations.srr_trainer:SRRTrainer",
    "readable_weights": "hf_tdiag.integrations.big_model:readable_weights",
}

__getattr__ = _lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
