"""An offline Accelerate tracker writing JSON lines, and parsing of ``--report_to``."""

from __future__ import annotations

import json
import os
import time

from accelerate.tracking import GeneralTracker

from .._atomic import write_json


class JSONLinesTracker(GeneralTracker):
    """Writes ``config.json`` and one JSON object per ``log`` call to ``<logging_dir>/<run_name>/metrics.jsonl``."""

    name = "jsonl"
    requires_logging_directory = True
    main_process_only = True

    def __init__(self, run_name: str, logging_dir: str):
        super().__init__()
        self.run_name = run_name
        self.directory = os.path.join(logging_dir, run_name)
        self.path = os.path.join(self.directory, "metrics.jsonl")
        self._fh = None

    def start(self):
        os.makedirs(self.directory, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")

    @property
    def tracker(self):
        return self._fh

    def store_init_configuration(self, values: dict):
        write_json(os.path.join(self.directory, "config.json"), values, default=str)

    def log(self, values: dict, step: int | None = None, **kwargs):
        if self._fh is None:
            self.start()
        record = {"step": step, "time": time.time(), **{k: v for k, v in values.items()}}
        self._fh.write(json.dumps(record, default=float) + "\n")
        self._fh.flush()

    def finish(self):
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def resolve_trackers(report_to: str, logging_dir: str, run_name: str = "crate") -> list:
    """``--report_to`` (comma-separated names, or ``all``) to Accelerate's ``log_with`` list.

    ``jsonl`` is built in; other names are Accelerate trackers and must be installed; ``all`` is ``jsonl``
    plus every Accelerate tracker that is available.
    """
    from accelerate.tracking import get_available_trackers

    names = [n.strip() for n in str(report_to).split(",") if n.strip()]
    if not names:
        raise ValueError(f"report_to: expected tracker names or 'all', got {report_to!r}")
    trackers: list = []
    if "all" in names:
        names = ["jsonl"] + [str(t) for t in get_available_trackers()]
    available = {str(t) for t in get_available_trackers()}
    for name in dict.fromkeys(names):
        if name == "jsonl":
            trackers.append(JSONLinesTracker(run_name, logging_dir))
        elif name in ("none", "None"):
            continue
        elif name in available:
            trackers.append(name)
        else:
            raise ValueError(
                f"report_to: tracker {name!r} is not installed; available: {['jsonl', *sorted(available)]}"
            )
    return trackers


__all__ = ["JSONLinesTracker", "resolve_trackers"]
