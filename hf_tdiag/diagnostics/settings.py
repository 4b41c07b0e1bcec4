"""One settings object per diagnostic: the single home of its defaults, their help text and their validation.

Each is a frozen dataclass, validated when built (a bad value raises a one-line ``ValueError`` naming the field).
The diagnostics take one (``layer_srr(model, x, settings=SRRSettings(lam=0.5))``) or the same names as keyword
arguments; the command line (:func:`hf_tdiag._cli_args.add_settings_flags`), the evaluate modules and the Space
read their defaults and help from here. Torch-free, so ``hf-tdiag --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from .._defaults import DEFAULT_L_PHI, DEFAULT_RANK_TOL
from .._validation import (
    finite_float,
    integer,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    real,
)


def _setting(default, help: str, **metadata):
    """A dataclass field with its help text (``metadata["help"]``; ``choices`` where the values are a fixed set)."""
    return field(default=default, metadata={"help": help, **metadata})


def _choice(settings, name: str) -> None:
    value, choices = getattr(settings, name), settings.field_metadata(name)["choices"]
    if value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")


class _Settings:
    """Shared behaviour: ``field_metadata``, ``defaults()``, ``replace(**changes)`` and ``to_dict()``."""

    @classmethod
    def field_metadata(cls, name: str) -> dict[str, Any]:
        """The help text (and choices) of field ``name``."""
        return dict(cls.__dataclass_fields__[name].metadata)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every field's default, by name."""
        return {f.name: f.default for f in dataclasses.fields(cls)}

    def replace(self, **changes):
        """A copy with ``changes`` applied (and validated)."""
        unknown = sorted(set(changes) - set(self.__dataclass_fields__))
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown setting(s) {unknown}; known: {sorted(self.defaults())}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SRRSettings(_Settings):
    """Sparse rate reduction per layer (:func:`hf_tdiag.layer_srr`).

    Examples:
        >>> from hf_tdiag import SRRSettings
        >>> s = SRRSettings(eps=0.2)
        >>> s.eps, s.lam, s.replace(lam=0.5).lam, s.lam
        (0.2, 1.0, 0.5, 1.0)
        >>> SRRSettings(eps=0)
        Traceback (most recent call last):
            ...
        ValueError: eps: expected a finite number > 0, got 0
    """

    source: str = _setting(
        "query", "the projection whose per-head weights give U for non-CRATE models", choices=("query", "key", "value")
    )
    eps: float = _setting(0.1, "ε of the coding rates R and Rᶜ")
    lam: float = _setting(1.0, "λ, the weight of the sparsity term in Rᶜ − R + λ‖Z‖₀")
    apply_layernorm: bool = _setting(False, "measure LN(Z) with each block's pre-attention LayerNorm")
    include_mid: bool = _setting(True, "CRATE: also measure the states Z^{ℓ−½} after the attention step")
    batch_size: int = _setting(32, "inputs per forward pass")
    max_batches: int | None = _setting(None, "stop after this many batches (None: all)")
    reuse_projections: bool = _setting(True, "compute each block's projections once for all states")
    measurement: str = _setting(
        "design",
        "design: layer l = output Z^l of block l with U^l; official: the official CRATE hooks (Rc of each block's "
        "qkv output with unit-norm tokens per head, sparsity at the ISTA output)",
        choices=("design", "official"),
    )
    precision: str = _setting(
        "auto",
        "auto: float32 Gram matrices where a condition check keeps them within 1e-6 of float64; float64: every Gram "
        "matrix in float64",
        choices=("auto", "float64"),
    )

    def __post_init__(self):
        for name in ("source", "measurement", "precision"):
            _choice(self, name)
        eps = positive_float(self.eps, "eps")
        if not 0.0 < eps * eps < math.inf:  # the rates divide by ε²
            raise ValueError(
                f"eps: expected a value whose square is a positive finite float (about 1e-150 to 1e150), got {eps!r}"
            )
        finite_float(self.lam, "lam")
        positive_int(self.batch_size, "batch_size")
        positive_int(self.max_batches, "max_batches", allow_none=True)
        if self.measurement == "official" and self.apply_layernorm:
            raise ValueError(
                "apply_layernorm: the official measurement fixes its states (qkv output of LN1(Z)); pass False"
            )


@dataclass(frozen=True)
class SchattenSettings(_Settings):
    """Spectrum-adaptive Schatten and Edelman bound proxies (:func:`hf_tdiag.spectrum_bounds`).

    Examples:
        >>> from hf_tdiag import SchattenSettings
        >>> SchattenSettings().L_phi, SchattenSettings(p_grid_m=8).p_grid_m
        (1.13, 8)
        >>> SchattenSettings(svd_method="qr")
        Traceback (most recent call last):
            ...
        ValueError: svd_method: expected one of ['auto', 'svd'], got 'qr'
    """

    L_phi: float = _setting(DEFAULT_L_PHI, "Lipschitz constant of the activation (GELU: 1.13)")
    p_grid_m: int | None = _setting(None, "resolution m of the p grid {0, 1/m, …, 2} (None: ⌈L + ln N⌉)")
    rank_tol: float = _setting(
        DEFAULT_RANK_TOL, "singular values ≤ rank_tol · min(rows, cols) · max(σ₁, 1) are exact zeros"
    )
    svd_method: str = _setting(
        "auto", "how the FFN spectra are computed: the fastest exact route, or a dense SVD", choices=("auto", "svd")
    )
    num_workers: int | None = _setting(None, "threads solving spectra side by side (None: chosen per device)")
    streaming: bool = _setting(False, "read a checkpoint folder shard by shard instead of loading the model")

    def __post_init__(self):
        _choice(self, "svd_method")
        positive_float(self.L_phi, "L_phi")
        positive_int(self.p_grid_m, "p_grid_m", allow_none=True)
        real(self.rank_tol, "rank_tol", low=0, high=1, high_open=True)
        positive_int(self.num_workers, "num_workers", allow_none=True)


@dataclass(frozen=True)
class ConceptSettings(_Settings):
    """Semi-NMF concept fidelity with its KL bound (:func:`hf_tdiag.concept_fidelity`).

    Examples:
        >>> from hf_tdiag import ConceptSettings
        >>> ConceptSettings().n_concepts, ConceptSettings(n_concepts=4).replace(bounds=False).to_dict()["bounds"]
        (8, False)
    """

    n_concepts: int = _setting(8, "Semi-NMF concepts k fitted on the layer's token activations")
    bounds: bool = _setting(True, "compute the certified and estimated KL bounds")
    max_tokens: int | None = _setting(None, "texts: cut every text to this many tokens (None: the shortest text's)")
    n_clusters: int = _setting(4, "texts without labels: k-means pseudo-labels the linear head is fitted on")
    power_iters: int = _setting(20, "power-iteration steps of the Jacobian norm estimates")
    max_images_for_constants: int = _setting(32, "inputs the Jacobian estimates of the constants use")
    batch_size: int = _setting(64, "inputs per forward pass")

    def __post_init__(self):
        positive_int(self.n_concepts, "n_concepts")
        positive_int(self.max_tokens, "max_tokens", allow_none=True)
        positive_int(self.n_clusters, "n_clusters")
        positive_int(self.power_iters, "power_iters")
        positive_int(self.max_images_for_constants, "max_images_for_constants")
        positive_int(self.batch_size, "batch_size")


@dataclass(frozen=True)
class AttentionSVMSettings(_Settings):
    """Attention as a max-margin SVM (:func:`hf_tdiag.attention_svm_diagnostic`).

    Examples:
        >>> from hf_tdiag import AttentionSVMSettings
        >>> AttentionSVMSettings().norm, AttentionSVMSettings(max_queries=16).max_queries
        ('fro', 16)
        >>> AttentionSVMSettings(norm="l1")
        Traceback (most recent call last):
            ...
        ValueError: norm: expected one of ['fro', 'nuc'], got 'l1'
    """

    max_queries: int | None = _setting(64, "queries sampled for the SVM (None or 0: every query)")
    one_hot_threshold: float = _setting(0.9, "a query's attention is one-hot when its largest probability is ≥ this")
    norm: str = _setting("fro", "the norm ‖W‖ the SVM minimizes", choices=("fro", "nuc"))
    include_bias: bool | None = _setting(None, "augment queries with the query bias (None: when the head has one)")
    seed: int = _setting(0, "seed of the query sample")
    tol: float = _setting(1e-10, "solver tolerance")

    def __post_init__(self):
        _choice(self, "norm")
        non_negative_int(self.max_queries, "max_queries", allow_none=True, none_means=" (None or 0: every query)")
        threshold = self.one_hot_threshold
        if not (isinstance(threshold, (int, float)) and not isinstance(threshold, bool) and 0 < threshold <= 1):
            raise ValueError(f"one_hot_threshold: expected a number in (0, 1], got {threshold!r}")
        integer(self.seed, "seed")
        non_negative_float(self.tol, "tol")


def resolve(cls, settings, **given):
    """The settings a diagnostic runs with: ``settings`` (an instance of ``cls``, or None for the defaults) with
    every keyword in ``given`` that differs from its default applied on top; validated once."""
    if settings is not None and not isinstance(settings, cls):
        raise TypeError(f"settings: expected a {cls.__name__}, got {type(settings).__name__}")
    defaults = cls.defaults()
    changes = {k: v for k, v in given.items() if settings is None or not _same(v, defaults[k])}
    return cls(**changes) if settings is None else settings.replace(**changes)


def _same(a, b) -> bool:
    return a is b or (type(a) is type(b) and a == b)


__all__ = ["SRRSettings", "SchattenSettings", "ConceptSettings", "AttentionSVMSettings", "resolve"]
