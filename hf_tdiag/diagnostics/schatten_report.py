"""The report :func:`~hf_tdiag.diagnostics.schatten.schatten_bounds` returns (the shared contract of
:mod:`hf_tdiag.diagnostics.report`): both bound proxies, one :class:`MatrixRecord` per analysed matrix, the
per-type and per-layer breakdowns, and a versioned JSON form."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._meaning import degenerate_reason
from ..measures import schatten as S
from .report import FLOAT, INT, STR, ReportContract, typed_frame
from .report_json import ANY, BOOL, NUM, Choice, ListOf, MapOf, Nullable, Obj, check_report, report_error, stamp
from .report_json import INT as JSON_INT
from .report_json import STR as JSON_STR

MATRIX_TYPES = ("qk", "v", "m_in", "ista", "ista_d", "m_out", "ista_d1")


def _json_float(x: float) -> float | str | None:
    """JSON has no inf/NaN: a non-finite value (κ↑ = inf when p_opt = 0; NaN for a zero matrix) is written as null."""
    return x if math.isfinite(x) else None


@dataclass
class MatrixRecord:
    """One analysed matrix (row-vector orientation) and its place in the bound."""

    layer: int  # block number 1..L (JSON written before format 2 held the 0-based index; from_json converts it)
    head: int | None
    type: str
    shape: tuple[int, int]
    rank: int
    spectral_norm: float
    frobenius_norm: float
    nuclear_norm: float
    norm_2_1: float
    norm_1_1: float
    stable_rank: float
    gamma: float
    alpha: float
    p_opt: float
    min_contribution: float
    flip_factor_down: float  # κ↓: γα_ℓL × κ↓ makes a larger p win (0: p_opt is the largest p)
    flip_factor_up: float  # κ↑: γα_ℓL × κ↑ makes a smaller p win (inf: p_opt = 0)
    singular_values: np.ndarray  # kept (nonzero) singular values, descending
    contributions: np.ndarray  # c(W, p) on the report's p grid

    def to_dict(self, include_spectra: bool = True) -> dict[str, Any]:
        d = {
            "layer": self.layer,
            "head": self.head,
            "type": self.type,
            "shape": list(self.shape),
            "rank": self.rank,
            "spectral_norm": self.spectral_norm,
            "frobenius_norm": self.frobenius_norm,
            "nuclear_norm": self.nuclear_norm,
            "norm_2_1": self.norm_2_1,
            "norm_1_1": self.norm_1_1,
            "stable_rank": self.stable_rank,
            "gamma": self.gamma,
            "alpha": self.alpha,
            "p_opt": self.p_opt,
            "min_contribution": self.min_contribution,
            "flip_factor_down": _json_float(self.flip_factor_down),
            "flip_factor_up": _json_float(self.flip_factor_up),
        }
        if include_spectra:
            d["singular_values"] = self.singular_values.tolist()
            d["contributions"] = self.contributions.tolist()
        return d


# the per-matrix numbers of a MatrixRecord, as float columns of SchattenReport.to_pandas()
_RECORD_FLOATS = (
    "spectral_norm",
    "frobenius_norm",
    "nuclear_norm",
    "norm_2_1",
    "norm_1_1",
    "stable_rank",
    "gamma",
    "alpha",
    "p_opt",
    "min_contribution",
    "flip_factor_down",
    "flip_factor_up",
)


@dataclass
class SchattenReport(ReportContract):
    """Result of :func:`schatten_bounds`: ``schatten_bound`` = B_Schatten (the spectrum-adaptive Schatten proxy
    Σ_W min_p c(W, p) + √L), ``edelman_bound`` = B_Edelman, and one :class:`MatrixRecord` per analysed matrix.

    Examples:
        >>> import torch, hf_tdiag
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification, SchattenReport
        >>> _ = torch.manual_seed(0)
        >>> report = hf_tdiag.schatten_bounds(CrateForImageClassification(CrateConfig.from_preset("crate-digits")))
        >>> again = SchattenReport.from_json(report.to_json())
        >>> (again.schatten_bound, again.edelman_bound) == (report.schatten_bound, report.edelman_bound)
        True
        >>> len(again.matrices), sorted(report.summary())[:4]
        (36, ['edelman_bound', 'hidden_size', 'mean_p_opt', 'mean_p_opt_ista'])
    """

    model: str
    model_type: str
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    L_phi: float
    rank_tol: float
    p_grid: np.ndarray
    schatten_bound: float
    edelman_bound: float
    alpha: np.ndarray  # (L,) propagation factors α_ℓ
    xi: np.ndarray  # (L,) Edelman layer terms ξ_ℓ
    matrices: list[MatrixRecord] = field(default_factory=list)
    layers_path: str = ""  # module path of the analysed layer list, e.g. "encoder.layer"
    layer_gains: np.ndarray | None = None  # (L,) f_k, α_ℓ = Π_{k>ℓ} f_k
    num_kv_heads: int | None = (
        None  # decoders with grouped-query attention: K/V heads (QK_h, Ṽ_h use head h // (H/H_kv))
    )
    gated: bool = False  # gated MLP: M_in = [W_gateᵀ | W_upᵀ] (N × 2I)

    @property
    def degenerate(self) -> bool:
        """True when p_opt = 0 for every matrix: B_Schatten = Σ_W √(rank(W)·N) + √L depends only on shapes and ranks."""
        return bool(self.matrices) and all(m.p_opt == 0 for m in self.matrices)

    def type_contributions(self, ps=(0.0, 0.5, 1.0, 2.0)) -> dict[str, np.ndarray]:
        """Σ_{W of each type} c(W, p) at each p in ``ps`` (any p ≥ 0, on the grid or not), from the kept spectra."""
        out: dict[str, np.ndarray] = {}
        for t in MATRIX_TYPES:
            recs = self.by_type(t)
            if recs:
                out[t] = np.sum([_curve(m, ps, self.num_layers, self.hidden_size) for m in recs], axis=0)
        return out

    def fixed_p_bounds(self, ps=(0.0, 0.5, 1.0, 2.0)) -> np.ndarray:
        """Σ_W c(W, p) + √L with one p for every matrix, at each p in ``ps`` (B_Schatten is never larger than any of them)."""
        return np.sum(list(self.type_contributions(ps).values()), axis=0) + math.sqrt(self.num_layers)

    def matrix_rows(self, no_head: str = "") -> list[list]:
        """One row per matrix: layer, head (``no_head`` for a whole-layer matrix), type, rank, ‖W‖₂, stable rank,
        p_opt, min_p c(W, p) and κ↓ (the factor on γα_ℓL at which a larger p would win)."""
        return [
            [m.layer, no_head if m.head is None else m.head, m.type, m.rank, m.spectral_norm, m.stable_rank, m.p_opt,
             m.min_contribution, m.flip_factor_down]
            for m in self.matrices
        ]  # fmt: skip

    def breakdown_tables(self, ps=(0.0, 0.5, 1.0, 2.0)) -> dict[str, tuple[list[str], list[list]]]:
        """What differs between models when p_opt is uninformative: name -> (headers, rows).

        ``"types"``: Σ c(W, p) per matrix type at each p in ``ps`` and the fixed-p bound Σ_W c(W, p) + √L;
        ``"layers"``: per layer f_ℓ, α_ℓ and the smallest flip factor κ↓ of its matrices (how far from p > 0 winning).
        """
        per_type = self.type_contributions(ps)
        fixed = self.fixed_p_bounds(ps)
        heads = ["type", "matrices", "p_opt = 0 (count)"] + [f"Σ c(W, {p:g})" for p in ps]
        rows = [
            [t, len(self.by_type(t)), sum(m.p_opt == 0 for m in self.by_type(t)), *map(float, v)]
            for t, v in per_type.items()
        ]
        rows.append(["all (+ √L)", len(self.matrices), sum(m.p_opt == 0 for m in self.matrices), *map(float, fixed)])
        gains = self.layer_gains if self.layer_gains is not None else np.full(self.num_layers, np.nan)
        layer_rows = []
        for layer in range(self.num_layers):
            downs = [
                m.flip_factor_down for m in self.matrices if m.layer == layer + 1 and math.isfinite(m.flip_factor_down)
            ]
            layer_rows.append(
                [layer + 1, float(gains[layer]), float(self.alpha[layer]), max(downs) if downs else float("nan")]
            )
        layer_heads = ["layer", "gain f_ℓ", "α_ℓ = Π_{k>ℓ} f_k", "largest κ↓ (×γα_ℓL for p > 0 to win)"]
        return {"types": (heads, rows), "layers": (layer_heads, layer_rows)}

    def degenerate_note(self) -> str | None:
        """One sentence for readers when :attr:`degenerate`, else None."""
        if not self.degenerate:
            return None
        shape_only = sum(math.sqrt(m.rank * self.hidden_size) for m in self.matrices) + math.sqrt(self.num_layers)
        scales = [m.gamma * m.alpha * self.num_layers for m in self.matrices]
        kmax = max(m.flip_factor_down for m in self.matrices if math.isfinite(m.flip_factor_down))
        return (
            f"p_opt = 0 for all {len(self.matrices)} matrices: B_Schatten = Σ_W √(rank(W)·N) + √L = {shape_only:.6g} depends "
            f"only on shapes and ranks, not on the singular values. The scales γα_ℓL (from {min(scales):.3g} to "
            f"{max(scales):.3g}; α of the first layer = {self.alpha[0]:.3g}, a product of {self.num_layers - 1} layer "
            f"gains) make every p > 0 lose: they would have to shrink by a factor of at least {1 / kmax:.3g} for any "
            "matrix to prefer p > 0."
        )

    @property
    def contribution_curves(self) -> np.ndarray:
        """c(W, p) for every matrix (rows, in ``matrices`` order) on ``p_grid`` (columns)."""
        return np.stack([m.contributions for m in self.matrices])

    def by_type(self, matrix_type: str) -> list[MatrixRecord]:
        """The records of one type (one of :data:`MATRIX_TYPES`; ``"ista_d"``/``"ista_d1"``: CRATE-α's D and D₁)."""
        if matrix_type not in MATRIX_TYPES:
            raise ValueError(f"matrix_type: expected one of {MATRIX_TYPES}, got {matrix_type!r}")
        return [m for m in self.matrices if m.type == matrix_type]

    def summary(self) -> dict[str, Any]:
        """The headline numbers as a flat dict (one table row); ``schatten_degenerate`` says whether B_Schatten is a rank
        count (:attr:`degenerate`), and ``schatten_degenerate_reason`` why, in one line, when it is."""
        return {
            "model": self.model,
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_heads": self.num_heads,
            "schatten_bound": self.schatten_bound,
            "edelman_bound": self.edelman_bound,
            "schatten_degenerate": self.degenerate,
            **({"schatten_degenerate_reason": degenerate_reason(len(self.matrices))} if self.degenerate else {}),
            "num_matrices": len(self.matrices),
            "mean_p_opt": float(np.mean([m.p_opt for m in self.matrices])),
            **{
                f"mean_p_opt_{t}": float(np.mean([m.p_opt for m in recs]))
                for t in MATRIX_TYPES
                if (recs := [m for m in self.matrices if m.type == t])
            },
        }

    def to_dict(self, include_spectra: bool = True) -> dict[str, Any]:
        """JSON-ready dict; ``include_spectra=False`` drops per-matrix singular values and curves."""
        return {
            **stamp(KIND, FORMAT_VERSION),
            "model": self.model,
            "model_type": self.model_type,
            "family": self.family,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_heads": self.num_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "L_phi": self.L_phi,
            "rank_tol": self.rank_tol,
            "p_grid": self.p_grid.tolist(),
            "schatten_bound": self.schatten_bound,
            "edelman_bound": self.edelman_bound,
            "alpha": self.alpha.tolist(),
            "xi": self.xi.tolist(),
            "layers_path": self.layers_path,
            "layer_gains": None if self.layer_gains is None else self.layer_gains.tolist(),
            "num_kv_heads": self.num_kv_heads,
            "gated": self.gated,
            "degenerate": self.degenerate,
            "matrices": [m.to_dict(include_spectra) for m in self.matrices],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SchattenReport:
        """Inverse of :meth:`to_dict` (with spectra); JSON written before format 2 (0-based ``layer``, keys
        ``ours``/``edelman``) is converted."""
        version = check_report(data, KIND, _SCHEMA_V1 if _version_of(data) == 1 else _SCHEMA, FORMAT_VERSION)
        d = _upgrade(dict(data), version)
        if "singular_values" not in (d["matrices"][0] if d["matrices"] else {"singular_values": 1}):
            raise ValueError("path_or_text: the report was written without spectra (include_spectra=False)")
        problem = _MATRICES.problem(d["matrices"], "matrices")
        if problem:
            raise report_error(KIND, *problem)
        mats = []
        for m in d["matrices"]:
            m = dict(
                m,
                shape=tuple(m["shape"]),
                singular_values=np.asarray(m["singular_values"], dtype=np.float64),
                contributions=np.asarray(m["contributions"], dtype=np.float64),
            )
            zero = m["rank"] == 0
            down, up = m["flip_factor_down"], m["flip_factor_up"]
            m["flip_factor_down"] = math.nan if down is None else down
            m["flip_factor_up"] = (math.nan if zero else math.inf) if up is None else up
            mats.append(MatrixRecord(**m))
        arrays = {k: np.asarray(d[k], dtype=np.float64) for k in ("p_grid", "alpha", "xi")}
        gains = None if d.get("layer_gains") is None else np.asarray(d["layer_gains"], dtype=np.float64)
        plain = {k: d[k] for k in _PLAIN_FIELDS if k in d}
        return cls(**plain, **arrays, matrices=mats, layer_gains=gains)

    def to_pandas(self):
        """One row per analysed matrix: ``layer`` (block 1..L), ``head`` (<NA> for FFN/ISTA matrices), ``type``, the
        matrix's rows and columns, its rank and norms, γ, α, ``p_opt``, its minimal contribution and flip factors."""
        columns = {"layer": INT, "head": INT, "type": STR, "rows": INT, "cols": INT, "rank": INT}
        columns.update({name: FLOAT for name in _RECORD_FLOATS})
        rows = []
        for m in self.matrices:
            row = {name: getattr(m, name) for name in _RECORD_FLOATS}
            row.update(layer=m.layer, head=m.head, type=m.type, rows=m.shape[0], cols=m.shape[1], rank=m.rank)
            rows.append(row)
        return typed_frame(rows, columns)

    def to_json(
        self, path: str | os.PathLike | None = None, include_spectra: bool = True, indent: int | None = None
    ) -> str:
        """:meth:`to_dict` as JSON text; also written (atomically) to ``path`` when given."""
        return super().to_json(path, indent=indent, include_spectra=include_spectra)

    def plot(self):
        """The optimal Schatten index p per matrix type and layer."""
        from ..viz.schatten import plot_optimal_p

        return plot_optimal_p(self)


#: the JSON format :meth:`SchattenReport.to_dict` writes: 2 = 1-based ``layer``, ``schatten_bound``/``edelman_bound``
FORMAT_VERSION = 2


KIND = "SchattenReport"
_FLOATS = {name: NUM for name in _RECORD_FLOATS if not name.startswith("flip_factor")}
_MATRIX = Obj(
    {
        "layer": JSON_INT,
        "head": Nullable(JSON_INT),
        "type": Choice(*MATRIX_TYPES),
        "shape": ListOf(JSON_INT, length=2),
        "rank": JSON_INT,
        **_FLOATS,
        "flip_factor_down": Nullable(NUM),
        "flip_factor_up": Nullable(NUM),
    },
    optional={"singular_values": ListOf(NUM), "contributions": ListOf(NUM)},
)
_MATRICES = ListOf(_MATRIX)
_COMMON = {
    "model": JSON_STR,
    "model_type": JSON_STR,
    "family": JSON_STR,
    "num_layers": JSON_INT,
    "hidden_size": JSON_INT,
    "num_heads": JSON_INT,
    "head_dim": JSON_INT,
    "intermediate_size": JSON_INT,
    "L_phi": NUM,
    "rank_tol": NUM,
    "p_grid": ListOf(NUM),
    "alpha": ListOf(NUM),
    "xi": ListOf(NUM),
    "matrices": ListOf(MapOf(ANY)),  # each record checked after the format-1 upgrade (_MATRIX)
}
_OPTIONAL = {
    "layers_path": JSON_STR,
    "layer_gains": Nullable(ListOf(NUM)),
    "num_kv_heads": Nullable(JSON_INT),
    "gated": BOOL,
}
_SCHEMA = Obj({**_COMMON, "schatten_bound": NUM, "edelman_bound": NUM}, optional=_OPTIONAL)
_SCHEMA_V1 = Obj({**_COMMON, "ours": NUM, "edelman": NUM}, optional=_OPTIONAL)
# the constructor's plain fields read from the JSON (the arrays and records are built separately)
_PLAIN_FIELDS = (*(k for k in _COMMON if k not in ("p_grid", "alpha", "xi", "matrices")), "schatten_bound",
                 "edelman_bound", "layers_path", "num_kv_heads", "gated")  # fmt: skip


def _version_of(data) -> int:
    version = data.get("format_version", 1) if isinstance(data, Mapping) else 1
    return version if isinstance(version, int) else 1


def _upgrade(d: dict[str, Any], version: int) -> dict[str, Any]:
    """A report dict in the current format: format 1 (no ``format_version``) numbered blocks from 0 and named the
    bounds ``ours``/``edelman``."""
    if version == 1:
        d["schatten_bound"], d["edelman_bound"] = d.pop("ours"), d.pop("edelman")
        d["matrices"] = [dict(m, layer=m["layer"] + 1) if _is_int(m.get("layer")) else m for m in d["matrices"]]
    return d


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _curve(m: MatrixRecord, ps, num_layers: int, hidden_size: int) -> np.ndarray:
    """c(W, p) of one record at the given p values, from its kept singular values, γ and α."""
    p = torch.as_tensor(np.asarray(ps, dtype=np.float64))
    sigma = torch.as_tensor(m.singular_values, dtype=torch.float64)
    powers = S.schatten_powers(sigma, p, min(m.shape))
    return S.contributions(powers, p, m.gamma, m.alpha, num_layers, hidden_size).numpy()


__all__ = ["FORMAT_VERSION", "MATRIX_TYPES", "MatrixRecord", "SchattenReport"]
