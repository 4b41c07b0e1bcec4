"""The one validator every report's ``from_json``/``from_dict`` runs: the JSON says which report it is (``kind``)
and in which format (``format_version``), and every field the report reads is there with the right type.

A report's ``to_dict`` starts with :func:`stamp` (``{"kind": "SRRReport", "format_version": 1, ...}``); its
``from_dict`` calls :func:`check_report` with a schema built from the small types below before it reads anything,
so a hand-edited, truncated or other report's JSON is one line naming the field::

    SRRReport JSON: field 'mean.output.srr[2]': expected a number, got 'abc'

JSON written before reports carried ``kind`` and ``format_version`` is read as format 1 when it validates; a
``measure`` or ``kind`` of another report is refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "ANY",
    "BOOL",
    "INT",
    "NUM",
    "NUMBERS",
    "STR",
    "Choice",
    "ListOf",
    "MapOf",
    "Nullable",
    "Obj",
    "ReportFormatError",
    "check_report",
    "report_error",
    "stamp",
]


class ReportFormatError(ValueError):
    """A report's JSON is not one this report class wrote (wrong kind, version, a field missing or mistyped)."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Spec:
    words = "a value"

    def problem(self, value: Any, path: str) -> tuple[str, str] | None:
        """``(field path, what was expected and got)`` for the first mismatch, None when ``value`` fits."""
        raise NotImplementedError


class _Any(_Spec):
    words = "any value"

    def problem(self, value, path):
        return None


class _Num(_Spec):
    words = "a number"

    def problem(self, value, path):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return path, f"expected {self.words}, got {_shown(value)}"
        return None


class _Int(_Spec):
    words = "an integer"

    def problem(self, value, path):
        if isinstance(value, float) and value.is_integer() and math.isfinite(value):
            return None  # 3.0 from another JSON writer
        if isinstance(value, bool) or not isinstance(value, int):
            return path, f"expected {self.words}, got {_shown(value)}"
        return None


class _Str(_Spec):
    words = "a string"

    def problem(self, value, path):
        return None if isinstance(value, str) else (path, f"expected {self.words}, got {_shown(value)}")


class _Bool(_Spec):
    words = "true or false"

    def problem(self, value, path):
        return None if isinstance(value, bool) else (path, f"expected {self.words}, got {_shown(value)}")


class _Numbers(_Spec):
    """Numbers (true/false and null too: a boolean mask, NaN written as null) nested in lists to any depth."""

    words = "a list of numbers"

    def problem(self, value, path):
        if not isinstance(value, list):
            return path, f"expected {self.words}, got {_shown(value)}"
        for i, v in enumerate(value):
            where = f"{path}[{i}]"
            found = self.problem(v, where) if isinstance(v, list) else None
            if not isinstance(v, (list, int, float, bool)) and v is not None:
                found = where, f"expected a number, got {_shown(v)}"
            if found:
                return found
        return None


ANY, NUM, INT, STR, BOOL, NUMBERS = _Any(), _Num(), _Int(), _Str(), _Bool(), _Numbers()


class Choice(_Spec):
    """One of the given strings."""

    def __init__(self, *choices: str):
        self.choices = choices
        self.words = f"one of {list(choices)}"

    def problem(self, value, path):
        return None if value in self.choices else (path, f"expected {self.words}, got {_shown(value)}")


class Nullable(_Spec):
    """``spec`` or null."""

    def __init__(self, spec: _Spec):
        self.spec = spec
        self.words = f"{spec.words} or null"

    def problem(self, value, path):
        if value is None:
            return None
        found = self.spec.problem(value, path)
        if found and found[0] == path and found[1].startswith("expected "):  # say null was allowed too
            return path, f"expected {self.words}, got {_shown(value)}"
        return found


class ListOf(_Spec):
    """A JSON list of ``item``, of ``length`` entries when given."""

    def __init__(self, item: _Spec, length: int | None = None):
        self.item, self.length = item, length
        self.words = f"a list of {item.words.removeprefix('a ').removeprefix('an ')}s"

    def problem(self, value, path):
        if not isinstance(value, list):
            return path, f"expected {self.words}, got {_shown(value)}"
        if self.length is not None and len(value) != self.length:
            return path, f"expected {self.length} entries, got {len(value)}"
        for i, v in enumerate(value):
            found = self.item.problem(v, f"{path}[{i}]")
            if found:
                return found
        return None


class MapOf(_Spec):
    """A JSON object of ``value`` entries (any keys, or exactly/at least ``keys``)."""

    def __init__(self, value: _Spec, keys: Iterable[str] | None = None):
        self.value, self.keys = value, None if keys is None else tuple(keys)
        self.words = "an object"

    def problem(self, value, path):
        if not isinstance(value, dict):
            return path, f"expected {self.words}, got {_shown(value)}"
        for key in self.keys or ():
            if key not in value:
                return f"{path}.{key}" if path else key, "missing"
        for key, v in value.items():
            found = self.value.problem(v, f"{path}.{key}" if path else str(key))
            if found:
                return found
        return None


class Obj(_Spec):
    """A JSON object with the ``fields`` (name -> spec) present and ``optional`` ones checked when present; other keys
    are allowed (a newer writer's additions)."""

    def __init__(self, fields: Mapping[str, _Spec], optional: Mapping[str, _Spec] | None = None):
        self.fields, self.optional = dict(fields), dict(optional or {})
        self.words = "an object"

    def problem(self, value, path):
        if not isinstance(value, dict):
            return path or "(top level)", f"expected {self.words}, got {_shown(value)}"
        for name, spec in self.fields.items():
            where = f"{path}.{name}" if path else name
            if name not in value:
                return where, "missing"
            found = spec.problem(value[name], where)
            if found:
                return found
        for name, spec in self.optional.items():
            if name in value:
                found = spec.problem(value[name], f"{path}.{name}" if path else name)
                if found:
                    return found
        return None


def stamp(kind: str, version: int) -> dict[str, Any]:
    """The first two keys of a report's ``to_dict``: which report wrote it and in which format."""
    return {"kind": kind, "format_version": version}


def report_error(kind: str, field: str, problem: str) -> ReportFormatError:
    """The one-line error for a field of a ``kind`` report's JSON."""
    return ReportFormatError(f"{kind} JSON: field {field!r}: {problem}")


def check_report(
    data: Any,
    kind: str,
    schema: Obj,
    version: int,
    *,
    measure: tuple[str, str] | None = None,
) -> int:
    """Check ``data`` is the JSON of a ``kind`` report in a format up to ``version`` and fits ``schema``; return its
    format version (1 when the JSON has none: written before reports carried it). ``measure``: a ``(key, value)``
    the JSON of this report always held (refuses another report's JSON written before ``kind``)."""
    if not isinstance(data, Mapping):
        raise ReportFormatError(f"{kind} JSON: expected a JSON object, got {type(data).__name__}")
    if "kind" in data and data["kind"] != kind:
        raise report_error(
            kind, "kind", f"this is the JSON of {_shown(data['kind'])}, not of {kind}; read it with that class"
        )
    if measure is not None and measure[0] in data and data[measure[0]] != measure[1]:
        raise report_error(kind, measure[0], f"expected {measure[1]!r}, got {_shown(data[measure[0]])}")
    found = data.get("format_version", 1)
    if isinstance(found, bool) or not isinstance(found, int) or found < 1:
        raise report_error(kind, "format_version", f"expected a positive integer, got {_shown(found)}")
    if found > version:
        raise report_error(
            kind, "format_version", f"{found} is newer than this hf-tdiag reads ({version}); upgrade hf-tdiag"
        )
    problem = schema.problem(dict(data), "")
    if problem:
        raise report_error(kind, *problem)
    return found
