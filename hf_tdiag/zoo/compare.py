"""Compare a scan's measures with what is known about each model: Kendall's τ-b per (measure, target), and
Jiang et al.'s granulated Ψ when the zoo varies named hyper-parameters — the study's code
(:mod:`hf_tdiag.measures.correlation`).

Metadata per model comes from a CSV file with a ``model`` column (matched to the scan's models as given, or as the
same folder), a mapping ``model -> {column: value}``, or, for a model without a row, the numbers in its folder's
``trainer_state.json`` (a checkpoint's step and epoch) and ``all_results.json`` (the trainer's accuracies and
gap). The numeric columns are the *targets*; the columns named in ``hparams`` are the axes Ψ groups the models by.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Mapping, Sequence

__all__ = ["HEADLINE", "correlations", "folder_metadata", "is_headline", "measure_figure", "read_metadata"]

FOLDER_FILES = ("trainer_state.json", "all_results.json")
# the measures drawn as figures (correlations.csv ranks every summary number): each diagnostic's headline numbers
HEADLINE = {
    "srr": ("srr_mean_over_layers", "srr_last_layer"),
    "schatten": ("schatten_bound", "edelman_bound"),
    "objective_ledger": ("fraction_decreasing", "mean_relative_change"),
    "concept_fidelity": ("kl", "delta_rec_rel"),
    "attention_svm": ("correlation", "margin_ratio"),
}


def is_headline(measure: str) -> bool:
    """True for ``<diagnostic>.<name>`` among the diagnostic's :data:`HEADLINE` numbers."""
    diagnostic, _, name = measure.partition(".")
    return name in HEADLINE.get(diagnostic, ())


def _number(value):
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            x = float(value)
        except ValueError:
            return value.strip() or None
        return x if math.isfinite(x) else None
    return None


def _numbers(data) -> dict:
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _trainer_state(data: dict) -> dict:
    """A checkpoint's step and epoch, and what its history logged at that step (``eval_accuracy``, ``eval_loss``):
    hf-tdiag's trainer (``step``, ``history``) or Transformers' Trainer (``global_step``, ``log_history``)."""
    step = data.get("step", data.get("global_step"))
    out = {"step": float(step)} if isinstance(step, (int, float)) and not isinstance(step, bool) else {}
    if isinstance(data.get("epoch"), (int, float)):
        out["epoch"] = float(data["epoch"])
    history = data.get("history", data.get("log_history"))
    for entry in history if isinstance(history, list) else []:
        if isinstance(entry, dict) and step is not None and entry.get("step") == step:
            out.update(_numbers(entry))
    return out


def folder_metadata(folder: str) -> dict:
    """Numbers about the model in ``folder``: from a checkpoint's ``trainer_state.json`` its step, epoch and what
    its history logged at that step; from ``all_results.json`` (the trainer's results) every top-level number."""
    out = {}
    for name in FOLDER_FILES:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out.update(_trainer_state(data) if name == "trainer_state.json" else _numbers(data))
    return out


def _same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except OSError:
        return False


def read_metadata(metadata, models: Sequence[str], folders: Mapping[str, str] | None = None) -> dict[str, dict]:
    """``model -> {column: number or text}`` for each of ``models``: the CSV file / mapping ``metadata`` where it
    has the model, else the model folder's :data:`FOLDER_FILES` (``folders``: model -> local folder)."""
    table: dict[str, dict] = {}
    if isinstance(metadata, (str, os.PathLike)):
        path = os.fspath(metadata)
        try:
            with open(path, encoding="utf-8-sig", newline="") as fh:
                rows = list(csv.DictReader(fh))
        except OSError as err:
            raise ValueError(f"metadata: cannot read {path!r} ({err.strerror or err})") from None
        if not rows or "model" not in rows[0]:
            raise ValueError(f"metadata: {path!r} has no 'model' column; expected a CSV with a header row naming it")
        given = {r["model"].strip(): {k: _number(v) for k, v in r.items() if k != "model"} for r in rows}
    elif isinstance(metadata, Mapping):
        given = {str(k): {c: _number(v) for c, v in dict(row).items()} for k, row in metadata.items()}
    elif metadata is None:
        given = {}
    else:
        raise TypeError(f"metadata: expected a CSV path or a mapping model -> columns, got {type(metadata).__name__}")
    used = set()
    for model in models:
        hit = next((k for k in given if _same_model(k, model)), None)
        if hit is not None:
            used.add(hit)
            table[model] = dict(given[hit])
        else:
            table[model] = (
                folder_metadata((folders or {}).get(model, model))
                if os.path.isdir((folders or {}).get(model, model))
                else {}
            )
    unknown = sorted(set(given) - used)
    if unknown:
        raise ValueError(f"metadata: rows for models the scan does not have: {unknown[:5]}; check the 'model' column")
    return table


def correlations(measures, metadata: Mapping[str, dict], hparams: Sequence[str] = ()) -> list[dict]:
    """One row per (measure, target): ``n`` models with both, Kendall's ``tau`` (None when fewer than 2 or either is
    constant) and, with ``hparams``, Ψ and ψ per axis over the models that set every axis.

    ``measures``: the scan's per-model frame (``model`` and ``<diagnostic>.<measure>`` columns)."""
    from ..measures.correlation import granulated_kendall, kendall_tau

    hparams = list(hparams)
    targets = sorted(
        {c for row in metadata.values() for c, v in row.items() if isinstance(v, float) and c not in hparams}
    )
    out = []
    names = [c for c in measures.columns if c not in ("model", "model_hash")]
    for name in names:
        for target in targets:
            pairs = []
            for model, value in zip(measures["model"], measures[name]):
                meta = metadata.get(model, {})
                y = meta.get(target)
                if value is not None and not _isnan(value) and isinstance(y, float):
                    pairs.append((float(value), y, {a: meta.get(a) for a in hparams}))
            row = {"measure": name, "target": target, "n": len(pairs), "tau": None, "psi": None, "psi_per_axis": {}}
            if len(pairs) >= 2:
                xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
                try:
                    row["tau"] = kendall_tau(xs, ys)
                except ValueError:  # a constant measure or target
                    pass
                axes = [a for a in hparams if len({repr(p[2][a]) for p in pairs}) > 1]
                full = [p for p in pairs if all(p[2][a] is not None for a in axes)]
                if axes and len(full) >= 2:
                    g = granulated_kendall([p[0] for p in full], [p[1] for p in full], [
                        {a: p[2][a] for a in axes} for p in full])  # fmt: skip
                    row.update(psi=g.psi, psi_per_axis=g.per_axis)
            out.append(row)
    return out


def _isnan(value) -> bool:
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return True


def _file_name(measure: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", measure) + ".png"


def measure_figure(measure: str, measures, metadata: Mapping[str, dict], rows: Sequence[dict]):
    """A scatter of ``measure`` against each target (one panel each, τ in the title); None without targets."""
    from ..viz import new_subplots

    mine = [r for r in rows if r["measure"] == measure and r["n"] >= 2]
    if not mine:
        return None
    fig, axes = new_subplots(1, len(mine), (3.2 * len(mine), 3.0), layout="constrained")
    for ax, row in zip(axes[0], mine):
        xs, ys = [], []
        for model, value in zip(measures["model"], measures[measure]):
            y = metadata.get(model, {}).get(row["target"])
            if not _isnan(value) and isinstance(y, float):
                xs.append(float(value))
                ys.append(y)
        ax.scatter(xs, ys, s=16)
        tau = "n/a" if row["tau"] is None else f"{row['tau']:+.2f}"
        ax.set_title(f"τ = {tau}" + ("" if row["psi"] is None else f", Ψ = {row['psi']:+.2f}"), fontsize=9)
        ax.set_xlabel(measure, fontsize=8)
        ax.set_ylabel(row["target"], fontsize=8)
    return fig


def figure_name(measure: str) -> str:
    """The figure file of ``measure`` (``figures/<measure>.png``, unsafe characters replaced)."""
    return os.path.join("figures", _file_name(measure))
