"""The docs site's sources stay in step with the code and the README stays short (no build here: fast checks only;
the strict build is tests/test_docs_build.py)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


def _config() -> dict:
    # mkdocs.yml has no custom YAML tags, so the safe loader reads it
    return yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page_or_the_benchmarks():
    nav = _nav_pages(_config()["nav"])
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert len(nav) == len(set(nav)), "a page is listed twice in mkdocs.yml's nav"
    assert pages - set(nav) <= set(), f"pages missing from the nav: {sorted(pages - set(nav))}"
    # docs/benchmarks.md is written separately; every other nav entry is a page of docs/
    assert set(nav) - pages <= {"benchmarks.md"}, f"nav entries without a page: {sorted(set(nav) - pages)}"


def test_the_package_map_has_a_paragraph_for_every_package():
    text = (DOCS / "packages.md").read_text(encoding="utf-8")
    described = set(re.findall(r"^\*\*`([\w]+)/`\*\*", text, flags=re.M))
    packages = {p.name for p in (REPO / "hf_tdiag").iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    assert packages == described, (
        f"missing: {sorted(packages - described)}; not in the tree: {sorted(described - packages)}"
    )


def test_the_command_line_page_names_every_command():
    text = (DOCS / "guide" / "cli.md").read_text(encoding="utf-8")
    import argparse

    from hf_tdiag.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = set(sub.choices)
    documented = set(re.findall(r"^\| `hf-tdiag ([\w-]+)", text, flags=re.M))
    assert commands == documented


def test_the_readme_is_short_and_keeps_the_two_commands():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 200
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest -q" in lines
    main_job = (
        "bash scripts/setup.sh && .venv/bin/python recipes/main_job.py --output-dir runs/main --overwrite-output-dir"
    )
    assert main_job in lines  # runs again as written (issue 44)
    assert "from the repository root" in text.lower()
    # the CI entry point runs the README's test command
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash scripts/setup.sh" in ci and ".venv/bin/python -m pytest -q" in ci


def test_links_between_the_readme_and_the_docs_resolve():
    """README links point at files of the repository (GitHub renders them); mkdocs checks the docs' own links."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local
    missing = [t for t in local if not (REPO / t).exists() and t != "docs/benchmarks.md"]
    assert not missing, f"README links to missing files: {missing}"


def test_stale_facts_stay_corrected():
    """Facts that were once wrong in the docs: the published-package install, a DESIGN.md, 16 concepts."""
    from hf_tdiag.diagnostics.settings import ConceptFidelitySettings  # torch-free

    files = [REPO / "README.md", *DOCS.rglob("*.md"), *(REPO / "hf_tdiag" / "metrics").glob("*/README.md")]
    for file in files:
        text = file.read_text(encoding="utf-8")
        assert "pip install hf-tdiag" not in text, file
        assert "DESIGN.md" not in text, file
        assert "[--breakdown]" not in text, file
    concepts = (DOCS / "guide" / "concepts.md").read_text(encoding="utf-8")
    assert f"The default number of concepts is {ConceptFidelitySettings.n_concepts}," in concepts


# ----------------------------------------------------------------------------- the design page

STAGES = ("model", "probe", "measure", "kernel", "diagnostic", "figures", "presentation", "application")
# what a stage may not import: a measure knows no model, probe or diagnostic; a probe knows no diagnostic; nothing
# of the chain model -> probe -> measure -> diagnostic knows the presentations or the applications built on it; the
# figures (a report's plot() calls them) know no other stage; the kernels under the measures know none either
FORBIDDEN = {
    "kernel": {"model", "probe", "measure", "diagnostic", "figures", "presentation", "application"},
    "model": {"probe", "diagnostic", "figures", "presentation", "application"},
    "probe": {"diagnostic", "figures", "presentation", "application"},
    "measure": {"model", "probe", "diagnostic", "figures", "presentation", "application"},
    "diagnostic": {"presentation", "application"},
    "figures": {"model", "probe", "measure", "diagnostic", "presentation", "application"},
}


def _design_stages() -> dict[str, str]:
    """package -> stage, from the table of docs/design.md."""
    text = (DOCS / "design.md").read_text(encoding="utf-8")
    out = {}
    for stage, packages in re.findall(r"^\| (\w+) \| ((?:`\w+`(?:, )?)+) \|", text, flags=re.M):
        for package in re.findall(r"`(\w+)`", packages):
            assert package not in out, f"{package} is in two rows of the design page's table"
            out[package] = stage
    return out


def _imported_packages(path: Path, source: str | None = None) -> set[str]:
    """The sub-packages of hf_tdiag that module ``path`` (text: ``source`` or the file's) imports, absolute or
    relative, at any depth (imports inside functions too)."""
    parts = path.relative_to(REPO).with_suffix("").parts  # ("hf_tdiag", "probes", "x")
    if source is None:
        source = path.read_text(encoding="utf-8")
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(parts[: len(parts) - node.level])
                names = [".".join([*base, *(node.module.split(".") if node.module else [])])]
                if not node.module:  # from .. import probes
                    names = [".".join([*base, a.name]) for a in node.names]
            else:
                names = [node.module or ""]
        for name in names:
            bits = name.split(".")
            if bits[0] == "hf_tdiag" and len(bits) > 1:
                found.add(bits[1])
    return found


def test_the_design_page_places_every_package_in_one_stage_and_the_stages_in_order():
    stages = _design_stages()
    packages = {p.name for p in (REPO / "hf_tdiag").iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    assert set(stages) == packages, (
        f"missing: {sorted(packages - set(stages))}; not in the tree: {sorted(set(stages) - packages)}"
    )
    assert set(stages.values()) == set(STAGES)
    order = re.findall(r"^\| (\w+) \|", (DOCS / "design.md").read_text(encoding="utf-8"), flags=re.M)
    assert [s for s in order if s in STAGES] == list(STAGES)
    wrong = []
    for package, stage in stages.items():
        if stage not in FORBIDDEN:
            continue
        for path in sorted((REPO / "hf_tdiag" / package).rglob("*.py")):
            bad = {stages.get(p) for p in _imported_packages(path)} & FORBIDDEN.get(stage, set())
            if bad:
                wrong.append(f"{path.relative_to(REPO)} ({stage}) imports a {sorted(bad)} package")
    assert not wrong, "\n".join(wrong)


def test_import_scan_reads_relative_and_absolute_imports():
    """The scanner above on hand-written modules (an independent check that it can find a violation)."""
    module = REPO / "hf_tdiag" / "measures" / "concepts" / "example.py"  # not read: the source is given
    source = "from ...probes import describe\nimport hf_tdiag.report.html\nfrom . import bound\n"
    source += "def f():\n    from ... import diagnostics\n    from ..coding_rate import sparsity\n"
    assert _imported_packages(module, source) == {"probes", "report", "measures", "diagnostics"}
    assert _imported_packages(REPO / "hf_tdiag" / "cli.py", "from .commands import srr\n") == {"commands"}


def test_the_design_page_formulas_avoid_what_the_math_scripts_would_escape():
    """pymdownx.arithmatex writes each formula into a <script type="math/tex"> with <, > and & escaped as entities,
    which MathJax then reads literally ("Misplaced &"): the page writes \\lt, \\gt instead."""
    text = (DOCS / "design.md").read_text(encoding="utf-8")
    formulas = re.findall(r"\$\$(.+?)\$\$", text, flags=re.S)
    formulas += re.findall(r"(?<![$\\])\$([^$\n]+)\$(?!\$)", re.sub(r"\$\$.+?\$\$", "", text, flags=re.S))
    assert len(formulas) >= 30
    bad = [f for f in formulas if re.search(r"[<>&]", f)]
    assert not bad, bad


def _defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False


def _resolves(dotted: str) -> bool:
    """``hf_tdiag.a.b.name`` names a module of the tree, or a name defined (or re-exported) in one, or a lazy export."""
    bits = dotted.split(".")
    for cut in range(len(bits), 0, -1):
        base = REPO.joinpath(*bits[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            rest = bits[cut:]
            if not rest:
                return True
            if len(rest) == 1 and _defines(module, rest[0]):
                return True
            if cut == 1 and len(rest) == 1:  # hf_tdiag.<lazy export>
                return f'"{rest[0]}": "hf_tdiag.' in module.read_text(encoding="utf-8")
            return False
    return False


def test_every_function_the_design_page_names_is_in_the_tree():
    text = (DOCS / "design.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(hf_tdiag(?:\.\w+)+)`", text))
    paths = set(re.findall(r"`(hf_tdiag/[\w/.]+\.py)`", text))
    assert len(named) >= 15
    missing = sorted(n for n in named if not _resolves(n)) + sorted(p for p in paths if not (REPO / p).is_file())
    assert not missing, f"the design page names what the tree does not have: {missing}"
    assert not _resolves("hf_tdiag.measures.coding_rate.no_such_function")  # the check can fail


# ----------------------------------------------------------------------------- docstring examples

PUBLIC_WITH_EXAMPLES = (
    "layer_srr",
    "schatten_bounds",
    "concept_fidelity",
    "attention_svm_diagnostic",
    "objective_ledger",
    "SRRReport",
    "SchattenReport",
    "ConceptFidelityReport",
    "AttentionSVMReport",
    "ObjectiveLedgerReport",
    "SRRSettings",
    "SchattenSettings",
    "ConceptFidelitySettings",
    "AttentionSVMSettings",
    "CrateConfig",
    "metric_path",
)


def _lazy_exports() -> dict[str, str]:
    tree = ast.parse((REPO / "hf_tdiag" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_LAZY" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("hf_tdiag/__init__.py: no _LAZY table")


def _docstring(module: str, name: str) -> str | None:
    """The docstring of ``name`` where it is defined: in ``module``, or where ``module`` imports it from."""
    path = REPO.joinpath(*module.split("."))
    package = path.with_suffix(".py").is_file() is False
    path = path / "__init__.py" if package else path.with_suffix(".py")
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return ast.get_docstring(node)
        if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
            base = module.split(".") if package else module.split(".")[:-1]
            base = base[: len(base) - node.level + 1] if node.level else []
            return _docstring(".".join([*base, *(node.module or "").split(".")]).strip("."), name)
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_LAZY" for t in node.targets):
            try:  # a lazy export table: "Name": "module:attr"
                table = ast.literal_eval(node.value)
            except ValueError:  # built from the family table (**FAMILIES[...].exports()): read it as imported
                table = importlib.import_module(module)._LAZY
            if name in table:
                target, _, attr = table[name].partition(":")
                return _docstring(target, attr)
    return None


def test_public_names_have_examples_with_output():
    """Each public function, settings class and report of ``hf_tdiag`` shows an example with its output (they run as
    doctests in tests/test_docs_doctests.py, with the slow tests)."""
    import doctest

    lazy = _lazy_exports()
    problems = []
    for name in PUBLIC_WITH_EXAMPLES:
        module, _, attr = lazy.get(name, "hf_tdiag:" + name).partition(":")
        doc = _docstring(module, attr)
        if doc is None:
            problems.append(f"{name}: no docstring found in {module}")
            continue
        examples = doctest.DocTestParser().get_examples(doc)
        if not re.search(r"^Examples?:$", doc, flags=re.M) or not examples:
            problems.append(f"{name}: no Examples: section with >>> lines")
        elif not any(ex.want.strip() for ex in examples):
            problems.append(f"{name}: the example shows no output")
        elif any(ex.options for ex in examples):
            problems.append(f"{name}: an example is skipped or flagged")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- changelog and screenshots


def _changelog_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("changelog", REPO / "scripts" / "changelog.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_root_changelog_is_the_docs_changelog_with_links_from_the_root():
    script = _changelog_script()
    docs_text = (DOCS / "changelog.md").read_text(encoding="utf-8")
    root_text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert root_text == script.render(docs_text), "CHANGELOG.md is stale: run python scripts/changelog.py"
    # the same entries, and every relative link of the root file reaches a file from the repository root
    assert [ln for ln in root_text.splitlines() if ln.startswith("#")] == [
        ln for ln in docs_text.splitlines() if ln.startswith("#")
    ]
    for target in re.findall(r"\]\(([^)#\s]+)", root_text):
        if not re.match(r"[a-z]+:", target):
            assert (REPO / target).exists(), target


def test_changelog_links_are_rebased_by_hand():
    render = _changelog_script().render
    text = "[a](conventions.md#layers) [b](https://x.org/a.md) [c](#here) ![f](figures/a.png) [d](../README.md)"
    body = render(text).split("\n", 1)[1]
    assert body == (
        "[a](docs/conventions.md#layers) [b](https://x.org/a.md) [c](#here) ![f](docs/figures/a.png) [d](README.md)"
    )


SCREENSHOTS = ("docs_home.png", "docs_guide_srr.png", "docs_api.png", "docs_design_formulas.png")


def test_the_site_screenshots_are_kept_with_the_docs():
    from PIL import Image

    for name in SCREENSHOTS:
        path = DOCS / "figures" / "screenshots" / name
        with Image.open(path) as im:
            assert im.format == "PNG" and im.size[0] == 1400 and im.size[1] >= 900, (name, im.size)
        assert path.stat().st_size < 400_000, f"{name}: keep screenshots small (scripts/docs_screenshots.py)"
