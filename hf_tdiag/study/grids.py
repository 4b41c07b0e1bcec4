"""The study's grids: which hyperparameters vary (axes) and which trainer settings are shared (fixed)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StudyGrid", "GRIDS", "resolve_grid"]


@dataclass
class StudyGrid:
    """A grid of training runs: ``axes`` are varied (cartesian product), ``fixed`` trainer settings are shared."""

    name: str
    axes: dict[str, list]
    fixed: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def __post_init__(self):
        if not isinstance(self.axes, Mapping) or not self.axes:
            raise ValueError(f"axes: expected a non-empty mapping axis -> list of values, got {self.axes!r}")
        for k, v in self.axes.items():
            if not isinstance(v, (list, tuple)) or len(v) == 0:
                raise ValueError(f"axes[{k!r}]: expected a non-empty list of values, got {v!r}")
            if len(set(map(json.dumps, v))) != len(v):
                raise ValueError(f"axes[{k!r}]: values must be distinct, got {v!r}")
        overlap = set(self.axes) & set(self.fixed)
        if overlap:
            raise ValueError(f"fixed: keys {sorted(overlap)} are also grid axes")

    def runs(self) -> list[dict[str, Any]]:
        """Every combination of axis values, as a dict per run (in a fixed order)."""
        keys = list(self.axes)
        return [dict(zip(keys, values)) for values in itertools.product(*(self.axes[k] for k in keys))]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "axes": dict(self.axes), "fixed": dict(self.fixed), "description": self.description}


_VARIANTS = ["crate", "crate-c", "crate-n", "crate-t"]


def _cifar_grid(dataset: str, classes: int) -> StudyGrid:
    """Hu et al.'s setting on GPUs: CRATE-Tiny's shape (12 layers, width 384, 6 heads) at 32 px, 4 px patches."""
    return StudyGrid(
        name=dataset,
        description=(
            f"Hu et al.'s setting on GPUs: {dataset.upper()} ({classes} classes) at 32 px with CRATE-Tiny's shape "
            "(12 layers, width 384, 6 heads; 4 px patches, 64 tokens + CLS); 4 variants x 3 batch sizes x 3 learning "
            f"rates x 3 weight decays = 108 runs, each to training loss 0.01 (needs the Hub dataset {dataset!r})."
        ),
        axes={
            "variant": list(_VARIANTS),
            "per_device_train_batch_size": [64, 128, 256],
            "learning_rate": [1e-4, 3e-4, 1e-3],
            "weight_decay": [0.0, 0.05, 0.1],
        },
        fixed={
            "preset": "crate-tiny",
            "image_size": 32,
            "patch_size": 4,
            "dataset_name": dataset,
            "stop_at_train_loss": 0.01,
            "num_train_epochs": 200,
            "mixed_precision": "bf16",
            "seed": 0,
        },
    )


GRIDS: dict[str, StudyGrid] = {
    "digits": StudyGrid(
        name="digits",
        description=(
            "CRATE family on scikit-learn's 8x8 digits (embedded, offline): 12-layer CRATEs (Hu et al.'s depth) "
            "of width 32, 2 heads; 4 variants x 2 batch sizes x 2 learning rates x 2 weight decays = 32 runs."
        ),
        axes={
            "variant": list(_VARIANTS),
            "per_device_train_batch_size": [32, 128],
            "learning_rate": [1e-3, 3e-3],
            "weight_decay": [0.0, 0.1],
        },
        fixed={
            "preset": "crate-digits",
            # Hu et al.'s depth (CRATE-Tiny's 12 layers) at a width that keeps the study on 2 CPU cores
            "num_hidden_layers": 12,
            "hidden_size": 32,
            "num_attention_heads": 2,
            # the trainer's digits recipe, pinned so the cache never outlives a change of its defaults
            "image_size": 16,
            "patch_size": 4,
            "pooling": "mean",
            "stop_at_train_loss": 0.01,
            "num_train_epochs": 100,
            "seed": 0,
        },
    ),
    "tiny": StudyGrid(
        name="tiny",
        description="2x2 smoke grid (seconds): two variants x two learning rates, a very small CRATE, few steps.",
        axes={"variant": ["crate", "crate-c"], "learning_rate": [3e-3, 1e-2]},
        fixed={
            "preset": "crate-digits",
            "image_size": 16,
            "patch_size": 4,
            "pooling": "mean",
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "stop_at_train_loss": 0.01,
            "max_train_steps": 80,
            "per_device_train_batch_size": 64,
            "seed": 0,
        },
    ),
    "cifar10": _cifar_grid("cifar10", 10),
    "cifar100": _cifar_grid("cifar100", 100),
}


def resolve_grid(grid: StudyGrid | str) -> StudyGrid:
    """A :class:`StudyGrid` itself, or the one of :data:`GRIDS` with that name."""
    if isinstance(grid, str):
        if grid not in GRIDS:
            raise ValueError(f"grid: unknown grid {grid!r}; available: {sorted(GRIDS)}")
        grid = GRIDS[grid]
    if not isinstance(grid, StudyGrid):
        raise TypeError(f"grid: expected a StudyGrid or a grid name, got {type(grid).__name__}")
    return grid
