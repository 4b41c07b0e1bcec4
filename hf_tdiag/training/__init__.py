"""Pieces of the Accelerate trainer for CRATE models.

``train(args_or_kwargs) -> dict`` runs a whole training job (see :mod:`hf_tdiag.training.loop`); the
command-line flags are in :mod:`hf_tdiag.training.args`. Submodules: ``outcome`` (the finish), ``data``, ``augment``, ``model``,
``optim``, ``regularizers``, ``checkpointing``, ``gap``, ``tracking``, ``model_card``, ``hub``.
"""

from __future__ import annotations

from .._lazy import lazy_exports as _lazy_exports

_LAZY = {
    "train": "hf_tdiag.training.loop:train",
    "build_parser": "hf_tdiag.training.args:build_parser",
    "make_args": "hf_tdiag.training.args:make_args",
    "build_model_card": "hf_tdiag.training.model_card:build_model_card",
    "publish": "hf_tdiag.training.hub:publish",
    "generalization_gap": "hf_tdiag.training.gap:generalization_gap",
}


__getattr__ = _lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
