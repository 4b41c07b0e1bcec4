"""The per-run cache: one JSON record per finished run, ``<study_dir>/runs/<key>.json``, written atomically.

``key`` hashes everything that determines a run's result (its hyperparameters, the
shared trainer settings, the measure settings), so a record is reused only for the
same run. A record is written to a temporary file and renamed with ``os.replace``:
a reader sees the old file or the complete new one, never a partial file.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from .._atomic import write_json

__all__ = [
    "STUDY_VERSION",
    "run_key",
    "record_path",
    "write_json_atomic",
    "read_record",
    "load_records",
    "remove_temporaries",
]

STUDY_VERSION = 2  # 2: Jiang et al.'s measures and Psi


def run_key(hparams: Mapping[str, Any], fixed: Mapping[str, Any], settings) -> str:
    """Hash of everything that determines a run's result (its hyperparameters, the shared settings, the measures)."""
    payload = {
        "version": STUDY_VERSION,
        "hparams": dict(hparams),
        "fixed": dict(fixed),
        "measures": asdict(settings),
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def record_path(study_dir: str, key: str) -> str:
    """Where the record of run ``key`` lives."""
    return os.path.join(study_dir, "runs", f"{key}.json")


def write_json_atomic(path: str, obj: Any) -> None:
    """Write JSON so that ``path`` either holds the old content or the complete new one, never a partial file."""
    write_json(path, obj, sort_keys=True, allow_nan=False)  # sorted keys, and NaN never reaches the cache


def read_record(path: str, key: str) -> dict | None:
    """The finished run stored at ``path`` if it is a complete record of run ``key``, else ``None`` (with a
    warning naming the file when one is there but damaged: truncated, not a record, or another run's)."""
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        warnings.warn(
            f"study: the run record {path!r} is damaged ({err}); the run counts as not finished", stacklevel=2
        )
        return None
    if not isinstance(rec, dict) or rec.get("key") != key or "train" not in rec or "measures" not in rec:
        warnings.warn(
            f"study: {path!r} is not a complete record of run {key} (missing key, train or measures); the run "
            "counts as not finished",
            stacklevel=2,
        )
        return None
    return rec


def load_records(study_dir: str) -> list[dict]:
    """Every finished run cached under ``study_dir/runs`` (unreadable or partial files are ignored)."""
    runs_dir = os.path.join(study_dir, "runs")
    if not os.path.isdir(runs_dir):
        return []
    out = []
    for name in sorted(os.listdir(runs_dir)):
        if name.endswith(".json") and not name.startswith("."):
            rec = read_record(os.path.join(runs_dir, name), name[: -len(".json")])
            if rec is not None:
                out.append(rec)
    return out


def remove_temporaries(study_dir: str) -> None:
    """Delete the temporary files a killed writer left in ``study_dir/runs`` (they are never read as results)."""
    runs_dir = os.path.join(study_dir, "runs")
    for name in os.listdir(runs_dir):
        if name.startswith(".tmp-"):
            try:
                os.unlink(os.path.join(runs_dir, name))
            except OSError:
                pass
