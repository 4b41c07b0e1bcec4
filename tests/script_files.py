"""Helpers for tests of the repository's scripts: load a recipe or script by path, and read a folder's files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str | None = None):
    """The module at ``REPO / relative`` (e.g. ``"recipes/main_job.py"``), executed fresh on each call."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def folder_bytes(folder) -> dict[str, bytes]:
    """Every file under ``folder`` (recursively), by its relative path, with its bytes: a folder left as it was
    compares equal."""
    folder = Path(folder)
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".hf-tdiag-manifest.json"  # hf-tdiag's record of what it wrote there
    }
