"""The ``hf-tdiag`` command: one sub-command per capability.

Each sub-command lives in ``hf_tdiag/commands/<name>.py`` and exposes ``register(subparsers)``, which adds its
parser (flags follow ``hf_tdiag._cli_args``: hyphenated, underscore spelling accepted) and sets ``func`` to a
callable taking the parsed ``argparse.Namespace`` and returning an exit code. Building the parser imports no
torch or transformers, so ``--help`` answers at once; the commands import what they need when they run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from . import __version__
from . import commands as _commands_pkg
from ._cli_args import ArgumentParser
from .models.families import register_all


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for dist in ("torch", "transformers"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} not installed")
    return f"hf-tdiag {__version__} ({', '.join(parts)}, Python {sys.version.split()[0]})"


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="hf-tdiag",
        description="White-box transformers (CRATE) and transformer diagnostics. Flags are hyphenated "
        "(--output-dir); the underscore spelling (--output_dir) is accepted too.",
    )
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("--quiet", "-q", action="store_true", help=QUIET_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(_commands_pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{_commands_pkg.__name__}.{info.name}")
        module.register(sub)
    for command in sub.choices.values():  # also after the command name; SUPPRESS keeps the global value
        command.add_argument("--quiet", "-q", action="store_true", default=argparse.SUPPRESS, help=QUIET_HELP)
    return parser


QUIET_HELP = "no progress bars and no library info logs (sets TQDM_DISABLE=1); results and errors still print"


def _be_quiet() -> None:
    """What ``--quiet`` turns off: tqdm bars (ours and the libraries'), Transformers/Datasets info and warnings."""
    os.environ["TQDM_DISABLE"] = "1"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DATASETS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _message(err: BaseException) -> str:
    text = str(err)
    if isinstance(err, KeyError) and err.args:
        text = str(err.args[0])
    return text or type(err).__name__


def _warnings_as_lines(command: str):
    """``warnings.showwarning`` that prints hf-tdiag's own warnings as ``hf-tdiag CMD: warning: ...`` lines."""
    import warnings

    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, UserWarning) and f"{os.sep}hf_tdiag{os.sep}" in filename:
            print(f"hf-tdiag {command}: warning: {message}", file=sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    return show


def main(argv: list[str] | None = None) -> int:
    import warnings

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quiet:
        _be_quiet()
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    register_all()  # the model families, for a command started by the console script (see hf_tdiag_cli)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warnings_as_lines(args.command)
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"hf-tdiag {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError, KeyError, RuntimeError, ImportError) as err:
        # Library errors that reach here name their input (hf_tdiag raises ValueError/TypeError naming the
        # argument; OSError carries the path). Set HF_TDIAG_TRACEBACK=1 to see where it came from.
        if os.environ.get("HF_TDIAG_TRACEBACK"):
            raise
        print(f"hf-tdiag {args.command}: error: {_message(err)}", file=sys.stderr)
        return 1
    finally:  # the output folder a command held: its manifest record finished, its lock released
        from ._outputs import release_output_dirs

        release_output_dirs()


if __name__ == "__main__":
    sys.exit(main())
