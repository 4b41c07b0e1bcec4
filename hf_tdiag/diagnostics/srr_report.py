"""The report :func:`~hf_tdiag.diagnostics.srr.layer_srr` returns (the shared contract of
:mod:`hf_tdiag.diagnostics.report`): per-layer means and standard deviations of R, Rᶜ, sparsity and SRR at each
measured state, optionally the per-sample values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .report import FLOAT, INT, STR, ReportContract, typed_frame
from .report_json import ANY, NUM, Choice, ListOf, MapOf, Nullable, Obj, check_report, report_error, stamp
from .report_json import INT as JSON_INT
from .report_json import STR as JSON_STR
from .settings import SRRSettings

TERMS: tuple[str, ...] = ("R", "Rc", "sparsity", "srr")
STATES: tuple[str, ...] = ("output", "input", "mid")
MEASUREMENTS: tuple[str, ...] = SRRSettings.field("measurement").choices
STATE_DESCRIPTIONS = {
    "output": "Z^l, the output of block l (hidden_states[l]), with block l's U^l; 'layer l' means this state",
    "input": "Z^{l-1}, the input of block l (hidden_states[l-1]), with block l's U^l",
    "mid": "Z^{l-1/2} = Z^{l-1} + MSSA(LN1(Z^{l-1})), block l's state after attention, with U^l (CRATE only)",
    "official": "official CRATE measurement of block l: Rc of its qkv output U^T LN1(Z^{l-1}) with unit-norm "
    "tokens per head; R and sparsity of its output Z^l",
    "embeddings": "Z^0, the embedding output (hidden_states[0]), with block 1's U^1",
}


def _mean_std(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return values.mean(0), values.std(0, correction=0)


@dataclass
class SRRReport(ReportContract):
    """Per-layer mean/std over samples of ``R``, ``Rc``, ``sparsity``, ``srr`` at each measured state.

    ``layers`` are the block numbers ``1…L``; ``mean[state][term]`` and ``std[state][term]`` hold one float per
    block (std with ddof=0), ``[ℓ−1]`` for block ℓ. ``embeddings`` (``None`` for the official measurement) is
    ``{"mean": {term: float}, "std": {term: float}}`` of ``Z^0``. ``values`` (optional) holds the per-sample
    numbers, shape ``(num_samples, len(states), num_layers, 4)``, and ``embedding_values`` ``(num_samples, 4)``.
    The first state is the report's primary one (``output``, or ``official``): what :meth:`per_layer` and the
    unprefixed :meth:`summary` keys describe.

    Examples:
        >>> import torch, hf_tdiag
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification, SRRReport
        >>> _ = torch.manual_seed(0)
        >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10))
        >>> report = hf_tdiag.layer_srr(model, torch.randn(4, 1, 8, 8), progress=False)
        >>> again = SRRReport.from_json(report.to_json())  # to_json(path) writes a file, from_json(path) reads it
        >>> again.layers, again.per_layer("Rc") == report.per_layer("Rc"), again.summary() == report.summary()
        ([1, 2, 3, 4], True, True)
        >>> table = report.to_pandas()  # one row per state of each block (output, input, mid), and the embeddings
        >>> table.shape, table.columns.tolist()[:7]
        ((13, 11), ['layer', 'state', 'num_samples', 'R', 'Rc', 'sparsity', 'srr'])
    """

    states: tuple[str, ...]
    num_layers: int
    num_samples: int
    mean: dict[str, dict[str, list[float]]]
    std: dict[str, dict[str, list[float]]]
    settings: dict[str, Any] = field(default_factory=dict)
    values: torch.Tensor | None = None
    embeddings: dict[str, dict[str, float]] | None = None
    embedding_values: torch.Tensor | None = None

    @classmethod
    def from_values(
        cls,
        values: torch.Tensor,
        states: tuple[str, ...],
        settings: dict[str, Any],
        embedding_values: torch.Tensor | None = None,
    ) -> SRRReport:
        """Build a report from per-sample values ``(num_samples, S, L, 4)`` (and ``(num_samples, 4)`` of ``Z^0``)."""
        if values.ndim != 4 or values.shape[1] != len(states) or values.shape[3] != len(TERMS):
            raise ValueError(
                f"values: expected shape (num_samples, {len(states)}, L, {len(TERMS)}), got {tuple(values.shape)}"
            )
        if values.shape[0] == 0:
            raise ValueError("values: no samples were measured (the inputs were empty)")
        values = values.to(torch.float64)
        mean_t, std_t = _mean_std(values)
        mean = {s: {t: mean_t[i, :, j].tolist() for j, t in enumerate(TERMS)} for i, s in enumerate(states)}
        std = {s: {t: std_t[i, :, j].tolist() for j, t in enumerate(TERMS)} for i, s in enumerate(states)}
        embeddings = None
        if embedding_values is not None:
            if tuple(embedding_values.shape) != (values.shape[0], len(TERMS)):
                raise ValueError(
                    f"embedding_values: expected shape ({values.shape[0]}, {len(TERMS)}), got {tuple(embedding_values.shape)}"
                )
            embedding_values = embedding_values.to(torch.float64)
            e_mean, e_std = _mean_std(embedding_values)
            embeddings = {"mean": dict(zip(TERMS, e_mean.tolist())), "std": dict(zip(TERMS, e_std.tolist()))}
        return cls(
            tuple(states),
            values.shape[2],
            values.shape[0],
            mean,
            std,
            dict(settings),
            values,
            embeddings,
            embedding_values,
        )

    @property
    def layers(self) -> list[int]:
        """Block numbers ``1…L`` (``mean[state][term][ℓ−1]`` is block ℓ)."""
        return list(range(1, self.num_layers + 1))

    def per_layer(self, term: str = "srr", state: str | None = None) -> list[float]:
        """Means of ``term`` for blocks ``1…L`` at ``state`` (default: the primary state, block outputs ``Z^ℓ``)."""
        state = state or self.states[0]
        if state not in self.mean or term not in TERMS:
            raise ValueError(
                f"state/term: expected one of {list(self.mean)} and {list(TERMS)}, got {state!r}, {term!r}"
            )
        return list(self.mean[state][term])

    def summary(self) -> dict[str, float]:
        """Averages over blocks ``1…L`` and last-block values: ``srr_mean_over_layers``, ``srr_last_layer`` (Z^L), ...

        Keys of the primary state are unprefixed; other states are prefixed (``input_Rc_last_layer``,
        ``mid_srr_mean_over_layers``); ``embeddings_<term>`` are ``Z^0``'s values; ``num_samples`` is how many samples
        every mean is over.
        """
        out: dict[str, float] = {"num_samples": self.num_samples}
        for state in self.states:
            prefix = "" if state == self.states[0] else f"{state}_"
            for term in TERMS:
                per_layer = self.mean[state][term]
                out[f"{prefix}{term}_mean_over_layers"] = float(sum(per_layer) / len(per_layer))
                out[f"{prefix}{term}_last_layer"] = float(per_layer[-1])
        if self.embeddings is not None:
            for term in TERMS:
                out[f"embeddings_{term}"] = float(self.embeddings["mean"][term])
        return out

    def to_dict(self, include_samples: bool = False) -> dict[str, Any]:
        """JSON-ready dict: settings, layers, per-state per-term mean/std lists, embeddings, summary (+ samples)."""
        out: dict[str, Any] = {
            **stamp(KIND, FORMAT_VERSION),
            "measure": "sparse_rate_reduction",
            "measurement": self.settings.get("measurement", "design"),
            "settings": self.settings,
            "num_samples": self.num_samples,
            "layers": self.layers,
            "states": {s: STATE_DESCRIPTIONS.get(s, s) for s in self.states},
            "terms": list(TERMS),
            "embeddings": self.embeddings,
            "mean": self.mean,
            "std": self.std,
            "summary": self.summary(),
        }
        if include_samples:
            if self.values is None:
                raise ValueError("include_samples: this report has no per-sample values")
            out["samples"] = {
                s: {t: self.values[:, i, :, j].tolist() for j, t in enumerate(TERMS)} for i, s in enumerate(self.states)
            }
            if self.embedding_values is not None:
                out["embedding_samples"] = {t: self.embedding_values[:, j].tolist() for j, t in enumerate(TERMS)}
        return out

    def to_json(self, path: str | None = None, include_samples: bool = False, indent: int = 2) -> str:
        """:meth:`to_dict` as JSON text; also written (atomically) to ``path`` if given."""
        return super().to_json(path, indent=indent, include_samples=include_samples)

    def to_pandas(self):
        """One row per block and measured state: ``layer`` (1..L), ``state``, the means of R, Rc, sparsity, srr and
        their standard deviations (``<term>_std``); the embeddings ``Z^0`` are a row with ``layer`` 0."""
        columns = {"layer": INT, "state": STR, "num_samples": INT}
        columns.update({term: FLOAT for term in TERMS})
        columns.update({f"{term}_std": FLOAT for term in TERMS})
        rows = []
        if self.embeddings is not None:
            row = {"layer": 0, "state": "embeddings", "num_samples": self.num_samples}
            row.update(self.embeddings["mean"])
            row.update({f"{t}_std": v for t, v in self.embeddings["std"].items()})
            rows.append(row)
        for state in self.states:
            for i, ell in enumerate(self.layers):
                row = {"layer": ell, "state": state, "num_samples": self.num_samples}
                row.update({t: self.mean[state][t][i] for t in TERMS})
                row.update({f"{t}_std": self.std[state][t][i] for t in TERMS})
                rows.append(row)
        return typed_frame(rows, columns)

    def plot(self, **kwargs):
        """Per-layer Rᶜ, R, sparsity and SRR of each measured state (:func:`hf_tdiag.viz.plot_layer_srr`)."""
        from ..viz import plot_layer_srr

        return plot_layer_srr(self, **kwargs)

    @classmethod
    def from_dict(cls, data: Mapping) -> SRRReport:
        """Inverse of :meth:`to_dict` (per-sample values only if they were included); a JSON of another report, a
        newer format, or a field missing, mistyped or of the wrong length is one ValueError naming the field."""
        _check_json(data)
        states = tuple(data["states"])
        values = embedding_values = None
        if "samples" in data:
            values = torch.tensor(
                [[data["samples"][s][t] for t in TERMS] for s in states], dtype=torch.float64
            ).permute(2, 0, 3, 1)  # (S, 4, n, L) -> (n, S, L, 4)
        if data.get("embedding_samples") is not None:
            embedding_values = torch.tensor([data["embedding_samples"][t] for t in TERMS], dtype=torch.float64).T
        return cls(
            states,
            len(data["layers"]),
            int(data["num_samples"]),
            data["mean"],
            data["std"],
            dict(data["settings"]),
            values,
            data.get("embeddings"),
            embedding_values,
        )


KIND = "SRRReport"
#: the JSON format :meth:`SRRReport.to_dict` writes (JSON without ``format_version`` is format 1 too)
FORMAT_VERSION = 1
_PER_TERM = MapOf(ListOf(NUM), keys=TERMS)
_SCHEMA = Obj(
    {
        "settings": MapOf(ANY),
        "num_samples": JSON_INT,
        "layers": ListOf(JSON_INT),
        "states": MapOf(JSON_STR),
        "mean": MapOf(_PER_TERM),
        "std": MapOf(_PER_TERM),
    },
    optional={
        "measurement": Choice(*MEASUREMENTS),
        "embeddings": Nullable(Obj({"mean": MapOf(NUM, keys=TERMS), "std": MapOf(NUM, keys=TERMS)})),
        "samples": MapOf(MapOf(ListOf(ListOf(NUM)), keys=TERMS)),
        "embedding_samples": Nullable(MapOf(ListOf(NUM), keys=TERMS)),
    },
)


def _check_json(data) -> None:
    """The schema, then what it cannot say: one value per block for every listed state, blocks numbered 1..L, and
    per-sample lists of ``num_samples`` entries."""
    check_report(data, KIND, _SCHEMA, FORMAT_VERSION, measure=("measure", "sparse_rate_reduction"))
    num_layers, n = len(data["layers"]), data["num_samples"]
    if not data["states"]:
        raise report_error(KIND, "states", "expected at least one measured state, got none")
    if data["layers"] != list(range(1, num_layers + 1)):
        raise report_error(KIND, "layers", f"expected the block numbers 1..{num_layers}, got {data['layers']}")
    for part in ("mean", "std"):
        for state in data["states"]:
            if state not in data[part]:
                raise report_error(KIND, f"{part}.{state}", "missing (the state is listed in 'states')")
            for term in TERMS:
                if len(data[part][state][term]) != num_layers:
                    raise report_error(
                        KIND,
                        f"{part}.{state}.{term}",
                        f"expected {num_layers} values (one per block), got {len(data[part][state][term])}",
                    )
    for state in data["states"] if "samples" in data else ():
        for term in TERMS:
            rows = data["samples"].get(state, {}).get(term)
            if rows is None or len(rows) != n or any(len(r) != num_layers for r in rows):
                raise report_error(
                    KIND, f"samples.{state}.{term}", f"expected {n} lists of {num_layers} values (samples x blocks)"
                )
    if data.get("embedding_samples") is not None:
        for term in TERMS:
            if len(data["embedding_samples"][term]) != n:
                raise report_error(KIND, f"embedding_samples.{term}", f"expected {n} values (one per sample)")


__all__ = ["MEASUREMENTS", "STATE_DESCRIPTIONS", "STATES", "TERMS", "SRRReport"]
