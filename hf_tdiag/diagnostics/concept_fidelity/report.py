"""The report :func:`~hf_tdiag.diagnostics.concept_fidelity.concept_fidelity` returns: one layer's fidelity numbers, or
(``layers=``) a sweep holding one such report per layer.

It keeps mapping access (``report["kl"]``, ``report["per_image"]["kl"]``) beside the shared contract
(:mod:`hf_tdiag.diagnostics.report`); the tensors behind the numbers (``A``, ``Â``, codes, logits, the fitted
concepts) are the attribute :attr:`ConceptFidelityReport.tensors`, never part of the JSON.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ..._meaning import CONCEPT_BOUNDS, concept_bound_flags
from ..report import FLOAT, INT, ReportContract, typed_frame
from ..report_json import ANY, NUM, MapOf, Nullable, Obj, check_report, report_error, stamp
from ..report_json import INT as JSON_INT

#: the table's columns: one row per layer ℓ (``hidden_states[ℓ]``, 0 = the embeddings)
TABLE_COLUMNS = {
    "layer": INT,
    "n_images": INT,
    "n_tokens": INT,
    "hidden_size": INT,
    "n_concepts": INT,
    "gram_weight": FLOAT,
    "delta_rec": FLOAT,
    "delta_rec_rel": FLOAT,
    "delta_gram": FLOAT,
    "gram_norm": FLOAT,
    "kl": FLOAT,
    "kl_max": FLOAT,
    "top1_agreement": FLOAT,
    "lemma_holds": FLOAT,
    "bound_certified": FLOAT,
    "bound_certified_chain": FLOAT,
    "bound_estimated": FLOAT,
    "frac_kl_below_bound_certified": FLOAT,
    "frac_kl_below_bound_estimated": FLOAT,
}

_HEADLINE = (
    "kl",
    "top1_agreement",
    "delta_rec_rel",
    "bound_certified",
    "bound_estimated",
    "frac_kl_below_bound_certified",
    "frac_kl_below_bound_estimated",
)


class ConceptFidelityReport(dict, ReportContract):
    """Concept fidelity at one layer (``is_sweep`` False) or across layers (``report["per_layer"][ℓ]``).

    Examples:
        >>> import torch, hf_tdiag
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification, ConceptFidelityReport
        >>> _ = torch.manual_seed(0)
        >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
        >>> images = torch.randn(4, 1, 8, 8)
        >>> report = hf_tdiag.concept_fidelity(model, images, layer=2, concepts=2, bounds=False, progress=False)
        >>> report.is_sweep, report["layer"], report["kl"] == report.summary()["kl"]
        (False, 2, True)
        >>> ConceptFidelityReport.from_json(report.to_json()).summary() == report.summary()
        True
        >>> report.to_pandas()[["layer", "top1_agreement"]]
           layer  top1_agreement
        0      2             1.0
    """

    def __init__(self, data: Mapping[str, Any] = (), tensors: Mapping[str, Any] | None = None):
        super().__init__(data)
        self.tensors = dict(tensors) if tensors is not None else None

    @property
    def is_sweep(self) -> bool:
        """True for a layer sweep (``concept_fidelity(..., layers=...)``)."""
        return "per_layer" in self

    def _layer_reports(self) -> list[Mapping[str, Any]]:
        return list(self["per_layer"].values()) if self.is_sweep else [self]

    def summary(self) -> dict[str, float]:
        """One layer: KL, top-1 agreement, δ_rec/‖A‖_F and the bounds with the fraction of inputs below each, the
        input count ``n_images``, and ``<bound>_vacuous`` (True when a bound is above log C, C the classes or the
        vocabulary: :meth:`vacuous_reasons` says why); a sweep: those averaged over the measured layers
        (``<key>_mean_over_layers``), the largest KL and ``<bound>_vacuous_layers`` (how many layers' bound is)."""
        if not self.is_sweep:
            out = {k: float(self[k]) for k in _HEADLINE if self.get(k) is not None}
            out["n_images"] = int(self["n_images"]) if self.get("n_images") is not None else None
            vacuous = self.vacuous_reasons()
            known = self.get("num_classes") is not None
            out.update({f"{k}_vacuous": k in vacuous for k in CONCEPT_BOUNDS if known and self.get(k) is not None})
            return {k: v for k, v in out.items() if v is not None}
        reports = self._layer_reports()
        out = {}
        for key in _HEADLINE:
            values = [float(r[key]) for r in reports if r.get(key) is not None]
            if values:
                out[f"{key}_mean_over_layers"] = sum(values) / len(values)
        out["kl_max_over_layers"] = max(float(r["kl"]) for r in reports)
        for key in CONCEPT_BOUNDS:
            flagged = [key in concept_bound_flags(r, r.get("num_classes")) for r in reports if r.get(key) is not None]
            if flagged and all(r.get("num_classes") is not None for r in reports):
                out[f"{key}_vacuous_layers"] = sum(flagged)
        return out

    def vacuous_reasons(self) -> dict[str, str]:
        """``{bound: one-line reason}`` for each KL bound of one layer's report above log C (empty for a sweep, or
        when the report does not record C)."""
        return {} if self.is_sweep else concept_bound_flags(self, self.get("num_classes"))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready deep copy of the numbers (the sweep's per-layer keys become strings, as JSON has them)."""
        out = {**stamp(KIND, FORMAT_VERSION), **self._plain()}
        out["summary"] = self.summary()
        return out

    def _plain(self) -> dict[str, Any]:
        out = {k: copy.deepcopy(v) for k, v in self.items() if k != "per_layer"}
        if self.is_sweep:
            out["per_layer"] = {
                str(k): v._plain() if isinstance(v, ConceptFidelityReport) else copy.deepcopy(dict(v))
                for k, v in self["per_layer"].items()
            }
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConceptFidelityReport:
        """Inverse of :meth:`to_dict`; a JSON of another report, a newer format, or a table field missing or
        mistyped (one layer's, or any layer's of a sweep) is one ValueError naming the field."""
        _check_json(data)
        data = copy.deepcopy(dict(data))
        for key in ("summary", "kind", "format_version"):
            data.pop(key, None)
        if "per_layer" in data:
            data["per_layer"] = {int(k): cls(v) for k, v in data["per_layer"].items()}
        return cls(data)

    def to_pandas(self):
        """One row per measured layer (``layer`` = ℓ of ``hidden_states[ℓ]``, 0 the embeddings, 1..L the blocks)
        with the mean fidelity numbers and both bounds (``<NA>`` where a bound was not computed)."""
        return typed_frame(self._layer_reports(), TABLE_COLUMNS)

    def plot(self, kind: str = "estimated"):
        """One layer: per-input KL against the ``kind`` bound; a sweep: KL and bounds per layer."""
        from ...viz.concept_fidelity import plot_kl_vs_bound, plot_layer_sweep

        if self.is_sweep:
            return plot_layer_sweep(self)
        return plot_kl_vs_bound({f"layer {self['layer']}": self}, kind=kind)


KIND = "ConceptFidelityReport"
#: the JSON format :meth:`ConceptFidelityReport.to_dict` writes (JSON without ``format_version`` is format 1 too)
FORMAT_VERSION = 1
# one layer's numbers: the layer and its KL are always there; the table's other columns when measured (null: not)
_LAYER = Obj(
    {"layer": JSON_INT, "kl": NUM},
    optional={
        name: Nullable(JSON_INT if kind == INT else NUM)
        for name, kind in TABLE_COLUMNS.items()
        if name not in ("layer", "kl")
    },
)


def _check_json(data) -> None:
    """One layer's report, or a sweep: ``per_layer`` keyed by layer numbers, each a layer's report."""
    if isinstance(data, Mapping) and "per_layer" in data:
        check_report(data, KIND, Obj({"per_layer": MapOf(ANY)}), FORMAT_VERSION)
        if not data["per_layer"]:
            raise report_error(KIND, "per_layer", "expected at least one layer, got none")
        for key, layer in data["per_layer"].items():
            if not str(key).isdigit():
                raise report_error(KIND, f"per_layer.{key}", "expected a layer number as the key")
            problem = _LAYER.problem(layer, f"per_layer.{key}")
            if problem:
                raise report_error(KIND, *problem)
    else:
        check_report(data, KIND, _LAYER, FORMAT_VERSION)


__all__ = ["ConceptFidelityReport", "TABLE_COLUMNS"]
