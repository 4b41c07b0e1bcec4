"""The docs site's sources stay in step with the code and the README stays short (no build here: fast checks only;
the strict build is tests/test_docs_build.py)."""

from __future__ import annotations

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
    assert "bash scripts/setup.sh && .venv/bin/python recipes/main_job.py --output-dir runs/main" in lines
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
    from hf_tdiag.diagnostics.settings import ConceptSettings  # torch-free

    files = [REPO / "README.md", *DOCS.rglob("*.md"), *(REPO / "hf_tdiag" / "metrics").glob("*/README.md")]
    for file in files:
        text = file.read_text(encoding="utf-8")
        assert "pip install hf-tdiag" not in text, file
        assert "DESIGN.md" not in text, file
        assert "[--breakdown]" not in text, file
    concepts = (DOCS / "guide" / "concepts.md").read_text(encoding="utf-8")
    assert f"The default number of concepts is {ConceptSettings.n_concepts}," in concepts
