"""The docstring examples run as doctests and print what they show, offline:

* the ``evaluate`` modules' ``Examples:`` sections (``_KWARGS_DESCRIPTION``, which ``evaluate`` shows as the module's
  usage), each on a seeded random-weights CRATE;
* every ``>>>`` example in the package's own docstrings — the public functions, settings and reports of
  ``hf_tdiag`` (``tests/test_docs_site.py`` checks, without running them, that each public name has one), the model
  configurations — each on a tiny model.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PACKAGE = Path(__file__).resolve().parents[1] / "hf_tdiag"
METRICS = PACKAGE / "metrics"
MODULES = sorted(p for p in METRICS.glob("*/*.py") if p.stem == p.parent.name)
# modules of the package whose docstrings hold examples (the evaluate modules are run above, through their text)
EXAMPLE_MODULES = sorted(
    p for p in PACKAGE.rglob("*.py") if METRICS not in p.parents and ">>> " in p.read_text(encoding="utf-8")
)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def kwargs_description(path: Path) -> str:
    """The module's ``_KWARGS_DESCRIPTION`` string as the module builds it (its settings lines come from the
    diagnostic's declaration)."""
    module = importlib.import_module(f"hf_tdiag.metrics.{path.parent.name}.{path.stem}")
    text = getattr(module, "_KWARGS_DESCRIPTION", None)
    assert isinstance(text, str), f"{path}: no _KWARGS_DESCRIPTION"
    return text


def test_every_bundled_module_is_found():
    assert {"srr", "schatten", "concept_fidelity", "attention_svm", "objective_ledger", "token_snr"} <= {
        p.stem for p in MODULES
    }


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_module_examples_run_and_show_their_output(path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = kwargs_description(path)
    test = doctest.DocTestParser().get_doctest(text, {}, path.stem, str(path), 0)
    assert len(test.examples) >= 4, "the example loads the module, computes and prints a result"
    assert all(not ex.options for ex in test.examples), "no example is skipped (doctest: +SKIP)"
    assert any(ex.want.strip() for ex in test.examples), "the example shows the output it prints"
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{path.name}: {result.failed} of {result.attempted} examples failed (output above)"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def test_the_public_examples_are_found():
    names = {_module_name(p) for p in EXAMPLE_MODULES}
    assert {"hf_tdiag.diagnostics.srr", "hf_tdiag.diagnostics.settings", "hf_tdiag"} <= names


@pytest.mark.parametrize("path", EXAMPLE_MODULES, ids=_module_name)
def test_docstring_examples_run_and_show_their_output(path, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    module = importlib.import_module(_module_name(path))
    # the module's own objects (lazy exports of hf_tdiag are documented where they are defined)
    tests = [t for t in doctest.DocTestFinder(exclude_empty=True).find(module, globs={}) if t.examples]
    assert tests, f"{path}: no docstring with examples was found"
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in tests:
        assert all(doctest.SKIP not in ex.options for ex in test.examples), f"{test.name}: an example is skipped"
        assert any(ex.want.strip() for ex in test.examples), f"{test.name}: the example shows no output"
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{path.name}: {result.failed} of {result.attempted} examples failed (output above)"
