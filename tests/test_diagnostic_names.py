"""One name per diagnostic: its registry key is the report section, the settings' ``diagnostic``, the evaluate
module's folder, the command (hyphenated), the diagnostics module, and the settings and report classes' names."""

import os
import re

import pytest

import hf_tdiag
from hf_tdiag._defaults import REPORT_SECTIONS
from hf_tdiag.cli import build_parser
from hf_tdiag.diagnostics.registry import DIAGNOSTICS, diagnostic
from hf_tdiag.zoo.worker import SCANNED

NAMES = sorted(DIAGNOSTICS)
ACRONYMS = {"srr": "SRR", "svm": "SVM", "snr": "SNR"}


def _camel(name: str) -> str:
    """``attention_svm`` → ``AttentionSVM``: the class-name spelling of a diagnostic's name."""
    return "".join(ACRONYMS.get(part, part.capitalize()) for part in name.split("_"))


def test_camel_spelling_of_a_name():
    assert [_camel(n) for n in ("srr", "attention_svm", "concept_fidelity", "token_snr")] == [
        "SRR",
        "AttentionSVM",
        "ConceptFidelity",
        "TokenSNR",
    ]


@pytest.mark.parametrize("name", NAMES)
def test_every_surface_uses_the_diagnostics_one_name(name):
    d = DIAGNOSTICS[name]
    assert d.name == name and d.settings.diagnostic == name
    assert d.command == name.replace("_", "-") and d.metric == name
    assert os.path.isfile(os.path.join(hf_tdiag.metric_path(name), f"{name}.py"))
    assert d.settings.__name__ == f"{_camel(name)}Settings"
    function_module, _, function_name = d.function.partition(":")
    report_module, _, report_class = d.report.partition(":")
    assert re.fullmatch(rf"hf_tdiag\.diagnostics\.{name}(\.\w+)?", function_module), d.function
    assert re.fullmatch(rf"hf_tdiag\.diagnostics\.{name}(_report|\.\w+)?", report_module), d.report
    assert report_class.lower().startswith(_camel(name).lower()) and report_class.endswith("Report")
    assert name.split("_")[-1] in function_name  # layer_srr, schatten_bounds, attention_svm_diagnostic, ...
    assert getattr(hf_tdiag, function_name) is d.load_function()
    assert diagnostic(name.replace("_", "-")) is d


def test_the_command_line_has_one_command_per_diagnostic_named_after_it():
    commands = set(build_parser()._subparsers._group_actions[0].choices)
    assert {DIAGNOSTICS[n].command for n in NAMES} <= commands
    assert not {n for n in NAMES if "_" in n} & commands  # no underscore spelling as a second command name


def test_report_sections_and_scan_use_the_same_names():
    assert set(REPORT_SECTIONS) - {"summary"} <= set(NAMES)
    assert set(SCANNED) <= set(NAMES)
    from hf_tdiag.report.report import SECTIONS

    assert list(SECTIONS) == list(REPORT_SECTIONS)


def test_each_metric_module_is_named_after_its_diagnostic():
    root = os.path.dirname(hf_tdiag.metric_path("srr"))
    folders = {entry for entry in os.listdir(root) if os.path.isfile(os.path.join(root, entry, f"{entry}.py"))}
    assert folders == set(NAMES)
    for name in NAMES:
        with open(os.path.join(hf_tdiag.metric_path(name), f"{name}.py"), encoding="utf-8") as f:
            source = f.read()
        assert f'diagnostic("{name}")' in source  # the module reads its own declaration by the one name
