"""Versioned, validated report JSON (issue 45): every report writes its ``kind`` and ``format_version``; ``from_json``
reads back what ``to_json`` wrote, accepts JSON written before the two keys existed (format 1), and refuses another
report's JSON, a newer format, a truncated text and every field removed or given the wrong type, in one line that
names the field (one shared validator: hf_tdiag/diagnostics/report_json.py). The tables below are generated from
real reports of a tiny CRATE: every top-level field of every report, dropped and mistyped."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

import hf_tdiag
from hf_tdiag import (
    AttentionSVMReport,
    ConceptFidelityReport,
    CrateConfig,
    CrateForImageClassification,
    ObjectiveLedgerReport,
    SchattenReport,
    SRRReport,
)
from hf_tdiag.diagnostics.report_json import ReportFormatError


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    """``to_dict()`` of one report of each kind, of one tiny model (2 blocks, 8x8 images)."""
    torch.manual_seed(0)
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2))
    model.eval()
    x = torch.randn(4, 1, 8, 8)
    return {
        "SRRReport": hf_tdiag.layer_srr(model, x, progress=False).to_dict(include_samples=True),
        "SchattenReport": hf_tdiag.schatten_bounds(model).to_dict(),
        "AttentionSVMReport": hf_tdiag.attention_svm_diagnostic(model, x[:2], layer=1, head=0, max_queries=6).to_dict(),
        "ConceptFidelityReport": hf_tdiag.concept_fidelity(
            model, x, layer=2, concepts=2, bounds=False, progress=False
        ).to_dict(),
        "ObjectiveLedgerReport": hf_tdiag.objective_ledger(model, x).to_dict(),
    }


CLASSES = {
    "SRRReport": SRRReport,
    "SchattenReport": SchattenReport,
    "AttentionSVMReport": AttentionSVMReport,
    "ConceptFidelityReport": ConceptFidelityReport,
    "ObjectiveLedgerReport": ObjectiveLedgerReport,
}

# the top-level fields each report's from_dict reads (dropping one must be named)
REQUIRED = {
    "SRRReport": ["settings", "num_samples", "layers", "states", "mean", "std"],
    "SchattenReport": [
        "model", "model_type", "family", "num_layers", "hidden_size", "num_heads", "head_dim", "intermediate_size",
        "L_phi", "rank_tol", "p_grid", "schatten_bound", "edelman_bound", "alpha", "xi", "matrices",
    ],
    "AttentionSVMReport": [
        "layer", "head", "family", "include_bias", "causal", "rotary", "correlation", "correlation_in_span",
        "margin_ratio", "svm_margin", "one_hot_fraction", "one_hot_fraction_all", "one_hot_threshold",
        "head_margins", "svm_margins", "max_probs", "query_index", "selected", "svm", "svm_arrays",
    ],
    "ConceptFidelityReport": ["layer", "kl"],
    "ObjectiveLedgerReport": ["family", "model_type", "num_layers", "num_samples", "eps", "tolerance", "steps"],
}  # fmt: skip

DROPS = [(kind, name) for kind, names in REQUIRED.items() for name in names]
WRONG_TYPES = [(kind, name) for kind, names in REQUIRED.items() for name in names if name not in ("settings", "norm")]


def _read(kind: str, data) -> object:
    return CLASSES[kind].from_json(json.dumps(data))


def _text(kind: str, report) -> str:
    """The report's JSON (with the per-sample values where the report has them), keys sorted."""
    data = report.to_dict(include_samples=True) if kind == "SRRReport" else report.to_dict()
    return json.dumps(data, sort_keys=True)


@pytest.mark.parametrize("kind", list(CLASSES))
def test_every_report_writes_its_kind_and_format_and_reads_itself_back(reports, kind):
    data = reports[kind]
    assert data["kind"] == kind and data["format_version"] == 1 + (kind == "SchattenReport")
    assert _text(kind, _read(kind, data)) == json.dumps(data, sort_keys=True)


@pytest.mark.parametrize("kind", list(CLASSES))
def test_json_from_before_the_version_is_read_as_format_1(reports, kind):
    old = {k: v for k, v in reports[kind].items() if k not in ("kind", "format_version")}
    if kind == "SchattenReport":  # format 1 of the Schatten report: 0-based layers and the old bound names
        old["ours"], old["edelman"] = old.pop("schatten_bound"), old.pop("edelman_bound")
        old["matrices"] = [dict(m, layer=m["layer"] - 1) for m in old["matrices"]]
    assert _text(kind, _read(kind, old)) == json.dumps(reports[kind], sort_keys=True)  # now with kind and version


@pytest.mark.parametrize("kind, name", DROPS, ids=[f"{k}-{n}" for k, n in DROPS])
def test_a_missing_field_is_named(reports, kind, name):
    data = copy.deepcopy(reports[kind])
    del data[name]
    with pytest.raises(ReportFormatError) as info:
        _read(kind, data)
    assert str(info.value) == f"{kind} JSON: field {name!r}: missing"


@pytest.mark.parametrize("kind, name", WRONG_TYPES, ids=[f"{k}-{n}" for k, n in WRONG_TYPES])
def test_a_field_of_the_wrong_type_is_named(reports, kind, name):
    data = copy.deepcopy(reports[kind])
    data[name] = "abc" if not isinstance(data[name], str) else 12.5
    with pytest.raises(ReportFormatError) as info:
        _read(kind, data)
    message = str(info.value)
    assert message.startswith(f"{kind} JSON: field {name!r}: expected ") and "got" in message
    assert "\n" not in message


# (case, report, edit of the dict, text the one-line error must hold)
def _set(path: str, value):
    def edit(d):
        keys = path.split("/")
        target = d
        for k in keys[:-1]:
            target = target[int(k)] if isinstance(target, list) else target[k]
        last = keys[-1]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return edit


def _drop(path: str):
    def edit(d):
        keys = path.split("/")
        target = d
        for k in keys[:-1]:
            target = target[int(k)] if isinstance(target, list) else target[k]
        del target[keys[-1]]

    return edit


NESTED = [
    ("srr: a string among the means", "SRRReport", _set("mean/output/srr/1", "abc"), "'mean.output.srr[1]': expected a number, got 'abc'"),
    ("srr: one block short", "SRRReport", _set("mean/output/Rc", [0.5]), "'mean.output.Rc': expected 2 values"),
    ("srr: a state listed but not measured", "SRRReport", _drop("std/mid"), "'std.mid': missing"),
    ("srr: a term missing", "SRRReport", _drop("mean/input/R"), "'mean.input.R': missing"),
    ("srr: layers numbered from 0", "SRRReport", _set("layers", [0, 1]), "'layers': expected the block numbers 1..2"),
    ("srr: a wrong measure", "SRRReport", _set("measure", "schatten_bound"), "'measure': expected 'sparse_rate_reduction'"),
    ("srr: unknown measurement", "SRRReport", _set("measurement", "guess"), "'measurement': expected one of"),
    ("srr: samples of another count", "SRRReport", _set("num_samples", 3), "'samples.output.R': expected 3 lists"),
    ("srr: a bool as the sample count", "SRRReport", _set("num_samples", True), "'num_samples': expected an integer"),
    ("srr: embeddings without std", "SRRReport", _drop("embeddings/std"), "'embeddings.std': missing"),
    ("srr: no states", "SRRReport", _set("states", {}), "'states': expected at least one"),
    ("schatten: a record's type unknown", "SchattenReport", _set("matrices/0/type", "qkv"), "'matrices[0].type': expected one of"),
    ("schatten: a shape of 3 numbers", "SchattenReport", _set("matrices/1/shape", [1, 2, 3]), "'matrices[1].shape': expected 2 entries"),
    ("schatten: a record without rank", "SchattenReport", _drop("matrices/2/rank"), "'matrices[2].rank': missing"),
    ("schatten: a string bound", "SchattenReport", _set("schatten_bound", "12.3"), "'schatten_bound': expected a number, got '12.3'"),
    ("schatten: null p_opt", "SchattenReport", _set("matrices/0/p_opt", None), "'matrices[0].p_opt': expected a number, got None"),
    ("schatten: a text layer_gains", "SchattenReport", _set("layer_gains", "x"), "'layer_gains': expected a list"),
    ("schatten: a newer format", "SchattenReport", _set("format_version", 3), "3 is newer than this hf-tdiag reads (2)"),
    ("schatten: format as text", "SchattenReport", _set("format_version", "2"), "'format_version': expected a positive integer"),
    ("att-svm: one query more in a list", "AttentionSVMReport", lambda d: d["max_probs"].append(0.5), "'max_probs': expected 6 entries"),
    ("att-svm: svm without solver", "AttentionSVMReport", _drop("svm/solver"), "'svm.solver': missing"),
    ("att-svm: a query index of 3", "AttentionSVMReport", _set("query_index/0", [0, 1, 2]), "'query_index[0]': expected 2 entries"),
    ("att-svm: a nested list as an SVM array", "AttentionSVMReport", _set("svm_arrays/margins", ["x"]), "'svm_arrays.margins[0]': expected a number, got 'x'"),
    ("att-svm: iterations as text", "AttentionSVMReport", _set("svm/iterations", "7"), "'svm.iterations': expected an integer"),
    ("att-svm: a newer format", "AttentionSVMReport", _set("format_version", 2), "2 is newer"),
    ("concepts: a sweep keyed by names", "ConceptFidelityReport", lambda d: d.update(per_layer={"last": {"layer": 2, "kl": 0.1}}), "'per_layer.last': expected a layer number"),
    ("concepts: a sweep layer without kl", "ConceptFidelityReport", lambda d: d.update(per_layer={"2": {"layer": 2}}), "'per_layer.2.kl': missing"),
    ("concepts: an empty sweep", "ConceptFidelityReport", lambda d: d.update(per_layer={}), "'per_layer': expected at least one layer"),
    ("concepts: a text top-1", "ConceptFidelityReport", _set("top1_agreement", "high"), "'top1_agreement': expected a number or null"),
    ("ledger: a step without after", "ObjectiveLedgerReport", _drop("steps/0/after"), "'steps[0].after': missing"),
    ("ledger: a layer as text", "ObjectiveLedgerReport", _set("steps/1/layer", "one"), "'steps[1].layer': expected an integer"),
    ("ledger: steps as an object", "ObjectiveLedgerReport", _set("steps", {}), "'steps': expected a list"),
]  # fmt: skip


@pytest.mark.parametrize("case, kind, edit, expected", NESTED, ids=[c[0] for c in NESTED])
def test_a_nested_field_is_named(reports, case, kind, edit, expected):
    data = copy.deepcopy(reports[kind])
    edit(data)
    with pytest.raises(ReportFormatError) as info:
        _read(kind, data)
    assert expected in str(info.value) and str(info.value).startswith(f"{kind} JSON: ")


OTHER = [(a, b) for a in CLASSES for b in CLASSES if a != b]


@pytest.mark.parametrize("reader, written", OTHER, ids=[f"{a}-reads-{b}" for a, b in OTHER])
def test_another_reports_json_is_refused_by_kind(reports, reader, written):
    with pytest.raises(ReportFormatError) as info:
        _read(reader, reports[written])
    assert f"this is the JSON of {written!r}, not of {reader}" in str(info.value)


@pytest.mark.parametrize("kind", list(CLASSES))
@pytest.mark.parametrize("text, expected", [
    ('{"kind": "SRRReport", "layers": [1, 2', "not valid JSON"),
    ("[1, 2, 3]", "path_or_text: expected a report's JSON text or the path of a JSON file, got '[1, 2, 3]'"),
    ('"a string"', "expected a report's JSON text or the path"),
    ("", "expected a report's JSON text or the path"),
])  # fmt: skip
def test_truncated_or_other_json_text_is_one_line(kind, text, expected):
    with pytest.raises(ValueError) as info:
        CLASSES[kind].from_json(text)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_nan_written_by_the_srr_report_reads_back_as_nan(reports):
    data = copy.deepcopy(reports["SRRReport"])
    data["mean"]["output"]["srr"][0] = math.nan
    again = SRRReport.from_json(json.dumps(data))
    assert math.isnan(again.per_layer("srr")[0])
