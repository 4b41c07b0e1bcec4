"""One settings class per diagnostic: the single declaration of its options.

Each field is declared once with :func:`setting`: its default and type (the annotation), its help text, its
constraint (``choices`` or a :class:`Bounds`), and how the surfaces show it (``flag``/``aliases``/``cli`` for the
command line, ``space`` for the Gradio Space). Everything else is derived from these fields: the validation (a bad
value raises a one-line ``ValueError`` naming the field, when the object is built), the command-line flags
(:func:`hf_tdiag._cli_args.add_settings_flags`), the keywords the diagnostic function and its evaluate module accept
(:mod:`hf_tdiag.diagnostics.registry`), the Space's controls and the docs' settings tables.

A diagnostic takes one object, keywords, or both: ``layer_srr(model, x, settings=SRRSettings(lam=0.5), eps=0.2)``
runs with ``lam=0.5, eps=0.2`` — every keyword given replaces the object's value (:func:`resolve`). Torch-free, so
``hf-tdiag --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._defaults import DEFAULT_L_PHI, DEFAULT_RANK_TOL
from .._validation import ArgumentTypeError, _int_words, _real_words, integer, real


@dataclass(frozen=True)
class Bounds:
    """A numeric field's constraint: an integer (``kind="int"``) or a finite real in ``[low, high]`` (ends open where
    ``low_open``/``high_open``; an integer's ``high`` is exclusive), checked by :mod:`hf_tdiag._validation`."""

    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def check(self, value, name: str, allow_none: bool = False, none_means: str = ""):
        """``value`` if it satisfies the bounds, else a one-line ValueError/TypeError naming ``name``."""
        if self.kind == "int":
            return integer(value, name, low=self.low, high=self.high, allow_none=allow_none, none_means=none_means)
        return real(value, name, low=self.low, high=self.high, low_open=self.low_open, high_open=self.high_open,
                    allow_none=allow_none)  # fmt: skip

    def words(self) -> str:
        """The constraint in words (``"a positive integer"``, ``"a finite number > 0"``)."""
        if self.kind == "int":
            return _int_words(self.low, self.high)
        return _real_words(self.low, self.high, self.low_open, self.high_open)


POSITIVE_INT = Bounds("int", low=1)
NON_NEGATIVE_INT = Bounds("int", low=0)
INTEGER = Bounds("int")
POSITIVE = Bounds("real", low=0, low_open=True)
NON_NEGATIVE = Bounds("real", low=0)
FINITE = Bounds("real")


def setting(
    default,
    help: str,
    *,
    choices: tuple | None = None,
    bounds: Bounds | None = None,
    none_means: str = "",
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    cli: bool = True,
    space: dict | None = None,
):
    """A settings field: ``default`` and ``help``; its constraint (``choices`` or ``bounds``; ``none_means`` says
    what ``None`` stands for where the type allows it); its command-line ``flag`` (default ``--<name>``, or
    ``--no-<name>`` for a switch that defaults to True) with old ``aliases``, or ``cli=False`` to keep it off the
    command line; ``space``: shown in the Space with these Gradio widget options (``label``, and ``minimum``,
    ``maximum``, ``step`` for a slider)."""
    metadata = {"help": help, "choices": choices, "bounds": bounds, "none_means": none_means, "flag": flag,
                "aliases": tuple(aliases), "cli": cli, "space": space}  # fmt: skip
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Field:
    """One declared setting, as the surfaces read it."""

    name: str
    default: Any
    type: type  # bool, int, float or str (the annotation without None)
    optional: bool  # None is allowed
    help: str
    choices: tuple | None
    bounds: Bounds | None
    none_means: str
    flag: str | None
    aliases: tuple[str, ...]
    cli: bool
    space: dict | None

    def constraint(self) -> str:
        """The accepted values in words (the docs' table and error messages)."""
        if self.choices is not None:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.bounds is not None:
            text = self.bounds.words()
        elif self.type is bool:
            text = "True or False"
        else:
            text = self.type.__name__
        return text + (f", or None{self.none_means}" if self.optional else "")

    def check(self, value):
        """``value`` validated (one-line error naming the field)."""
        if value is None and self.optional:
            return None
        if self.choices is not None:
            if value not in self.choices:
                raise ValueError(f"{self.name}: expected one of {list(self.choices)}, got {value!r}")
            return value
        if self.bounds is not None:
            return self.bounds.check(value, self.name, allow_none=self.optional, none_means=self.none_means)
        if self.type is bool and not isinstance(value, bool):
            raise ArgumentTypeError(f"{self.name}: expected True or False, got {value!r}")
        return value


def _base_type(annotation) -> tuple[type, bool]:
    """``int | None`` -> ``(int, True)``; ``float`` -> ``(float, False)``."""
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    if args:
        kinds = [a for a in args if a is not type(None)]
        return kinds[0], len(kinds) < len(args)
    return annotation, False


def _declared_fields(cls) -> tuple[Field, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(Field(f.name, f.default, *_base_type(hints[f.name]), **f.metadata) for f in dataclasses.fields(cls))


class _Settings:
    """What every settings class shares: per-field validation from the declaration, ``fields()``,
    ``defaults()``, ``replace(**changes)``, ``to_dict()``."""

    #: the diagnostic's name in :mod:`hf_tdiag.diagnostics.registry` (set by each class)
    diagnostic: ClassVar[str] = ""

    def __post_init__(self):
        for f in self.fields():
            object.__setattr__(self, f.name, f.check(getattr(self, f.name)))
        self._check_together()

    def _check_together(self) -> None:
        """Constraints between fields (none by default)."""

    @classmethod
    def fields(cls) -> tuple[Field, ...]:
        """The declared fields, in order."""
        return _declared_fields(cls)

    @classmethod
    def field(cls, name: str) -> Field:
        """The declared field ``name``."""
        for f in cls.fields():
            if f.name == name:
                return f
        raise KeyError(f"{cls.__name__}: no setting {name!r}; known: {[f.name for f in cls.fields()]}")

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

    diagnostic: ClassVar[str] = "srr"

    source: str = setting(
        "query", "the projection whose per-head weights give U for non-CRATE models", choices=("query", "key", "value")
    )
    eps: float = setting(0.1, "ε of the coding rates R and Rᶜ", bounds=POSITIVE)
    lam: float = setting(1.0, "λ, the weight of the sparsity term in Rᶜ − R + λ‖Z‖₀", bounds=FINITE,
                         aliases=("--srr-lambda",))  # fmt: skip
    apply_layernorm: bool = setting(False, "measure LN(Z) with each block's pre-attention LayerNorm",
                                    flag="--layernorm", aliases=("--apply-layernorm",))  # fmt: skip
    include_mid: bool = setting(True, "CRATE: also measure the states Z^{ℓ−½} after the attention step",
                                flag="--no-mid")  # fmt: skip
    batch_size: int = setting(32, "inputs per forward pass", bounds=POSITIVE_INT)
    max_batches: int | None = setting(None, "stop after this many batches", bounds=POSITIVE_INT,
                                      none_means=" (all)", cli=False)  # fmt: skip
    reuse_projections: bool = setting(True, "compute each block's projections once for all states", cli=False)
    measurement: str = setting(
        "design",
        "design: layer l = output Z^l of block l with U^l; official: the official CRATE hooks (Rc of each block's "
        "qkv output with unit-norm tokens per head, sparsity at the ISTA output)",
        choices=("design", "official"),
    )
    precision: str = setting(
        "auto",
        "auto: float32 Gram matrices where a condition check keeps them within 1e-6 of float64; float64: every Gram "
        "matrix in float64",
        choices=("auto", "float64"),
    )

    def _check_together(self) -> None:
        if not 0.0 < self.eps * self.eps < math.inf:  # the rates divide by ε²
            raise ValueError(
                f"eps: expected a value whose square is a positive finite float (about 1e-150 to 1e150), got {self.eps!r}"
            )
        if self.measurement == "official" and self.apply_layernorm:
            raise ValueError(
                "apply_layernorm: the official measurement fixes its states (qkv output of LN1(Z)); pass False"
            )


@dataclass(frozen=True)
class SchattenSettings(_Settings):
    """Spectrum-adaptive Schatten and Edelman bound proxies (:func:`hf_tdiag.schatten_bounds`).

    Examples:
        >>> from hf_tdiag import SchattenSettings
        >>> SchattenSettings().L_phi, SchattenSettings(p_grid_m=8).p_grid_m
        (1.13, 8)
        >>> SchattenSettings(svd_method="qr")
        Traceback (most recent call last):
            ...
        ValueError: svd_method: expected one of ['auto', 'svd'], got 'qr'
    """

    diagnostic: ClassVar[str] = "schatten"

    L_phi: float = setting(DEFAULT_L_PHI, "Lipschitz constant of the FFN activation (GELU: 1.13)", bounds=POSITIVE,
                           flag="--l-phi", aliases=("--L-phi",),
                           space={"label": f"L_φ (Lipschitz constant of the FFN activation; GELU {DEFAULT_L_PHI})"})  # fmt: skip
    p_grid_m: int | None = setting(None, "resolution m of the p grid {0, 1/m, …, 2}", bounds=POSITIVE_INT,
                                   none_means=" (⌈L + ln N⌉)")  # fmt: skip
    rank_tol: float = setting(
        DEFAULT_RANK_TOL,
        "singular values ≤ rank_tol · min(rows, cols) · max(σ₁, 1) are exact zeros",
        bounds=Bounds("real", low=0, high=1, high_open=True),
    )
    svd_method: str = setting(
        "auto", "how the FFN spectra are computed: the fastest exact route, or a dense SVD", choices=("auto", "svd")
    )
    num_workers: int | None = setting(None, "threads solving spectra side by side", bounds=POSITIVE_INT,
                                      none_means=" (chosen per device)", aliases=("--workers",))  # fmt: skip
    streaming: bool = setting(False, "read a checkpoint folder shard by shard instead of loading the model")


@dataclass(frozen=True)
class ConceptFidelitySettings(_Settings):
    """Semi-NMF concept fidelity with its KL bound (:func:`hf_tdiag.concept_fidelity`).

    Examples:
        >>> from hf_tdiag import ConceptFidelitySettings
        >>> ConceptFidelitySettings().n_concepts, ConceptFidelitySettings(n_concepts=4).replace(bounds=False).to_dict()["bounds"]
        (8, False)
    """

    diagnostic: ClassVar[str] = "concept_fidelity"

    n_concepts: int = setting(8, "Semi-NMF concepts k fitted on the layer's token activations", bounds=POSITIVE_INT,
                              flag="--concepts", aliases=("--n-concepts",),
                              space={"label": "Concepts", "minimum": 2, "maximum": 16, "step": 1})  # fmt: skip
    bounds: bool = setting(True, "compute the certified and estimated KL bounds", flag="--no-bound",
                           aliases=("--no-bounds",))  # fmt: skip
    max_tokens: int | None = setting(None, "texts: cut every text to this many tokens", bounds=POSITIVE_INT,
                                     none_means=" (the shortest text's count)")  # fmt: skip
    n_clusters: int = setting(4, "texts without labels: k-means pseudo-labels the linear head is fitted on",
                              bounds=POSITIVE_INT)  # fmt: skip
    power_iters: int = setting(20, "power-iteration steps of the Jacobian norm estimates", bounds=POSITIVE_INT)
    max_images_for_constants: int = setting(32, "inputs the Jacobian estimates of the constants use",
                                            bounds=POSITIVE_INT)  # fmt: skip
    batch_size: int = setting(64, "inputs per forward pass", bounds=POSITIVE_INT)


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

    diagnostic: ClassVar[str] = "attention_svm"

    max_queries: int | None = setting(64, "queries sampled for the SVM (0: every query)", bounds=NON_NEGATIVE_INT,
                                      none_means=" (every query)")  # fmt: skip
    one_hot_threshold: float = setting(0.9, "a query's attention is one-hot when its largest probability is ≥ this",
                                       bounds=Bounds("real", low=0, high=1, low_open=True))  # fmt: skip
    norm: str = setting("fro", "the norm ‖W‖ the SVM minimizes (nuc needs cvxpy)", choices=("fro", "nuc"))
    include_bias: bool | None = setting(None, "augment queries with the query bias", none_means=" (when the head "
                                        "has one)", cli=False)  # fmt: skip
    seed: int = setting(0, "seed of the query sample", bounds=INTEGER)
    tol: float = setting(1e-10, "solver tolerance", bounds=NON_NEGATIVE)


@dataclass(frozen=True)
class ObjectiveLedgerSettings(_Settings):
    """The objective ledger of a white-box model (:func:`hf_tdiag.objective_ledger`).

    Examples:
        >>> from hf_tdiag import ObjectiveLedgerSettings, SRRSettings
        >>> ObjectiveLedgerSettings().eps == SRRSettings().eps, ObjectiveLedgerSettings(tolerance=0).tolerance
        (True, 0.0)
        >>> ObjectiveLedgerSettings(tolerance=-1)
        Traceback (most recent call last):
            ...
        ValueError: tolerance: expected a finite number >= 0, got -1
    """

    diagnostic: ClassVar[str] = "objective_ledger"

    eps: float = setting(SRRSettings.eps, "ε of Rᶜ in the attention steps' objective", bounds=POSITIVE)
    tolerance: float = setting(1e-6, "relative increase that counts as increasing", bounds=NON_NEGATIVE)
    batch_size: int = setting(32, "inputs per forward pass", bounds=POSITIVE_INT)


@dataclass(frozen=True)
class TokenSNRSettings(_Settings):
    """The token signal-to-noise ratio per layer (:func:`hf_tdiag.token_snr`).

    Examples:
        >>> from hf_tdiag import TokenSNRSettings
        >>> TokenSNRSettings().fit_fraction, TokenSNRSettings(rank=3).rank, TokenSNRSettings().tokens
        (0.5, 3, 'all')
        >>> TokenSNRSettings(center=False).center
        False
        >>> TokenSNRSettings(fit_fraction=1)
        Traceback (most recent call last):
            ...
        ValueError: fit_fraction: expected a finite number in (0, 1), got 1
    """

    diagnostic: ClassVar[str] = "token_snr"

    rank: int | None = setting(None, "dimension r of each class's principal subspace U_k", bounds=POSITIVE_INT,
                               none_means=" (d // number of classes: subspaces that fit side by side)")  # fmt: skip
    fit_fraction: float = setting(0.5, "share of each class's inputs the subspaces are fitted on (the rest are "
                                  "measured)", bounds=Bounds("real", low=0, high=1, low_open=True, high_open=True))  # fmt: skip
    tokens: str = setting("all", "the tokens measured: every token of an input (all) or its first, the CLS token "
                          "(first)", choices=("all", "first"))  # fmt: skip
    center: bool = setting(True, "subtract each token position's mean over the fitting inputs first, so what every "
                           "class shares (position embeddings, the CLS token) is no class's signal",
                           flag="--no-center")  # fmt: skip
    batch_size: int = setting(32, "inputs per forward pass", bounds=POSITIVE_INT)


def resolve(cls, settings=None, overrides: dict[str, Any] | None = None):
    """The settings a diagnostic runs with: ``settings`` (an instance of ``cls``, or None for the defaults) with
    every keyword in ``overrides`` applied on top — a keyword given always wins, whatever its value; validated once.

    Examples:
        >>> from hf_tdiag.diagnostics.settings import SRRSettings, resolve
        >>> resolve(SRRSettings, SRRSettings(lam=0.5), {"lam": 1.0, "eps": 0.2}) == SRRSettings(lam=1.0, eps=0.2)
        True
    """
    if settings is not None and not isinstance(settings, cls):
        raise TypeError(f"settings: expected a {cls.__name__}, got {type(settings).__name__}")
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(cls.defaults()))
    if unknown:
        raise TypeError(f"{cls.__name__}: unknown setting(s) {unknown}; known: {sorted(cls.defaults())}")
    return cls(**overrides) if settings is None else settings.replace(**overrides)


SETTINGS_CLASSES = (
    SRRSettings,
    SchattenSettings,
    ConceptFidelitySettings,
    AttentionSVMSettings,
    ObjectiveLedgerSettings,
    TokenSNRSettings,
)

__all__ = [
    "Bounds",
    "Field",
    "SRRSettings",
    "SchattenSettings",
    "ConceptFidelitySettings",
    "AttentionSVMSettings",
    "ObjectiveLedgerSettings",
    "TokenSNRSettings",
    "SETTINGS_CLASSES",
    "resolve",
    "setting",
]
