"""No function of hf_tdiag/ is over 60 lines (docstrings not counted, declarations left out), checked by
``scripts/long_functions.py``; and that script counts what it says on files written here with known lengths."""

from __future__ import annotations

import subprocess
import sys

from script_files import REPO

SCRIPT = REPO / "scripts" / "long_functions.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def _function(name: str, body_lines: int, docstring_lines: int = 0, indent: str = "") -> str:
    """A function whose def line, docstring and body together are ``1 + docstring_lines + body_lines`` lines."""
    lines = [f"{indent}def {name}():"]
    if docstring_lines == 1:
        lines.append(f'{indent}    """One line."""')
    elif docstring_lines > 1:
        lines += [f'{indent}    """First.'] + [f"{indent}    more"] * (docstring_lines - 2) + [f'{indent}    """']
    lines += [f"{indent}    x{i} = {i}" for i in range(body_lines)]
    return "\n".join(lines) + "\n"


def test_hf_tdiag_has_no_function_over_60_lines():
    result = _run("--max", "60", "hf_tdiag")
    assert result.returncode == 0, f"functions over 60 lines (split them into named steps):\n{result.stdout}"
    assert result.stdout == ""


def test_a_function_over_the_limit_fails_and_one_at_it_passes(tmp_path):
    source = tmp_path / "module.py"
    # 1 def line + 59 body lines = 60: at the limit; 1 + 60 = 61: over it
    source.write_text(_function("at_limit", 59) + "\n\n" + _function("over_limit", 60))
    result = _run("--max", "60", str(source))
    assert result.returncode == 1
    assert result.stdout == f"61 {source}:over_limit\n"


def test_docstring_lines_are_not_counted_and_declarations_are_left_out(tmp_path):
    source = tmp_path / "module.py"
    source.write_text(
        _function("documented", 50, docstring_lines=30)  # 81 lines in all, 51 without the docstring
        + _function("short_doc", 60, docstring_lines=1)  # 62 in all, 61 without it: over
        + _function("build_demo", 100)
        + "class Command:\n"
        + _function("add_arguments", 100, indent="    ")
        + _function("run", 70, indent="    ")
        + _function("outer", 3)[:-1]
        + "\n"
        + _function("inner", 2, indent="    ")
    )
    listing = _run(str(source))
    assert listing.returncode == 0
    rows = listing.stdout.splitlines()
    assert rows == [
        f"71 {source}:Command.run",
        f"61 {source}:short_doc",
        f"51 {source}:documented",
        f"7 {source}:outer",
        f"3 {source}:outer.inner",
    ]
    over = _run("--max", "60", str(source))
    assert over.returncode == 1
    assert over.stdout.splitlines() == rows[:2]


def test_a_path_that_is_not_python_is_refused(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("text\n")
    result = _run("--max", "60", str(other))
    assert result.returncode == 2
    assert "notes.txt is neither a folder nor a .py file" in result.stderr
