"""A diagnostic's option is declared once, in its settings class: a field added there (and nowhere else) appears in
the Python function's signature, the command line's --help, the evaluate module's accepted keywords (and reaches its
validation), the Space's controls (when marked for it) and the docs' settings table."""

import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hf_tdiag.diagnostics.registry import DIAGNOSTICS, diagnostic, module_options
from hf_tdiag.diagnostics.settings import SETTINGS_CLASSES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import mkdocs_settings  # noqa: E402

# the one line the test adds: a new Schatten setting, marked for the Space
NEW_FIELD = (
    '    probe_knob: int = setting(3, "a knob only this test declares", bounds=POSITIVE_INT, '
    'space={"label": "Probe knob"})\n'
)

CHECKS = r"""
import contextlib, inspect, io, json, os, sys
import hf_tdiag
out = {"package": hf_tdiag.__file__}
from hf_tdiag.cli import main
text = io.StringIO()
with contextlib.redirect_stdout(text):
    try:
        main(["schatten", "--help"])
    except SystemExit:
        pass
out["help"] = text.getvalue()
out["signature"] = inspect.signature(hf_tdiag.schatten_bounds).parameters["probe_knob"].default
import evaluate, torch
from hf_tdiag import CrateConfig, CrateForImageClassification
module = evaluate.load(hf_tdiag.metric_path("schatten"))
model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10))
out["computed"] = module.compute(model=model, probe_knob=5)["schatten_bound"]
for bad in ({"probe_knob": 0}, {"probe_knobs": 5}):
    try:
        module.compute(model=model, **bad)
    except (ValueError, TypeError) as err:
        out.setdefault("refused", []).append(str(err))
from hf_tdiag.gradio_app import handlers
from hf_tdiag.gradio_app.layout import build_demo
out["space_labels"] = [getattr(b, "label", None) for b in build_demo().blocks.values()]
out["space_handler"] = inspect.signature(handlers.bounds_tab).parameters["probe_knob"].default
import mkdocs_settings
out["docs"] = mkdocs_settings.render("<!-- settings: schatten -->")
print(json.dumps(out, default=str))
"""


def test_a_field_added_to_a_settings_class_reaches_every_surface(tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "hf_tdiag", copy / "hf_tdiag", ignore=shutil.ignore_patterns("__pycache__"))
    settings = copy / "hf_tdiag" / "diagnostics" / "settings.py"
    text = settings.read_text()
    anchor = "class SchattenSettings(_Settings):"
    last = text.index("\n\n\n@dataclass", text.index(anchor))  # the end of the class body
    settings.write_text(text[:last] + "\n" + NEW_FIELD.rstrip("\n") + text[last:])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), str(ROOT / "scripts")]),
           "HF_MODULES_CACHE": str(tmp_path / "modules"), "TQDM_DISABLE": "1"}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", CHECKS], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["package"].startswith(str(copy))  # the copy, not the repository, was imported
    assert "--probe-knob" in out["help"] and "a knob only this test declares (default 3)" in " ".join(
        out["help"].split()
    )
    assert out["signature"] == 3
    assert out["computed"] > 0  # the evaluate module accepts the keyword and runs with it...
    assert out["refused"][0].startswith("probe_knob: expected a positive integer, got 0")  # ...validated as declared
    assert out["refused"][1].startswith("schatten: unknown argument(s) ['probe_knobs']")  # a misspelling is not
    assert "Probe knob" in out["space_labels"] and out["space_handler"] == 3
    row = next(line for line in out["docs"].splitlines() if line.startswith("| `probe_knob`"))
    assert "`--probe-knob`" in row and "a knob only this test declares" in row and "Probe knob" in row


def test_the_repository_does_not_hold_the_probe_field():
    """The field above exists only in the test's copy."""
    assert "probe_knob" not in {f.name for cls in SETTINGS_CLASSES for f in cls.fields()}


@pytest.mark.parametrize("name", sorted(DIAGNOSTICS))
def test_each_declaration_names_real_code_and_one_settings_class(name):
    d = diagnostic(name)
    function, report = d.load_function(), d.load_report()
    assert d.settings.diagnostic == name and d.command == name.replace("_", "-")
    params = inspect.signature(function).parameters
    for f in d.settings.fields():  # every field a keyword of the function, with its declared default
        assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY and params[f.name].default == f.default
    assert callable(report.from_json) and set(d.keywords()) <= set(module_options(d.metric))
    assert diagnostic(d.metric) is d and diagnostic(d.settings.__name__) is d


@pytest.mark.parametrize("name", sorted(DIAGNOSTICS))
def test_the_command_has_one_flag_per_declared_field(name):
    import argparse

    from hf_tdiag.cli import build_parser

    d = diagnostic(name)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[d.command]
    dests = {a.dest: a for a in sub._actions}
    for f in d.settings.fields():
        if f.cli:
            assert dests[f.name].default == f.default, f.name
        else:
            assert f.name not in dests, f.name


def test_a_keyword_given_wins_over_the_settings_object_and_an_unknown_one_is_refused():
    import torch

    import hf_tdiag
    from hf_tdiag import CrateConfig, CrateForImageClassification, ObjectiveLedgerSettings

    torch.manual_seed(0)
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=1))
    x = torch.randn(3, 1, 8, 8)
    base = ObjectiveLedgerSettings(tolerance=0.5)
    assert (
        hf_tdiag.objective_ledger(model, x, settings=base, tolerance=ObjectiveLedgerSettings.tolerance).tolerance
        == 1e-6
    )
    assert hf_tdiag.objective_ledger(model, x, settings=base).tolerance == 0.5
    with pytest.raises(
        TypeError, match=r"objective_ledger: unknown keyword\(s\) \['tolerence'\]; settings \(ObjectiveLedg"
    ):
        hf_tdiag.objective_ledger(model, x, tolerence=0.1)


def test_the_ledger_batches_a_tensor_by_its_batch_size():
    """Per-sample means do not depend on how the samples are cut into batches (one batch vs batches of 2)."""
    import torch

    import hf_tdiag
    from hf_tdiag import CrateConfig, CrateForImageClassification

    torch.manual_seed(1)
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2))
    x = torch.randn(5, 1, 8, 8)
    whole = hf_tdiag.objective_ledger(model, x, batch_size=5)
    split = hf_tdiag.objective_ledger(model, x, batch_size=2)
    by_hand = hf_tdiag.objective_ledger(model, [x[:2], x[2:4], x[4:]])
    assert whole.num_samples == split.num_samples == 5
    for a, b, c in zip(whole.steps, split.steps, by_hand.steps):
        assert (a.layer, a.step) == (b.layer, b.step)
        assert b.before == pytest.approx(a.before, rel=1e-6) and b.after == pytest.approx(a.after, rel=1e-6)
        assert (b.before, b.after) == (c.before, c.after)  # batch_size=2 is exactly the batches given by hand


def test_every_diagnostic_has_its_settings_table_in_the_docs_and_it_lists_every_field():
    pages = {p: p.read_text() for p in (ROOT / "docs").rglob("*.md")}
    for name, d in DIAGNOSTICS.items():
        holders = [p for p, text in pages.items() if f"<!-- settings: {name} -->" in text]
        assert len(holders) == 1, (name, holders)
        table = mkdocs_settings.render(f"<!-- settings: {name} -->")
        rows = [line for line in table.splitlines() if line.startswith("| `")]
        assert [row.split("`")[1] for row in rows] == list(d.keywords())
    with pytest.raises(ValueError, match="unknown diagnostic 'nope'"):
        mkdocs_settings.render("<!-- settings: nope -->")
