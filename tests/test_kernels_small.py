"""hf_tdiag.kernels.small: each kernel is torch.linalg's call at one thread, the caller's count restored; the
measures set no thread count themselves and import nothing above them; a diagnostic runs under its declared policy."""

import ast
import os

import pytest
import torch

import hf_tdiag
from hf_tdiag import _threads
from hf_tdiag._threads import torch_threads
from hf_tdiag.kernels import small

PACKAGE = os.path.dirname(hf_tdiag.__file__)


def _spd(k=6, batch=3, seed=0):
    a = torch.randn(batch, k, 2 * k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.eye(k, dtype=torch.float64) + a @ a.mT


CASES = {
    "cholesky_ex": (lambda m: small.cholesky_ex(m)[0], lambda m: torch.linalg.cholesky(m), "cholesky_ex"),
    "eigvalsh": (small.eigvalsh, lambda m: torch.linalg.eigvalsh(m), "eigvalsh"),
    "solve_lower": (
        lambda m: small.solve_lower(torch.linalg.cholesky(m), m),
        lambda m: torch.linalg.inv(torch.linalg.cholesky(m)) @ m,
        "solve_triangular",
    ),
    "qr_r": (lambda m: small.qr_r(m).abs(), lambda m: torch.linalg.cholesky(m.mT @ m).mT.abs(), "qr"),
    "svdvals": (small.svdvals, lambda m: torch.linalg.eigvalsh(m).flip(-1), "svdvals"),  # SPD: σ = λ
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_equals_an_independent_computation_at_one_thread_and_restores_the_count(name, monkeypatch):
    kernel, reference, torch_name = CASES[name]
    mat = _spd()
    expected = reference(mat)  # computed before the spy below is installed
    seen = []
    original = getattr(torch.linalg, torch_name)

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.linalg, torch_name, spy)
    with torch_threads(2):
        out = kernel(mat)
        assert torch.get_num_threads() == 2
    assert seen and set(seen) == {1}
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)


def _imports(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield ("." * node.level) + (node.module or ""), [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def _calls(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    return {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}


def _files(sub):
    for root, _, files in os.walk(os.path.join(PACKAGE, sub)):
        yield from (os.path.join(root, f) for f in files if f.endswith(".py"))


# what the math layer may import from the rest of hf_tdiag: validation, progress bars, the defaults, the kernels
MEASURES_MAY_IMPORT = ("_validation", "_progress", "_defaults", "kernels")


def test_measures_set_no_thread_count_and_import_nothing_above_them():
    bad = []
    for path in _files("measures"):
        rel = os.path.relpath(path, PACKAGE)
        depth = rel.count(os.sep)  # measures/x.py -> 1: "..name" leaves the measures package
        for module, names in _imports(path):
            if "threadpoolctl" in module or "_threads" in module:
                bad.append(f"{rel}: imports {module}")
            dots = len(module) - len(module.lstrip("."))
            if dots > depth:  # relative import out of hf_tdiag/measures
                top = module.lstrip(".").split(".")[0] or names[0]
                if top not in MEASURES_MAY_IMPORT:
                    bad.append(f"{rel}: imports {module}")
            if module.startswith("hf_tdiag."):
                bad.append(f"{rel}: absolute import {module}")
        if _calls(path) & {"set_num_threads", "threadpool_limits", "limit"}:
            bad.append(f"{rel}: sets a thread count")
    assert not bad, bad


def test_kernels_import_only_the_thread_helpers():
    for path in _files("kernels"):
        for module, _ in _imports(path):
            if module.startswith("."):
                assert module.lstrip(".").split(".")[0] in ("", "_threads", "gram", "lapack", "small"), (path, module)


def _tiny_crate():
    from hf_tdiag import CrateConfig, CrateForImageClassification

    cfg = CrateConfig.from_preset(
        "crate-digits", hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_labels=3
    )
    return CrateForImageClassification(cfg).eval()


@pytest.mark.parametrize("idle, expected", [(1, 1), (4, 2)])
def test_a_dense_diagnostic_runs_at_the_callers_count_capped_by_the_idle_cores(monkeypatch, idle, expected):
    monkeypatch.setattr(_threads, "idle_cores", lambda: idle)
    model = _tiny_crate()
    seen = []
    for module in model.modules():  # whichever part of the model the diagnostic calls
        module.register_forward_hook(lambda *a: seen.append(torch.get_num_threads()))
    with torch_threads(2):
        hf_tdiag.layer_srr(model, torch.rand(2, 1, 8, 8), batch_size=2, progress=False)
        assert torch.get_num_threads() == 2
    assert seen and set(seen) == {expected}


def test_the_attention_svm_diagnostic_runs_at_one_thread(monkeypatch):
    monkeypatch.setattr(_threads, "idle_cores", lambda: 4)
    model = _tiny_crate()
    seen = []
    for module in model.modules():  # whichever part of the model the diagnostic calls
        module.register_forward_hook(lambda *a: seen.append(torch.get_num_threads()))
    with torch_threads(2):
        hf_tdiag.attention_svm_diagnostic(model, torch.rand(2, 1, 8, 8), 1, 0, max_queries=2)
    assert seen and set(seen) == {1}


def test_thread_policy_is_the_declared_kind():
    from hf_tdiag.diagnostics.entry import thread_policy
    from hf_tdiag.diagnostics.registry import DIAGNOSTICS

    assert DIAGNOSTICS["attention_svm"].threads == "small" and DIAGNOSTICS["srr"].threads == "dense"
    with torch_threads(2), thread_policy("attention_svm") as n:
        assert n == 1 and torch.get_num_threads() == 1
