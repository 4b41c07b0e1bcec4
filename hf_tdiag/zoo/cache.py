"""The scan cache, its source of truth: one JSON file per (model hash, diagnostic, settings hash, inputs hash).

``<scan_dir>/cache/<model hash 16>-<diagnostic>-<settings hash 12>-<inputs hash 12 | none>.json`` holds one
measured (model, diagnostic): the report's ``to_pandas()`` rows with their dtypes, its ``summary()`` numbers, the
timings and what was measured. Each file is written atomically (temporary file + ``os.replace``), so a scan killed
at any point leaves complete entries and at most the temporary file of the one in flight; the table is rebuilt
from the entries, and a rerun measures only the keys without one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings

from .._atomic import write_json

__all__ = ["SCAN_VERSION", "entry_key", "entry_path", "read_entry", "settings_hash", "write_entry"]

SCAN_VERSION = 1
CACHE = "cache"


def settings_hash(diagnostic: str, settings) -> str:
    """sha256 of the diagnostic's name, its settings (``to_dict()``, sorted) and the scan format.

    Examples:
        >>> from hf_tdiag.diagnostics.settings import SRRSettings
        >>> from hf_tdiag.zoo.cache import settings_hash
        >>> settings_hash("srr", SRRSettings()) == settings_hash("srr", SRRSettings(eps=0.1))
        True
        >>> settings_hash("srr", SRRSettings()) == settings_hash("srr", SRRSettings(eps=0.2))
        False
    """
    text = json.dumps({"diagnostic": diagnostic, "settings": settings.to_dict(), "version": SCAN_VERSION},
                      sort_keys=True, default=str)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()


def entry_key(model_hash: str, diagnostic: str, settings_digest: str, inputs_hash: str | None) -> str:
    """The file name (without ``.json``) of one entry."""
    return f"{model_hash[:16]}-{diagnostic}-{settings_digest[:12]}-{(inputs_hash or 'none')[:12]}"


def entry_path(scan_dir: str, key: str) -> str:
    return os.path.join(scan_dir, CACHE, f"{key}.json")


def _clean(value):
    """JSON-ready: NaN and infinities as strings JSON can hold (read back by :func:`_restore`)."""
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _restore(value):
    if isinstance(value, dict):
        if set(value) == {"float"} and isinstance(value["float"], str):
            return float(value["float"])
        return {k: _restore(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v) for v in value]
    return value


def write_entry(scan_dir: str, entry: dict) -> str:
    """Write ``entry`` (with ``key``) atomically; its path."""
    path = entry_path(scan_dir, entry["key"])
    write_json(path, _clean(entry), sort_keys=True, allow_nan=False)
    return path


def read_entry(scan_dir: str, key: str) -> dict | None:
    """The entry ``key`` if its file is there and complete, else None (a damaged file: a warning naming it)."""
    path = entry_path(scan_dir, key)
    try:
        with open(path, encoding="utf-8") as fh:
            entry = _restore(json.load(fh))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        warnings.warn(f"scan: the cache entry {path!r} is damaged ({err}); it is measured again", stacklevel=2)
        return None
    if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("rows"), list):
        warnings.warn(f"scan: {path!r} is not a complete cache entry of {key}; it is measured again", stacklevel=2)
        return None
    return entry


def remove_temporaries(scan_dir: str) -> None:
    """Delete the temporary files a killed writer left in the cache (never read as entries)."""
    folder = os.path.join(scan_dir, CACHE)
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.startswith(".tmp-"):
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass
