"""The docs site builds in strict mode: a broken link, a missing page, a page left out of the nav or an API
reference that no longer resolves fails the build (the build writes only into a temporary folder)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(REPO / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    site = tmp_path / "site"
    for page in ("index.html", "quickstart/index.html", "guide/srr/index.html", "api/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    # the API page is rendered from the docstrings: the functions' own first lines appear in it
    import hf_tdiag.diagnostics.srr as srr

    first_line = srr.layer_srr.__doc__.strip().splitlines()[0]
    assert "layer_srr" in api and first_line.split("``")[0].strip() in api
