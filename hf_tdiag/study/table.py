"""The study's result: Kendall's τ and the granulated Ψ of every measure against the gap, as tables and plots."""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from .cache import write_json_atomic
from .grids import StudyGrid
from .measures import MEASURES, MeasureSettings

__all__ = ["GAPS", "gap_value", "correlation_table", "markdown_table", "summarize"]

GAPS: dict[str, str] = {
    "ce": "cross-entropy gap L_val − L_train once the training loss reaches 0.01 (Hu et al.)",
    "error": "0–1 error gap err_val − err_train = acc_train − acc_val (Jiang et al.)",
}


def gap_value(record: Mapping, kind: str = "ce") -> float | None:
    """The generalization gap ``kind`` (see :data:`GAPS`) of a run's record, ``None`` if it was not measured."""
    train = record.get("train", {})
    if kind == "ce":
        return train.get("generalization_gap")
    if kind == "error":
        acc_train, acc_val = train.get("train_accuracy"), train.get("eval_accuracy")
        return None if acc_train is None or acc_val is None else float(acc_train) - float(acc_val)
    raise ValueError(f"gap: expected one of {sorted(GAPS)}, got {kind!r}")


def _varied_axes(records: Sequence[Mapping], axes: Sequence[str] | None, axes_values: Mapping | None) -> list[str]:
    """The hyperparameter axes that vary (an axis with a single value is not an axis of the comparison)."""
    axes = list(axes) if axes is not None else sorted(records[0]["hparams"])
    values = axes_values or {a: [r["hparams"][a] for r in records] for a in axes}
    return [a for a in axes if len({repr(v) for v in values[a]}) > 1]


def _row(measure: str, used: Sequence[Mapping], gap: str, axes: Sequence[str], axes_values: Mapping | None) -> dict:
    from ..measures.correlation import granulated_kendall, kendall_tau

    row: dict[str, Any] = {
        "measure": measure,
        "description": MEASURES.get(measure, ""),
        "gap": gap,
        "n_runs": len(used),
        "tau": None,
        "psi": None,
        "psi_per_axis": {},
        "psi_groups": {},
        "psi_incomplete": {},
        "missing_runs": None,
    }
    if len(used) < 2:
        return row
    mv = [r["measures"][measure] for r in used]
    gv = [gap_value(r, gap) for r in used]
    try:
        row["tau"] = kendall_tau(mv, gv)
    except ValueError:  # a constant measure or gap: tau-b undefined
        row["tau"] = None
    if axes:
        grid = {a: list(axes_values[a]) for a in axes} if axes_values else None
        g = granulated_kendall(mv, gv, [{a: r["hparams"][a] for a in axes} for r in used], axes_values=grid)
        row.update(
            psi=g.psi,
            psi_per_axis=g.per_axis,
            psi_groups=g.groups,
            psi_incomplete=g.incomplete,
            missing_runs=g.missing_runs,
        )
    return row


def correlation_table(
    records: Sequence[Mapping],
    measures: Sequence[str] | None = None,
    axes: Sequence[str] | None = None,
    gap: str = "ce",
    axes_values: Mapping[str, Sequence] | None = None,
) -> list[dict]:
    """Kendall's τ-b and Jiang et al.'s granulated Ψ (with ψ_k, groups and missing runs) of each measure against the
    generalization gap ``gap`` (``"ce"`` or ``"error"``, see :data:`GAPS`).

    ``axes_values`` (the grid's axis -> values) fixes the groups Ψ averages over, so a run
    that is missing (not trained, or the measure undefined for it) counts as Jiang's
    formula says. Runs without the gap, or where the measure is undefined, are left out
    for that measure.
    """
    gap_value({}, gap)  # validates the name
    rows = []
    for m in list(measures or MEASURES):
        used = [r for r in records if r.get("measures", {}).get(m) is not None and gap_value(r, gap) is not None]
        varied = _varied_axes(used, axes, axes_values) if used else []
        rows.append(_row(m, used, gap, varied, axes_values))
    return rows


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:+.3f}"


def markdown_table(
    rows: Sequence[Mapping],
    axes: Sequence[str],
    reached: Sequence[Mapping] | None = None,
    error_rows: Sequence[Mapping] | None = None,
) -> str:
    """The correlation table as Markdown: one row per measure, τ, Ψ and each ψ_k side by side.

    With ``error_rows`` (the table against the 0–1 error gap) its τ and Ψ follow the first two columns; with
    ``reached`` (the table over the runs that reached the target training loss) its τ and Ψ are added at the end.
    """
    err = {r["measure"]: r for r in error_rows or []}
    by_measure = {r["measure"]: r for r in reached or []}
    first = " τ (CE gap) | Ψ (CE gap) |" + (" τ (0–1 gap) | Ψ (0–1 gap) |" if error_rows else "")
    head = "| measure |" + first + "".join(f" ψ {a} |" for a in axes) + " runs |"
    head += " τ (reached) | Ψ (reached) | runs (reached) |" if reached else ""
    ncols = 2 + (2 if error_rows else 0) + len(axes) + 1 + (3 if reached else 0)
    lines = [head, "|---|" + "---:|" * ncols]
    for r in rows:
        cells = [r["measure"], _fmt(r["tau"]), _fmt(r["psi"])]
        if error_rows:
            e = err.get(r["measure"], {})
            cells += [_fmt(e.get("tau")), _fmt(e.get("psi"))]
        cells += [_fmt(r["psi_per_axis"].get(a)) for a in axes] + [str(r["n_runs"])]
        if reached:
            q = by_measure.get(r["measure"], {})
            cells += [_fmt(q.get("tau")), _fmt(q.get("psi")), str(q.get("n_runs", 0))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write_table_csv(path: str, axes: Sequence[str], tables: Sequence[tuple[str, Sequence[Mapping]]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["runs", "gap", "measure", "tau", "psi", *[f"psi_{a}" for a in axes], "n_runs", "missing_runs"])
        for subset, table in tables:
            for r in table:
                w.writerow(
                    [
                        subset,
                        r["gap"],
                        r["measure"],
                        r["tau"],
                        r["psi"],
                        *[r["psi_per_axis"].get(a) for a in axes],
                        r["n_runs"],
                        r["missing_runs"],
                    ]
                )


def _write_runs_csv(path: str, axes: Sequence[str], records: Sequence[Mapping]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        train_keys = sorted({k for r in records for k in r["train"]})
        w.writerow(["key", *axes, *train_keys, "error_gap", *MEASURES])
        for r in records:
            w.writerow(
                [
                    r["key"],
                    *[r["hparams"].get(a) for a in axes],
                    *[r["train"].get(k) for k in train_keys],
                    gap_value(r, "error"),
                    *[r["measures"].get(m) for m in MEASURES],
                ]
            )


def _write_outputs(study_dir: str, summary: dict, records: Sequence[Mapping], axes: Sequence[str], plot: bool) -> dict:
    rows, rows_error, rows_reached = summary["table"], summary["table_error_gap"], summary["table_reached_target"]
    paths = {"json": os.path.join(study_dir, "table.json")}
    write_json_atomic(paths["json"], summary)
    paths["csv"] = os.path.join(study_dir, "table.csv")
    _write_table_csv(paths["csv"], axes, [("all", rows), ("all", rows_error), ("reached_target", rows_reached)])
    paths["markdown"] = os.path.join(study_dir, "table.md")
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        f.write(summary["markdown"] + "\n")
    paths["runs_csv"] = os.path.join(study_dir, "runs.csv")
    _write_runs_csv(paths["runs_csv"], axes, records)
    if plot:
        from ..viz.study import measure_scatter_grid

        paths["plot"] = os.path.join(study_dir, "scatter.png")
        measure_scatter_grid(records, rows).savefig(paths["plot"], dpi=120)
    return paths


def summarize(
    grid: StudyGrid,
    records: Sequence[Mapping],
    study_dir: str,
    settings: MeasureSettings | None = None,
    plot: bool = True,
    cached: int = 0,
    failures: Sequence[Mapping] = (),
) -> dict:
    """Write ``table.json``, ``table.csv``, ``table.md``, ``runs.csv`` and ``scatter.png`` for the finished runs.

    Tables: against the cross-entropy gap (``table``), the 0–1 error gap (``table_error_gap``), and the
    cross-entropy gap over the runs that reached the target training loss (``table_reached_target``).
    """
    axes = [a for a in grid.axes if len(grid.axes[a]) > 1]
    grid_values = {a: list(v) for a, v in grid.axes.items()}

    def table(recs, gap):
        return correlation_table(recs, axes=list(grid.axes), gap=gap, axes_values=grid_values) if len(recs) >= 2 else []

    converged = [r for r in records if r["train"].get("reached_train_loss_target")]
    rows, rows_error, rows_reached = table(records, "ce"), table(records, "error"), table(converged, "ce")
    summary = {
        "grid": grid.to_dict(),
        "settings": asdict(settings or MeasureSettings()),
        "gaps": dict(GAPS),
        "n_runs": len(records),
        "n_expected": len(grid.runs()),
        "complete": len(records) == len(grid.runs()),
        "cached": cached,
        "failures": list(failures),
        "reached_stop": sum(bool(r["train"].get("reached_train_loss_target")) for r in records),
        "table": rows,
        "table_error_gap": rows_error,
        "table_reached_target": rows_reached,
        "markdown": markdown_table(rows, axes, reached=rows_reached, error_rows=rows_error) if rows else "",
    }
    summary["paths"] = _write_outputs(study_dir, summary, records, axes, plot) if rows else {}
    return summary
