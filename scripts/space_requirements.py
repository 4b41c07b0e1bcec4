"""Write space/requirements.txt from pyproject.toml (``python scripts/space_requirements.py``; ``--check`` only compares).

The Space needs hf-tdiag's runtime dependencies plus the ``svm`` extra (the Attention-as-SVM tab's nuclear-norm runs
use cvxpy), with CPU PyTorch; Gradio itself comes from ``sdk_version`` in space/README.md. Spaces install
requirements.txt before the rest of the repository is copied, so the package (``hf_tdiag/``, uploaded next to
app.py) cannot be listed as ``.``; its dependencies are, derived here so they never drift from pyproject.toml
(tests/test_space_app.py checks the file is what this script writes).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("svm",)
HEADER = (
    "# Generated from pyproject.toml by scripts/space_requirements.py; do not edit by hand.\n"
    "# hf-tdiag's dependencies and its [svm] extra (Gradio comes from sdk_version in README.md).\n"
    "--extra-index-url https://download.pytorch.org/whl/cpu\n"
)


def space_requirements(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The text of space/requirements.txt for ``pyproject``."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    lines = list(project["dependencies"])
    for extra in EXTRAS:
        lines += [dep for dep in project["optional-dependencies"][extra] if dep not in lines]
    return HEADER + "".join(f"{dep}\n" for dep in lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when space/requirements.txt is out of date")
    args = parser.parse_args(argv)
    target = ROOT / "space" / "requirements.txt"
    text = space_requirements()
    if args.check:
        current = target.read_text(encoding="utf-8") if target.is_file() else ""
        if current != text:
            print(f"{target} is out of date: run python scripts/space_requirements.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
