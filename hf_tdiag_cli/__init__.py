"""The ``hf-tdiag`` console script's entry point.

It lives outside the ``hf_tdiag`` package so that ``import hf_tdiag`` can see it was loaded and leave the model
registration (which imports torch and transformers) to :func:`hf_tdiag.cli.main`, after the command line is parsed:
``hf-tdiag --help`` and ``--version`` then answer without importing either.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run ``hf-tdiag`` with ``argv`` (default: ``sys.argv[1:]``) and return its exit code."""
    from hf_tdiag.cli import main as run

    return run(argv)
