"""Progress bars that honour the user's wish for quiet and keep logs clean.

:func:`tqdm` takes tqdm's arguments. It shows nothing when ``TQDM_DISABLE`` is set (to anything but ``0``/``false``;
``hf-tdiag --quiet`` sets it) or when the caller passes ``disable=True``. Outside a terminal (a log file, CI, a
pipe; Jupyter excepted) each refresh is written as a plain line, at most every 10 seconds, without the carriage
returns and cursor moves a terminal bar uses; and a transient bar (``leave=False``: an evaluation pass inside a
training job, a solver's iterations inside a diagnostic) writes nothing there, so a log holds one bar per long job
(in a terminal it is drawn and erased as usual).
"""

from __future__ import annotations

import os
import re
import sys

LOG_INTERVAL_S = 10.0  # seconds between progress lines outside a terminal


def quiet() -> bool:
    """True when ``TQDM_DISABLE`` asks for no progress bars."""
    return os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no")


class LogLines:
    """A text stream for tqdm outside a terminal: every refresh becomes one line; carriage returns, cursor moves and
    the blank padding tqdm writes over its previous bar are dropped."""

    _CONTROL = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        for line in re.split(r"[\r\n]+", self._CONTROL.sub("", text)):
            if line.strip():
                self.stream.write(line.rstrip() + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


def _in_terminal(stream) -> bool:
    if "ipykernel" in sys.modules:  # Jupyter renders its own widget bars
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def tqdm(*args, disable: bool | None = False, **kwargs):
    """``tqdm.auto.tqdm(*args, **kwargs)``, off under ``TQDM_DISABLE`` and line-based outside a terminal."""
    from tqdm.auto import tqdm as _tqdm

    if disable or quiet():
        return _tqdm(*args, disable=True, **kwargs)
    stream = kwargs.get("file") or sys.stderr
    if not _in_terminal(stream):
        if kwargs.get("leave") is False:  # transient: erased in a terminal, only noise in a log
            return _tqdm(*args, disable=True, **kwargs)
        kwargs["file"] = LogLines(stream)
        kwargs.setdefault("mininterval", LOG_INTERVAL_S)
    return _tqdm(*args, disable=False, **kwargs)


__all__ = ["tqdm", "quiet", "LogLines"]
