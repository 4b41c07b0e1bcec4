"""The report contract every diagnostic's report follows: ``summary()``, ``to_dict()``, ``to_json()`` /
``from_json()``, and ``to_pandas()`` — one row per layer, head, matrix or query, typed columns, blocks numbered
1..L in a column named ``layer``.

:func:`typed_frame` builds those tables: each column is given with its dtype, so an empty report, a report with
missing values and a full one give the same columns of the same dtypes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

# column dtypes of the tables: pandas' nullable integer for counts and indices (a head of a matrix without heads
# is <NA>, never a float NaN), float64 for numbers, pandas' string dtype for names, boolean for flags
INT, FLOAT, STR, BOOL = "Int64", "float64", "string", "boolean"


def typed_frame(rows: Sequence[Mapping[str, Any]], columns: Mapping[str, str]):
    """A ``pandas.DataFrame`` of ``rows`` with exactly ``columns`` (name -> dtype), in that order."""
    import pandas as pd

    data = {name: [row.get(name) for row in rows] for name in columns}
    frame = pd.DataFrame(data, columns=list(columns))
    return frame.astype(dict(columns))


class ReportContract:
    """The shared half of the contract: JSON text and files from ``to_dict()`` and back through ``from_dict()``.

    A report class defines ``summary()``, ``to_dict()``, ``from_dict()`` and ``to_pandas()`` (and ``plot()`` where a
    figure exists); this base gives it ``to_json(path=None)`` (written atomically) and ``from_json(path_or_text)``.
    """

    def to_json(self, path: str | os.PathLike | None = None, indent: int = 2, **to_dict_kwargs) -> str:
        """:meth:`to_dict` as JSON text; also written (atomically) to ``path`` if given."""
        text = json.dumps(self.to_dict(**to_dict_kwargs), indent=indent)
        if path is not None:
            from .._atomic import write_text

            write_text(path, text + "\n")
        return text

    @classmethod
    def from_json(cls, path_or_text):
        """A report written by :meth:`to_json`, read back from a file path or a JSON string."""
        return cls.from_dict(read_json_text(path_or_text))


def read_json_text(path_or_text: str | os.PathLike) -> dict[str, Any]:
    """The JSON object in ``path_or_text``: a JSON string (starting with ``{``) or the path of a file holding one."""
    text = str(path_or_text)
    if not text.lstrip().startswith("{"):
        if not os.path.isfile(text):
            raise ValueError(f"path_or_text: expected a report's JSON text or the path of a JSON file, got {text!r}")
        with open(text, encoding="utf-8") as fh:
            text = fh.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"path_or_text: not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"path_or_text: expected a JSON object, got {type(data).__name__}")
    return data


__all__ = ["ReportContract", "typed_frame", "read_json_text", "INT", "FLOAT", "STR", "BOOL"]
