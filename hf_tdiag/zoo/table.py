"""The scan's one tidy table, rebuilt from the cache entries: a row per (model, diagnostic, layer/matrix/step).

Columns: :data:`KEY_COLUMNS` (which model — its id as given, its content hash and how it was hashed, its Hub
revision —, which diagnostic with which settings on which inputs, and the timings), then the union of the
diagnostics' own columns (a column another diagnostic lacks is missing, ``<NA>``). Written as Parquet
(``scan.parquet``, readable by ``datasets.load_dataset("parquet", data_files=...)``) and as a ``datasets.Dataset``
(``save_to_disk`` into ``dataset/``); ``measures.csv`` holds the per-model summary numbers (one column per
``<diagnostic>.<measure>``), which the comparison ranks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["KEY_COLUMNS", "TIMING_COLUMNS", "build_table", "measures_frame", "write_table"]

KEY_COLUMNS = {
    "model": "string",
    "model_hash": "string",
    "hash_method": "string",
    "revision": "string",
    "diagnostic": "string",
    "settings_hash": "string",
    "inputs_hash": "string",
    "num_inputs": "Int64",
    "seconds_load": "float64",
    "seconds_measure": "float64",
}
TIMING_COLUMNS = ("seconds_load", "seconds_measure")


def _entry_frame(model: str, entry: dict):
    import pandas as pd

    columns = dict(entry["columns"])
    data = {c: [row.get(c) for row in entry["rows"]] for c in columns}
    frame = pd.DataFrame(data, columns=list(columns)).astype(columns)
    head = {
        "model": model,
        "model_hash": entry["model_hash"],
        "hash_method": entry["hash_method"],
        "revision": entry.get("revision"),
        "diagnostic": entry["diagnostic"],
        "settings_hash": entry["settings_hash"],
        "inputs_hash": entry.get("inputs_hash"),
        "num_inputs": entry.get("num_inputs"),
        "seconds_load": entry["seconds"]["load"],
        "seconds_measure": entry["seconds"]["measure"],
    }
    for i, (name, value) in enumerate(head.items()):
        frame.insert(i, name, pd.Series([value] * len(frame), dtype=KEY_COLUMNS[name]))
    return frame


def build_table(entries: Sequence[tuple[str, dict]]):
    """The table of ``entries`` (``(model id, cache entry)`` pairs, in the order the rows go)."""
    import pandas as pd

    frames = [_entry_frame(model, entry) for model, entry in entries]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in KEY_COLUMNS.items()})
    table = pd.concat(frames, ignore_index=True)
    for column in table.columns:  # a column only some diagnostics have: keep its nullable dtype
        if table[column].dtype == object:
            table[column] = table[column].convert_dtypes()
    return table


def measures_frame(entries: Sequence[tuple[str, dict]]):
    """One row per model: ``model``, ``model_hash`` and every ``<diagnostic>.<summary number>``."""
    import pandas as pd

    rows: dict[str, dict] = {}
    for model, entry in entries:
        row = rows.setdefault(model, {"model": model, "model_hash": entry["model_hash"]})
        for k, v in entry["summary"].items():
            row[f"{entry['diagnostic']}.{k}"] = v
    return pd.DataFrame(list(rows.values()))


def write_table(table, scan_dir: str) -> dict[str, str]:
    """``scan.parquet`` (atomically) and ``dataset/`` (``Dataset.save_to_disk``, replaced whole) in ``scan_dir``."""
    import shutil

    import datasets

    from .._atomic import atomic_open

    paths = {"parquet": os.path.join(scan_dir, "scan.parquet"), "dataset": os.path.join(scan_dir, "dataset")}
    with atomic_open(paths["parquet"], "wb") as fh:
        table.to_parquet(fh, index=False)
    staging = os.path.join(scan_dir, ".tmp-dataset")
    shutil.rmtree(staging, ignore_errors=True)
    bars = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        datasets.Dataset.from_pandas(table, preserve_index=False).save_to_disk(staging)
    finally:
        if bars:
            datasets.utils.logging.enable_progress_bar()
    old = os.path.join(scan_dir, ".trash-dataset")
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(paths["dataset"]):
        os.replace(paths["dataset"], old)
    os.replace(staging, paths["dataset"])
    shutil.rmtree(old, ignore_errors=True)
    return paths
