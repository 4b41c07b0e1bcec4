"""``run_study``: train every uncached run of a grid with an executor, then write the table and plots."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import asdict

from .._validation import positive_int
from .cache import STUDY_VERSION, read_record, record_path, remove_temporaries, run_key, write_json_atomic
from .executors import get_executor
from .grids import StudyGrid, resolve_grid
from .lock import study_lock
from .measures import MeasureSettings
from .table import summarize

__all__ = ["run_study"]


def _plan(
    grid: StudyGrid, study_dir: str, settings: MeasureSettings, train_fn, keep_models
) -> tuple[list[dict], list[dict]]:
    """The specs of the runs still to do, and the records of the cached ones."""
    specs, records = [], []
    for hp in grid.runs():
        key = run_key(hp, grid.fixed, settings)
        rec = read_record(record_path(study_dir, key), key)
        if rec is not None:
            records.append(rec)
            continue
        specs.append(
            {
                "key": key,
                "hparams": hp,
                "fixed": copy.deepcopy(grid.fixed),
                "settings": asdict(settings),
                "study_dir": study_dir,
                "train_fn": train_fn,
                "keep_models": keep_models,
            }
        )
    return specs, records


def check_study_dir(study_dir: str, grid: StudyGrid, overwrite: bool) -> None:
    """Refuse a folder whose ``study.json`` describes another grid (unless ``overwrite``): its table would be
    replaced by this one's. The cached runs stay either way (their keys tell them apart)."""
    import json

    path = os.path.join(study_dir, "study.json")
    try:
        with open(path, encoding="utf-8") as fh:
            old = json.load(fh).get("grid")
    except FileNotFoundError:
        return
    except (OSError, ValueError, AttributeError) as err:
        if not overwrite:
            raise ValueError(
                f"study_dir: {path!r} cannot be read ({err}); pass --overwrite-output-dir (overwrite=True) to replace "
                "it, or choose another folder"
            ) from None
        return
    new = json.loads(json.dumps(grid.to_dict(), default=str))
    if old != new and not overwrite:
        name = old.get("name") if isinstance(old, dict) else old
        raise ValueError(
            f"study_dir: {study_dir!r} holds a study of another grid ({name!r}, other axes or settings than "
            f"{grid.name!r}); pass --overwrite-output-dir (overwrite=True) to replace its study.json and tables "
            "(cached runs are kept), or choose another folder"
        )


def _run_uncached(
    grid,
    study_dir,
    settings,
    run_all,
    *,
    jobs,
    threads,
    train_fn,
    limit,
    keep_models,
    progress,
    on_record,
    executor_options,
    overwrite=False,
):
    """Train every uncached run (at most ``limit``); return all records in grid order, the cached count, the failures."""
    from .._progress import tqdm

    check_study_dir(study_dir, grid, overwrite)
    os.makedirs(os.path.join(study_dir, "runs"), exist_ok=True)
    write_json_atomic(
        os.path.join(study_dir, "study.json"),
        {"grid": grid.to_dict(), "settings": asdict(settings), "version": STUDY_VERSION, "train_fn": train_fn},
    )
    remove_temporaries(study_dir)
    specs, records = _plan(grid, study_dir, settings, train_fn, keep_models)
    cached = len(records)
    if limit is not None:
        specs = specs[: max(0, int(limit))]
    bar = tqdm(total=len(specs), desc=f"study {grid.name} ({cached} cached)", disable=not progress)
    failures = []

    def on_done(spec, rec, failure):
        if failure is not None:
            failures.append(failure)
        else:
            records.append(rec)
            if on_record:
                on_record(rec)
        bar.update(1)

    run_all(specs, jobs=jobs, threads=threads, on_done=on_done, **executor_options)
    bar.close()
    order = {run_key(hp, grid.fixed, settings): i for i, hp in enumerate(grid.runs())}
    records.sort(key=lambda r: order.get(r["key"], len(order)))
    return records, cached, failures


def run_study(
    grid: StudyGrid | str,
    study_dir: str,
    jobs: int = 1,
    settings: MeasureSettings | None = None,
    train_fn: str | None = None,
    limit: int | None = None,
    keep_models: bool = False,
    plot: bool = True,
    progress: bool = True,
    on_record: Callable[[dict], None] | None = None,
    threads: int | None = None,
    executor: str = "local",
    executor_options: dict | None = None,
    overwrite: bool = False,
) -> dict:
    """Run (or continue) a study: train every uncached run of ``grid``, then write the table and plots.

    ``train_fn`` is an importable ``"module:function"`` taking ``(hparams, fixed,
    output_dir, max_examples=...)`` and returning ``(results, model, train_examples)`` with
    ``results["generalization_gap"]`` and ``train_examples`` a ``(pixel_values,
    labels)`` pair or a dataset of ``{"pixel_values", "labels"}`` items; the
    default trains with :func:`hf_tdiag.training.train`. ``limit`` stops after that many new runs
    (for smoke tests). ``threads`` is the number of torch CPU threads per job
    (default: ``cpu_count // jobs`` in worker processes, unchanged when
    ``jobs == 1``); results are reproducible bit for bit only at equal thread
    counts. ``executor`` names who runs the runs: ``"local"`` or ``"ray"``, with ``executor_options``
    for it (Ray: ``address``, ``num_cpus``, ``num_gpus``, ``max_retries``; see :mod:`hf_tdiag.study.executors`).
    Only one study runs in a folder at a time: a second one raises :class:`StudyLockedError`. A folder whose
    ``study.json`` describes another grid is refused unless ``overwrite``.
    Returns a summary with the table and the output paths.
    """
    grid = resolve_grid(grid)
    positive_int(jobs, "jobs")
    positive_int(threads, "threads", allow_none=True)
    run_all = get_executor(executor)
    settings = settings or MeasureSettings()
    with study_lock(study_dir):
        records, cached, failures = _run_uncached(
            grid,
            study_dir,
            settings,
            run_all,
            jobs=jobs,
            threads=threads,
            train_fn=train_fn,
            limit=limit,
            keep_models=keep_models,
            progress=progress,
            on_record=on_record,
            executor_options=dict(executor_options or {}),
            overwrite=overwrite,
        )
        return summarize(grid, records, study_dir, settings=settings, plot=plot, cached=cached, failures=failures)
