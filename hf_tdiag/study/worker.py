"""One run of a study, as a worker executes it: train, measure on the training data, write the record.

A run is described by a *spec*, a plain dict that crosses process boundaries:
``key``, ``hparams``, ``fixed``, ``settings`` (a :class:`MeasureSettings` as a dict),
``study_dir``, ``train_fn`` (``"module:function"`` or ``None`` for the default
trainer), ``keep_models`` and optionally ``threads``.
"""

from __future__ import annotations

import importlib
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any

from .cache import STUDY_VERSION, record_path, write_json_atomic
from .measures import MeasureSettings, compute_measures

__all__ = ["default_train", "load_trained", "examples_tensors", "execute"]

_CONFIG_FIELDS = (
    "model_type",
    "variant",
    "image_size",
    "patch_size",
    "num_channels",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "pooling",
    "hidden_dropout_prob",
)


def _import_callable(path: str) -> Callable:
    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"train_fn: expected 'module:function', got {path!r}")
    return getattr(importlib.import_module(module), attr)


def _trainer_kwargs(hparams: Mapping[str, Any], fixed: Mapping[str, Any]) -> dict:
    kwargs = {
        "disable_tqdm": True,
        "layer_srr_samples": 0,
        "checkpointing_steps": "epoch",
        "checkpoints_total_limit": 1,
        # a run's folder is named by its key: what an earlier, interrupted attempt left there is this run's own
        "overwrite_output_dir": True,
    }
    kwargs.update(fixed)
    kwargs.update(hparams)
    if kwargs.get("checkpointing_steps") is not None:
        kwargs.setdefault("resume_from_checkpoint", "latest")
    return kwargs


def load_trained(
    hparams: Mapping[str, Any], fixed: Mapping[str, Any], output_dir: str, max_examples: int | None = None
):
    """A trained run's ``(model, training examples)``: the examples are the first ``max_examples`` of the training
    split, preprocessed as the trainer's train-set evaluation sees them (no augmentation)."""
    from transformers import AutoModelForImageClassification

    from ..loading import load_image_processor, load_pretrained
    from ..training.args import make_args
    from ..training.data import build_datasets, load_raw_data
    from ..training.model import image_size_of

    model = load_pretrained(output_dir, AutoModelForImageClassification, name="output_dir")
    processor = load_image_processor(output_dir)
    args = make_args(output_dir=output_dir, **_trainer_kwargs(hparams, fixed))
    if max_examples:
        args.max_train_samples = min(args.max_train_samples or max_examples, max_examples)
        args.max_eval_samples = 1  # only the training examples are needed
    raw = load_raw_data(args)
    data = build_datasets(args, raw, processor, model.config.num_channels, image_size_of(model.config))
    return model, data.train_eval


def default_train(
    hparams: Mapping[str, Any], fixed: Mapping[str, Any], output_dir: str, max_examples: int | None = None
):
    """Train one run with :func:`hf_tdiag.training.train`; return ``(results, model, training examples)``.

    The run checkpoints every epoch and resumes from its latest checkpoint, so a
    study killed in the middle of a training continues that training too.
    """
    from ..training import train

    results = train(output_dir=output_dir, **_trainer_kwargs(hparams, fixed))
    model, examples = load_trained(hparams, fixed, output_dir, max_examples=max_examples)
    return results, model, examples


def examples_tensors(train_examples, n: int):
    """First ``n`` training examples as ``(pixel_values, labels)`` tensors."""
    import torch

    if isinstance(train_examples, (tuple, list)) and len(train_examples) == 2:
        x, y = train_examples
        return x[:n], y[:n]
    count = min(n, len(train_examples))
    items = [train_examples[i] for i in range(count)]
    return torch.stack([it["pixel_values"] for it in items]), torch.stack(
        [torch.as_tensor(it["labels"]) for it in items]
    )


def _train_summary(results: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar training results, non-finite floats as ``None`` (JSON has no NaN)."""
    out = {k: v for k, v in results.items() if isinstance(v, (int, float, str, bool)) or v is None}
    for k, v in out.items():
        if isinstance(v, float) and not math.isfinite(v):
            out[k] = None
    return out


def execute(spec: dict) -> dict:
    """Train, measure and cache one run (in the calling process; executors call it in their workers)."""
    import torch

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    t0 = time.time()
    train_fn = _import_callable(spec["train_fn"]) if spec.get("train_fn") else default_train
    work_dir = os.path.join(spec["study_dir"], "work", spec["key"])
    settings = MeasureSettings(**spec["settings"])
    results, model, train_examples = train_fn(
        spec["hparams"], spec["fixed"], work_dir, max_examples=settings.max_examples
    )
    train_seconds = time.time() - t0
    pixel_values, labels = examples_tensors(train_examples, settings.max_examples)
    details: dict = {}
    values, errors = compute_measures(model, pixel_values, labels, settings, details=details)
    per_layer = values.pop("_srr_per_layer", None)
    record = {
        "key": spec["key"],
        "version": STUDY_VERSION,
        "hparams": spec["hparams"],
        "fixed": spec["fixed"],
        "train": _train_summary(results),
        "measures": values,
        "measure_errors": errors,
        "measure_details": details,
        "srr_per_layer": per_layer,
        "model_config": {k: getattr(model.config, k, None) for k in _CONFIG_FIELDS},
        "seconds": {"train": round(train_seconds, 3), "total": round(time.time() - t0, 3)},
    }
    write_json_atomic(record_path(spec["study_dir"], spec["key"]), record)
    if not spec.get("keep_models"):
        shutil.rmtree(work_dir, ignore_errors=True)
    return record
