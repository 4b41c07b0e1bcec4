"""The report :func:`~hf_tdiag.diagnostics.attention_svm.attention_svm_diagnostic` returns (the shared contract of
:mod:`hf_tdiag.diagnostics.report`): headline numbers, one table row per sampled query, JSON round trip."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..measures.attention_svm import AttSVMResult
from .report import FLOAT, INT, ReportContract, typed_frame
from .report_json import ANY, BOOL, NUM, NUMBERS, ListOf, Nullable, Obj, check_report, report_error, stamp
from .report_json import INT as JSON_INT
from .report_json import STR as JSON_STR


@dataclass
class AttentionSVMReport(ReportContract):
    """Result of :func:`~hf_tdiag.diagnostics.attention_svm.attention_svm_diagnostic`: one head against its
    max-margin solution ``W_mm`` on the sampled queries.

    Examples:
        >>> import torch, hf_tdiag
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification, AttentionSVMReport
        >>> _ = torch.manual_seed(0)
        >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
        >>> report = hf_tdiag.attention_svm_diagnostic(model, torch.randn(2, 1, 8, 8), layer=1, head=0, max_queries=8)
        >>> AttentionSVMReport.from_json(report.to_json()).summary() == report.summary()
        True
        >>> report.to_pandas().columns.tolist()  # one row per sampled query
        ['layer', 'head', 'sequence', 'position', 'selected', 'head_margin', 'svm_margin', 'max_prob']
    """

    layer: int  # block number 1..L
    head: int  # 0-based head index
    family: str
    norm: str
    include_bias: bool
    correlation: float  # corr(W_h, W_mm)
    correlation_in_span: float  # corr(Π W_h Π, W_mm), W_h restricted to what these inputs can see
    margin_ratio: float  # min_i γ_i(W_h) / γ(W_mm) ≤ 1
    head_margins: torch.Tensor  # (n,) min_t (x_α − x_t)ᵀ W_h z / ‖W_h‖ per query (‖·‖ = the SVM's norm)
    svm_margins: torch.Tensor  # (n,) the same for W_mm / ‖W_mm‖
    svm_margin: float  # 1 / ‖W_mm‖
    max_probs: torch.Tensor  # (n,) largest attention probability of each sampled query
    one_hot_fraction: float  # share of sampled queries with max prob ≥ one_hot_threshold
    one_hot_fraction_all: float  # the same over every query token of the batch
    one_hot_threshold: float
    query_index: torch.Tensor  # (n, 2) (sequence, position) of the sampled queries
    selected: torch.Tensor  # (n,) attended token of each sampled query
    W_head: torch.Tensor | None  # (d, d_z) head matrix in the x_tᵀ W z orientation (None: read without matrices)
    svm: AttSVMResult
    causal: bool = False  # decoder head: the causal Att-SVM (constraints over each query's prefix)
    rotary: bool = False  # rotary head: W_head is the offset-0 form, head margins are true logit gaps
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-friendly numbers (no large arrays)."""
        hm = self.head_margins
        return {
            "layer": self.layer,
            "head": self.head,
            "family": self.family,
            "norm": self.norm,
            "include_bias": self.include_bias,
            "causal": self.causal,
            "rotary": self.rotary,
            "num_queries": int(hm.numel()),
            "feasible": self.svm.feasible,
            "correlation": self.correlation,
            "correlation_in_span": self.correlation_in_span,
            "margin_ratio": self.margin_ratio,
            "svm_margin": self.svm_margin,
            "head_margin_min": float(hm.min()) if hm.numel() else math.nan,
            "head_margin_median": float(hm.median()) if hm.numel() else math.nan,
            "one_hot_fraction": self.one_hot_fraction,
            "one_hot_fraction_all": self.one_hot_fraction_all,
            "one_hot_threshold": self.one_hot_threshold,
            "svm": self.svm.summary(),
            **self.extra,
        }

    def to_pandas(self):
        """One row per sampled query: ``layer`` (block 1..L), ``head``, ``sequence`` and ``position`` of the query,
        the ``selected`` (most attended) token, the head's and the SVM's normalized margins and the largest
        attention probability."""
        columns = {
            "layer": INT,
            "head": INT,
            "sequence": INT,
            "position": INT,
            "selected": INT,
            "head_margin": FLOAT,
            "svm_margin": FLOAT,
            "max_prob": FLOAT,
        }
        rows = [
            {
                "layer": self.layer,
                "head": self.head,
                "sequence": int(seq),
                "position": int(pos),
                "selected": int(sel),
                "head_margin": float(hm),
                "svm_margin": float(sm),
                "max_prob": float(mp),
            }
            for (seq, pos), sel, hm, sm, mp in zip(
                self.query_index.tolist(),
                self.selected.tolist(),
                self.head_margins.tolist(),
                self.svm_margins.tolist(),
                self.max_probs.tolist(),
            )
        ]
        return typed_frame(rows, columns)

    def to_dict(self, include_matrices: bool = False) -> dict[str, Any]:
        """Summary, the per-query arrays and the SVM's per-constraint arrays as lists (NaN as null);
        ``include_matrices`` adds ``W_head`` and ``W_mm`` (d × d_z each)."""
        out = {**stamp(KIND, FORMAT_VERSION), **self.summary()}
        out.update(
            head_margins=[float(x) for x in self.head_margins.tolist()],
            svm_margins=[float(x) for x in self.svm_margins.tolist()],
            max_probs=[float(x) for x in self.max_probs.tolist()],
            query_index=[[int(a), int(b)] for a, b in self.query_index.tolist()],
            selected=[int(x) for x in self.selected.tolist()],
            svm_arrays={name: _nan_to_none(getattr(self.svm, name).tolist()) for name in _SVM_ARRAYS},
        )
        out["svm"] = dict(out["svm"], certificate_residual=self.svm.certificate_residual, message=self.svm.message)
        if include_matrices:
            out["W_head"] = None if self.W_head is None else self.W_head.tolist()
            out["W_mm"] = None if self.svm.W is None else self.svm.W.tolist()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttentionSVMReport:
        """Inverse of :meth:`to_dict` (``W_head`` and ``W_mm`` are None unless they were included); a JSON of another
        report, a newer format, or a field missing, mistyped or of the wrong length is one ValueError naming it."""
        _check_json(data)
        d = dict(data)
        s = d["svm"]
        arrays = {name: _tensor(d["svm_arrays"][name], dtype) for name, dtype in _SVM_ARRAYS.items()}
        svm = AttSVMResult(
            W=None if d.get("W_mm") is None else torch.tensor(d["W_mm"], dtype=torch.float64),
            objective=float(s["objective"]),
            norm=s["norm"],
            feasible=bool(s["feasible"]),
            status=s["status"],
            duality_gap=float(s["duality_gap"]),
            iterations=int(s["iterations"]),
            solve_time=float(s["solve_time_s"]),
            solver=s["solver"],
            offending=None if s.get("offending") is None else torch.tensor(s["offending"], dtype=torch.long),
            certificate_residual=s.get("certificate_residual"),
            message=s.get("message", ""),
            **arrays,
        )
        extra = {k: v for k, v in d.items() if k not in _KNOWN_KEYS}
        return cls(
            layer=int(d["layer"]),
            head=int(d["head"]),
            family=d["family"],
            norm=d["norm"],
            include_bias=bool(d["include_bias"]),
            correlation=float(d["correlation"]),
            correlation_in_span=float(d["correlation_in_span"]),
            margin_ratio=float(d["margin_ratio"]),
            head_margins=_tensor(d["head_margins"], torch.float64),
            svm_margins=_tensor(d["svm_margins"], torch.float64),
            svm_margin=float(d["svm_margin"]),
            max_probs=_tensor(d["max_probs"], torch.float64),
            one_hot_fraction=float(d["one_hot_fraction"]),
            one_hot_fraction_all=float(d["one_hot_fraction_all"]),
            one_hot_threshold=float(d["one_hot_threshold"]),
            query_index=torch.tensor(d["query_index"], dtype=torch.long).reshape(-1, 2),
            selected=torch.tensor(d["selected"], dtype=torch.long),
            W_head=None if d.get("W_head") is None else torch.tensor(d["W_head"], dtype=torch.float64),
            svm=svm,
            causal=bool(d["causal"]),
            rotary=bool(d["rotary"]),
            extra=extra,
        )

    def plot(self, title: str | None = None):
        """Per-query margins of the head against the SVM's, and the largest attention probabilities."""
        from ..viz.attention_svm.head import plot_head_diagnostic

        return plot_head_diagnostic(self, title=title)


# the SVM result's per-constraint arrays kept in the JSON, with the dtype they are read back as
_SVM_ARRAYS = {
    "margins": torch.float64,
    "dual": torch.float64,
    "active": torch.bool,
    "constraint": torch.int8,
    "selected": torch.long,
}

KIND = "AttentionSVMReport"
#: the JSON format :meth:`AttentionSVMReport.to_dict` writes (JSON without ``format_version`` is format 1 too)
FORMAT_VERSION = 1
_NUMS = ListOf(Nullable(NUM))  # NaN is written as null in the arrays
_SCHEMA = Obj(
    {
        "layer": JSON_INT,
        "head": JSON_INT,
        "family": JSON_STR,
        "norm": ANY,
        "include_bias": BOOL,
        "causal": BOOL,
        "rotary": BOOL,
        "correlation": NUM,
        "correlation_in_span": NUM,
        "margin_ratio": NUM,
        "svm_margin": NUM,
        "one_hot_fraction": NUM,
        "one_hot_fraction_all": NUM,
        "one_hot_threshold": NUM,
        "head_margins": _NUMS,
        "svm_margins": _NUMS,
        "max_probs": _NUMS,
        "query_index": ListOf(ListOf(JSON_INT, length=2)),
        "selected": ListOf(JSON_INT),
        "svm": Obj(
            {
                "objective": NUM,
                "norm": ANY,
                "feasible": BOOL,
                "status": JSON_STR,
                "duality_gap": NUM,
                "iterations": JSON_INT,
                "solve_time_s": NUM,
                "solver": JSON_STR,
            },
            optional={
                "offending": Nullable(ListOf(JSON_INT)),
                "certificate_residual": Nullable(NUM),
                "message": JSON_STR,
            },
        ),
        "svm_arrays": Obj({name: NUMBERS for name in ("margins", "dual", "active", "constraint", "selected")}),
    },
    optional={"W_head": Nullable(ListOf(ListOf(NUM))), "W_mm": Nullable(ListOf(ListOf(NUM)))},
)


def _check_json(data) -> None:
    """The schema, then the per-query arrays of one length (the table zips them: a shorter one would drop rows)."""
    check_report(data, KIND, _SCHEMA, FORMAT_VERSION)
    n = len(data["head_margins"])
    for name in ("svm_margins", "max_probs", "query_index", "selected"):
        if len(data[name]) != n:
            raise report_error(
                KIND, name, f"expected {n} entries (one per query, as head_margins), got {len(data[name])}"
            )


# keys of to_dict() that are fields, not the diagnostic's extra numbers
_KNOWN_KEYS = {
    "kind", "format_version", "layer", "head", "family", "norm", "include_bias", "causal", "rotary", "num_queries", "feasible", "correlation",
    "correlation_in_span", "margin_ratio", "svm_margin", "head_margin_min", "head_margin_median", "one_hot_fraction",
    "one_hot_fraction_all", "one_hot_threshold", "svm", "head_margins", "svm_margins", "max_probs", "query_index",
    "selected", "svm_arrays", "W_head", "W_mm",
}  # fmt: skip


def _nan_to_none(values):
    """Nested lists with NaN as None (JSON has no NaN)."""
    if isinstance(values, list):
        return [_nan_to_none(v) for v in values]
    return None if isinstance(values, float) and math.isnan(values) else values


def _none_to_nan(values):
    """Inverse of :func:`_nan_to_none`."""
    if isinstance(values, list):
        return [_none_to_nan(v) for v in values]
    return math.nan if values is None else values


def _tensor(values, dtype) -> torch.Tensor:
    """Nested lists (None as NaN) as a tensor of ``dtype``."""
    return torch.tensor(_none_to_nan(values), dtype=torch.float64).to(dtype)


__all__ = ["AttentionSVMReport"]
