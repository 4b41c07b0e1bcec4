"""The tree stays formatted and lint-clean under the ruff configuration in pyproject.toml (``ruff format --check``,
``ruff check``), with the ruff version the dev extra pins, so CI fails on an unformatted or lint-failing change."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ruff() -> str:
    path = os.path.join(os.path.dirname(sys.executable), "ruff")
    found = path if os.path.isfile(path) else shutil.which("ruff")
    if not found:
        pytest.fail("ruff is not installed beside this interpreter (pip install -e '.[dev]')")
    return found


@pytest.mark.parametrize(
    "args", [["format", "--check", "--no-cache", "."], ["check", "--no-cache", "."]], ids=["format", "check"]
)
def test_ruff_is_clean(args):
    result = subprocess.run([_ruff(), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (
        f"ruff {' '.join(args)} found problems (run it to see them):\n{result.stdout[-4000:]}"
    )


def test_formatting_check_can_fail(tmp_path):
    """The format check reports a badly formatted file (so the test above is not vacuous)."""
    bad = tmp_path / "bad.py"
    bad.write_text("x = [1,2 ,3]\n")
    result = subprocess.run(
        [_ruff(), "format", "--check", "--no-cache", "--isolated", str(bad)], capture_output=True, text=True
    )
    assert result.returncode == 1 and "bad.py" in result.stdout
