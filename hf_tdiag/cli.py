"""The ``hf-tdiag`` command: one sub-command per capability.

Each sub-command lives in ``hf_tdiag/commands/<name>.py`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable
taking the parsed ``argparse.Namespace`` and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from . import commands as _commands_pkg


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-tdiag", description="White-box transformers and transformer diagnostics."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(_commands_pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{_commands_pkg.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"hf-tdiag {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
