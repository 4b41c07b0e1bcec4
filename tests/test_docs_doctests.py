"""The examples in the `evaluate` modules' docstrings (their ``Examples:`` sections, which ``evaluate`` shows as the
module's usage) run as doctests and print what they show: each on a seeded random-weights CRATE, offline."""

from __future__ import annotations

import ast
import doctest
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

METRICS = Path(__file__).resolve().parents[1] / "hf_tdiag" / "metrics"
MODULES = sorted(p for p in METRICS.glob("*/*.py") if p.stem == p.parent.name)


def kwargs_description(path: Path) -> str:
    """The module's ``_KWARGS_DESCRIPTION`` string, read without importing the module."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_KWARGS_DESCRIPTION" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path}: no _KWARGS_DESCRIPTION")


def test_every_bundled_module_is_found():
    assert {"srr", "schatten_bound", "concept_fidelity", "attention_svm"} <= {p.stem for p in MODULES}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_module_examples_run_and_show_their_output(path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = kwargs_description(path)
    test = doctest.DocTestParser().get_doctest(text, {}, path.stem, str(path), 0)
    assert len(test.examples) >= 4, "the example loads the module, computes and prints a result"
    assert all(not ex.options for ex in test.examples), "no example is skipped (doctest: +SKIP)"
    assert any(ex.want.strip() for ex in test.examples), "the example shows the output it prints"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{path.name}: {result.failed} of {result.attempted} examples failed (output above)"
