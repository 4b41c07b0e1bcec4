"""Pieces of the Accelerate trainer for CRATE models.

``train(args_or_kwargs) -> dict`` runs a whole training job (see :mod:`hf_tdiag.training.loop`); the
command-line flags are in :mod:`hf_tdiag.training.args`. Submodules: ``data``, ``augment``, ``model``,
``optim``, ``regularizers``, ``checkpointing``, ``gap``, ``tracking``, ``model_card``, ``hub``.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "train": "hf_tdiag.training.loop:train",
    "build_parser": "hf_tdiag.training.args:build_parser",
    "make_args": "hf_tdiag.training.args:make_args",
    "build_model_card": "hf_tdiag.training.model_card:build_model_card",
    "publish": "hf_tdiag.training.hub:publish",
    "generalization_gap": "hf_tdiag.training.gap:generalization_gap",
}


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'hf_tdiag.training' has no attribute {name!r}")
    module_name, attr = target.split(":")
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


__all__ = list(_LAZY)
