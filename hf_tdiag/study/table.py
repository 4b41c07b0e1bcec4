"""The study's result: Kendall's τ and the granulated Ψ of every measure against the gap, as tables and plots."""

from __future__ import annotations

import csv
import os
from dataclasses import asdict
from typing import Any, Mapping, Sequence

from .cache import write_json_atomic
from .grids import StudyGrid
from .measures import MEASURES, MeasureSettings

__all__ = ["correlation_table", "markdown_table", "summarize"]


def _usable(records: Sequence[Mapping], measure: str) -> list[Mapping]:
    return [
        r for r in records
        if r.get("measures", {}).get(measure) is not None and r.get("train", {}).get("generalization_gap") is not None
    ]


def correlation_table(records: Sequence[Mapping], measures: Sequence[str] | None = None, axes: Sequence[str] | None = None) -> list[dict]:
    """Kendall τ and granulated Ψ (with per-axis ψ_k) of each measure against the generalization gap.

    Runs without a gap, or where the measure is undefined, are left out for that measure.
    """
    from ..measures.correlation import granulated_kendall, kendall_tau

    rows = []
    for m in list(measures or MEASURES):
        used = _usable(records, m)
        row: dict[str, Any] = {"measure": m, "description": MEASURES.get(m, ""), "n_runs": len(used), "tau": None, "psi": None, "psi_per_axis": {}}
        if len(used) >= 2:
            mv = [r["measures"][m] for r in used]
            gv = [r["train"]["generalization_gap"] for r in used]
            hp_axes = list(axes) if axes is not None else sorted(used[0]["hparams"])
            try:
                row["tau"] = kendall_tau(mv, gv)
            except ValueError:
                row["tau"] = None
            g = granulated_kendall(mv, gv, [{a: r["hparams"][a] for a in hp_axes} for r in used])
            row["psi"] = g.psi
            row["psi_per_axis"] = g.per_axis
        rows.append(row)
    return rows


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:+.3f}"


def markdown_table(rows: Sequence[Mapping], axes: Sequence[str], reached: Sequence[Mapping] | None = None) -> str:
    """The correlation table as Markdown: one row per measure, τ, Ψ and each ψ_k side by side.

    With ``reached`` (the table over the runs that reached the target training loss), its τ and Ψ are added
    as two more columns.
    """
    extra = " τ (reached) | Ψ (reached) | runs (reached) |" if reached else ""
    head = "| measure | τ | Ψ | " + " | ".join(f"ψ {a}" for a in axes) + " | runs |" + extra
    sep = "|---|---:|---:|" + "---:|" * len(axes) + "---:|" + ("---:|---:|---:|" if reached else "")
    lines = [head, sep]
    by_measure = {r["measure"]: r for r in reached or []}
    for r in rows:
        cells = [r["measure"], _fmt(r["tau"]), _fmt(r["psi"])] + [_fmt(r["psi_per_axis"].get(a)) for a in axes] + [str(r["n_runs"])]
        if reached:
            q = by_measure.get(r["measure"], {})
            cells += [_fmt(q.get("tau")), _fmt(q.get("psi")), str(q.get("n_runs", 0))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write_table_csv(path: str, axes: Sequence[str], tables: Sequence[tuple[str, Sequence[Mapping]]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["runs", "measure", "tau", "psi", *[f"psi_{a}" for a in axes], "n_runs"])
        for subset, table in tables:
            for r in table:
                w.writerow([subset, r["measure"], r["tau"], r["psi"], *[r["psi_per_axis"].get(a) for a in axes], r["n_runs"]])


def _write_runs_csv(path: str, axes: Sequence[str], records: Sequence[Mapping]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        train_keys = sorted({k for r in records for k in r["train"]})
        w.writerow(["key", *axes, *train_keys, *MEASURES])
        for r in records:
            w.writerow([r["key"], *[r["hparams"].get(a) for a in axes], *[r["train"].get(k) for k in train_keys],
                        *[r["measures"].get(m) for m in MEASURES]])


def _write_outputs(study_dir: str, summary: dict, records: Sequence[Mapping], axes: Sequence[str], plot: bool) -> dict:
    rows, rows_reached = summary["table"], summary["table_reached_target"]
    paths = {"json": os.path.join(study_dir, "table.json")}
    write_json_atomic(paths["json"], summary)
    paths["csv"] = os.path.join(study_dir, "table.csv")
    _write_table_csv(paths["csv"], axes, [("all", rows), ("reached_target", rows_reached)])
    paths["markdown"] = os.path.join(study_dir, "table.md")
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        f.write(markdown_table(rows, axes, reached=rows_reached) + "\n")
    paths["runs_csv"] = os.path.join(study_dir, "runs.csv")
    _write_runs_csv(paths["runs_csv"], axes, records)
    if plot:
        from ..viz.study import measure_scatter_grid

        paths["plot"] = os.path.join(study_dir, "scatter.png")
        measure_scatter_grid(records, rows).savefig(paths["plot"], dpi=120)
    return paths


def summarize(grid: StudyGrid, records: Sequence[Mapping], study_dir: str, settings: MeasureSettings | None = None,
              plot: bool = True, cached: int = 0, failures: Sequence[Mapping] = ()) -> dict:
    """Write ``table.json``, ``table.csv``, ``table.md``, ``runs.csv`` and ``scatter.png`` for the finished runs."""
    axes = list(grid.axes)
    rows = correlation_table(records, axes=axes) if len(records) >= 2 else []
    converged = [r for r in records if r["train"].get("reached_train_loss_target")]
    rows_reached = correlation_table(converged, axes=axes) if len(converged) >= 2 else []
    summary = {
        "grid": grid.to_dict(),
        "settings": asdict(settings or MeasureSettings()),
        "n_runs": len(records),
        "n_expected": len(grid.runs()),
        "complete": len(records) == len(grid.runs()),
        "cached": cached,
        "failures": list(failures),
        "reached_stop": sum(bool(r["train"].get("reached_train_loss_target")) for r in records),
        "table": rows,
        "table_reached_target": rows_reached,
    }
    summary["paths"] = _write_outputs(study_dir, summary, records, axes, plot) if rows else {}
    summary["markdown"] = markdown_table(rows, axes, reached=rows_reached) if rows else ""
    return summary
