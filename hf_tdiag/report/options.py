"""What a report is built from: its inputs (:class:`ReportInputs`) and its settings (:class:`ReportOptions`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .._cli_args import NUM_CONCEPTS
from .._defaults import DEFAULT_L_PHI


@dataclass
class ReportInputs:
    """The inputs every section shares: model inputs, optional labels, and images for display."""

    batch: Any  # pixel_values tensor (images) or a tokenizer's dict batch (texts)
    labels: torch.Tensor | None = None
    images: list | None = None  # PIL images, same order as batch (vision models)
    description: str = ""
    texts: list | None = None  # the raw texts, same order as batch (text models)

    @property
    def num_samples(self) -> int:
        if isinstance(self.batch, torch.Tensor):
            return int(self.batch.shape[0])
        return int(next(v for v in self.batch.values() if isinstance(v, torch.Tensor)).shape[0])


@dataclass
class ReportOptions:
    """Settings of every section (shown in the report and saved in the JSON)."""

    srr_source: str = "query"
    srr_eps: float = 0.1
    srr_lam: float = 1.0
    concept_layer: int | None = None  # default: middle layer
    n_concepts: int = NUM_CONCEPTS
    concept_power_iters: int = 10  # power iterations per Lipschitz estimate of the bound's constants
    concept_constant_images: int = 8  # images used to estimate L_block and alpha
    attention_layer: int | None = None  # block number 1..L; default: the last block
    attention_head: int = 0
    max_svm_samples: int = 16
    L_phi: float = DEFAULT_L_PHI

    def to_dict(self) -> dict:
        return dict(self.__dict__)
