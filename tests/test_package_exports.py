"""The package's lazy exports: every listed name resolves to the object in its module; unknown names fail clearly."""

import importlib
import subprocess
import sys

import pytest

import hf_tdiag
import hf_tdiag.training


@pytest.mark.parametrize("package", [hf_tdiag, hf_tdiag.training])
def test_lazy_exports_resolve_to_their_modules(package):
    for name, target in package._LAZY.items():
        module_name, attr = target.split(":")
        assert getattr(package, name) is getattr(importlib.import_module(module_name), attr)
        assert name in package.__all__ and name in vars(package)  # cached after the first access
    with pytest.raises(AttributeError, match=rf"module '{package.__name__}' has no attribute 'not_a_name'"):
        _ = package.not_a_name


def test_importing_the_package_does_not_import_the_heavy_parts():
    code = (
        "import sys, hf_tdiag; "
        "print(sorted(m for m in ('hf_tdiag.training.loop', 'hf_tdiag.diagnostics.schatten', 'hf_tdiag.diagnostics.srr', 'evaluate') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_metric_path_lists_the_bundled_modules():
    with pytest.raises(
        ValueError,
        match=r"unknown metric 'nope'; available: \['attention_svm', 'concept_fidelity', 'objective_ledger', 'schatten', 'srr', 'token_snr'\]",
    ):
        hf_tdiag.metric_path("nope")
