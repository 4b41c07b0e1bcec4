"""Count each function's lines (from its ``def`` to its last line, less its docstring's lines) and list the longest.

    python scripts/long_functions.py                 # every function of hf_tdiag/, longest first
    python scripts/long_functions.py --max 60        # only those over 60 lines; exit 1 if there is any
    python scripts/long_functions.py --max 60 some/folder other/file.py

A line is ``lines path:function`` (a method as ``Class.method``, a nested function as ``outer.inner``). A nested
function's lines count in its own line and in its enclosing function's. Declarations are not counted: a
``build_demo`` (the Space's gradio layout) and an ``add_arguments`` (a command's argparse flags) are lists of
widgets and flags, one per line. ``tests/test_long_functions.py`` runs this with ``--max 60`` over hf_tdiag/.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DECLARATIONS = frozenset({"build_demo", "add_arguments"})
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """How many lines the function's docstring spans (0 without one)."""
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the ``def`` (decorators not counted) to the function's last line, less its docstring's."""
    return node.end_lineno - node.lineno + 1 - docstring_lines(node)


def _functions(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, FUNCTIONS):
            name = prefix + child.name
            yield name, child
            yield from _functions(child, name + ".")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, prefix + child.name + ".")
        else:
            yield from _functions(child, prefix)


def scan_file(path: Path) -> list[tuple[int, str]]:
    """``(lines, qualified name)`` of each function in one Python file, declarations left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [(function_lines(node), name) for name, node in _functions(tree, "") if node.name not in DECLARATIONS]


def python_files(paths: list[Path]) -> list[Path]:
    """The ``.py`` files named or under the folders named, sorted."""
    found = set()
    for path in paths:
        if path.is_dir():
            found.update(path.rglob("*.py"))
        elif path.suffix == ".py" and path.is_file():
            found.add(path)
        else:
            raise ValueError(f"{path} is neither a folder nor a .py file: name folders or Python files to scan")
    return sorted(found)


def scan(paths: list[Path]) -> list[tuple[int, str]]:
    """``(lines, "path:function")`` of every function under ``paths``, longest first (then by name)."""
    rows = []
    for path in python_files(paths):
        shown = path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path
        rows.extend((lines, f"{shown}:{name}") for lines, name in scan_file(path))
    return sorted(rows, key=lambda row: (-row[0], row[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[REPO / "hf_tdiag"], help="folders or .py files")
    parser.add_argument("--max", type=int, default=None, help="list only functions over this many lines; exit 1 if any")
    args = parser.parse_args(argv)
    if args.max is not None and args.max < 1:
        parser.error(f"--max {args.max}: give a positive number of lines")
    try:
        rows = scan(args.paths)
    except ValueError as error:
        parser.error(str(error))
    if args.max is not None:
        rows = [row for row in rows if row[0] > args.max]
    for lines, where in rows:
        print(f"{lines} {where}")
    return 1 if args.max is not None and rows else 0


if __name__ == "__main__":
    sys.exit(main())
