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

    def check(self, model, sections=None, names: dict[str, str] | None = None) -> None:
        """Before any section runs: the layer, head and concept count fit ``model`` (a block number 0..L for the
        concept layer, 1..L for the attention layer, a head 0..H-1, at most d concepts of d-dimensional tokens), for
        the sections that use them (``sections``: None for all). ``names``: how the error calls each field (the
        command line's flags); a ValueError names it, the value and the range."""
        from .._validation import block_number, integer
        from ..probes.describe import describe

        names = names or {}
        wanted = set(sections) if sections is not None else {"concept_fidelity", "attention_svm"}
        if not wanted & {"concept_fidelity", "attention_svm"}:
            return
        try:
            arch = describe(model)
        except (ValueError, TypeError, NotImplementedError):
            return  # an architecture the probes do not read: its sections say so themselves
        if "concept_fidelity" in wanted:
            name = names.get("concept_layer", "concept_layer")
            if self.concept_layer is not None:
                block_number(self.concept_layer, arch.num_layers, name, embeddings=True)
            name = names.get("n_concepts", "n_concepts")
            if integer(self.n_concepts, name, low=1) > arch.hidden_size:
                raise ValueError(
                    f"{name}: expected at most {arch.hidden_size} concepts (the model's {arch.hidden_size}-dimensional "
                    f"tokens), got {self.n_concepts}"
                )
        if "attention_svm" in wanted:
            if self.attention_layer is not None:
                block_number(self.attention_layer, arch.num_layers, names.get("attention_layer", "attention_layer"))
            integer(self.attention_head, names.get("attention_head", "attention_head"), low=0, high=arch.num_heads)
