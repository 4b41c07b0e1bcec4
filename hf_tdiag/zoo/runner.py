"""``scan``: plan the (model, diagnostic) pairs, measure the missing ones with an executor, rebuild the table."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .._validation import positive_int
from .cache import entry_key, read_entry, remove_temporaries, settings_hash

__all__ = ["ScanResult", "scan", "SCAN_OUTPUTS"]

# what a scan writes into its folder (the manifest's record); scan.json marks the folder as a scan's
SCAN_OUTPUTS = ("scan.json", "scan.parquet", "measures.csv", "correlations.csv", "failures.json", "hashes.json")
SCAN_RECORDS = (*SCAN_OUTPUTS, "cache", "dataset", "figures")


@dataclass
class ScanResult:
    """What :func:`scan` returns: the ``table`` (pandas), the per-model ``measures``, the ``correlations`` rows, this
    run's ``failures`` (model, diagnostic, error, traceback), the cache ``keys`` measured now and found cached, and
    the ``paths`` written."""

    table: object
    measures: object
    correlations: list[dict]
    failures: list[dict]
    measured: list[str]
    cached: list[str]
    paths: dict[str, str] = field(default_factory=dict)
    summary: dict = field(default_factory=dict)


def _diagnostics(diagnostics) -> list[str]:
    from ..diagnostics.registry import diagnostic

    if isinstance(diagnostics, str):
        diagnostics = [d for d in diagnostics.split(",") if d.strip()]
    if not isinstance(diagnostics, Sequence) or not diagnostics:
        raise ValueError(
            f"diagnostics: expected one or more diagnostic names (e.g. ['srr', 'schatten']), got {diagnostics!r}"
        )
    names = [diagnostic(str(d).strip()).name for d in diagnostics]
    from .worker import SCANNED

    unscanned = [n for n in names if n not in SCANNED]
    if unscanned:
        raise ValueError(f"diagnostics: a scan runs {', '.join(SCANNED)}; not {', '.join(unscanned)} (it needs labelled "
                         "inputs: run it per model with its own command)")  # fmt: skip
    return list(dict.fromkeys(names))


def _settings(names: list[str], settings) -> dict:
    from ..diagnostics.registry import diagnostic

    given = {} if settings is None else settings
    if not isinstance(given, Mapping):
        raise TypeError(f"settings: expected a mapping diagnostic -> settings object, got {type(given).__name__}")
    given = {diagnostic(k).name: v for k, v in given.items()}
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"settings: given for {unknown}, which the scan does not run (diagnostics={names})")
    out = {}
    for name in names:
        cls = diagnostic(name).settings
        value = given.get(name)
        if isinstance(value, Mapping):
            value = cls(**value)
        if value is not None and not isinstance(value, cls):
            raise TypeError(
                f"settings[{name!r}]: expected a {cls.__name__} or a dict of its fields, got {type(value).__name__}"
            )
        out[name] = value if value is not None else cls()
    return out


def _claim(output_dir: str, models: list[str], overwrite: bool) -> None:
    """Hold the scan folder: a folder an earlier scan wrote (its ``scan.json``, ``cache/`` or ``hashes.json``,
    recorded in the folder's manifest) continues, its cache reused; any other folder follows every command's rule
    (hf_tdiag._outputs.claim_output_dir)."""
    from .._outputs import check_not_in_use, claim_output_dir, hold_output_dir, owned_entries

    # a scan's folder, also one a killed scan left before its first table (its cache is there, its manifest owns it)
    if {"scan.json", "cache", "hashes.json"} & owned_entries(output_dir):
        check_not_in_use(output_dir)
        hold_output_dir(output_dir, SCAN_RECORDS)
        return
    claim_output_dir(output_dir, SCAN_OUTPUTS, overwrite=overwrite, inputs=[m for m in models if os.path.exists(m)],
                     records=SCAN_RECORDS, stale=("cache", "dataset", "figures"), notify=None)  # fmt: skip


def _read_json(path: str, default):
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return default


def _fingerprints(models: list[str], scan_dir: str, trust: bool, failures: list[dict]) -> dict[str, dict]:
    """model -> ``{"folder", "revision", "hash", "method", "bytes", "modality"}``; a model that cannot be read is a
    failure (logged, left out)."""
    from .._atomic import write_json
    from ..loading import _is_vision_config, load_config
    from .models import fingerprint, local_folder, run_checkpoint_parent

    memo_path = os.path.join(scan_dir, "hashes.json")
    memo = _read_json(memo_path, {})
    memo = memo if isinstance(memo, dict) else {}
    out = {}
    for model in models:
        try:
            folder, revision = local_folder(model)
            fp = fingerprint(folder, memo)
            config = load_config(run_checkpoint_parent(folder) or folder, trust_remote_code=trust, name="model")
        except Exception as err:  # noqa: BLE001 (logged with its reason; the scan goes on)
            failures.append(
                {"model": model, "diagnostic": None, "error": f"{type(err).__name__}: {err}", "traceback": ""}
            )
            continue
        modality = "image" if _is_vision_config(config) else "text"
        out[model] = {"folder": folder, "revision": revision, "modality": modality, **fp}
    write_json(memo_path, memo, sort_keys=True)
    return out


def _plan(models, prints, names, settings, inputs, scan_dir, trust):
    """The specs of the models with missing entries, every (model, key) pair in table order, the cached keys."""
    from ..diagnostics.registry import diagnostic

    digests = {n: settings_hash(n, settings[n]) for n in names}
    specs, pairs, cached, planned = [], [], [], set()
    for model in models:
        fp = prints.get(model)
        if fp is None:
            continue
        jobs = []
        for name in names:
            weight_only = not diagnostic(name).inputs
            inputs_hash = None if weight_only else inputs.hash(fp["modality"])
            key = entry_key(fp["hash"], name, digests[name], inputs_hash)
            pairs.append((model, key))
            if key in planned:
                continue
            planned.add(key)
            if read_entry(scan_dir, key) is not None:
                cached.append(key)
                continue
            count = 0 if weight_only else len(inputs.for_modality(fp["modality"]))
            jobs.append({"diagnostic": name, "settings": settings[name].to_dict(), "settings_hash": digests[name],
                         "inputs_hash": inputs_hash, "num_inputs": count, "key": key})  # fmt: skip
        if jobs:
            specs.append({"hparams": {"model": model}, "model": model, "folder": fp["folder"],
                          "revision": fp["revision"], "model_hash": fp["hash"], "hash_method": fp["method"],
                          "scan_dir": scan_dir, "inputs": inputs, "jobs": jobs, "trust_remote_code": trust})  # fmt: skip
    return specs, pairs, cached, digests


def _executor_options(executor: str, options: Mapping | None, prints: dict) -> dict:
    options = dict(options or {})
    if executor == "ray" and options.get("memory") is None and prints:
        options["memory"] = 2 * max(fp["bytes"] for fp in prints.values()) + (512 << 20)
    return options


def _summary(models, prints, names, settings, digests, inputs, failures, measured, cached) -> dict:
    from .. import __version__

    return {
        "kind": "hf-tdiag-scan",
        "hf_tdiag_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "models": [
            {
                "model": m,
                "model_hash": prints.get(m, {}).get("hash"),
                "hash_method": prints.get(m, {}).get("method"),
                "revision": prints.get(m, {}).get("revision"),
                "modality": prints.get(m, {}).get("modality"),
            }  # fmt: skip
            for m in models
        ],
        "diagnostics": {n: {"settings": settings[n].to_dict(), "settings_hash": digests[n]} for n in names},
        "inputs": {
            "described": inputs.described,
            "counts": {"images": len(inputs.images), "texts": len(inputs.texts)},
            "hashes": {"images": inputs.hash("image"), "texts": inputs.hash("text")},
        },
        "measured": len(measured),
        "cached": len(cached),
        "failures": [{k: f[k] for k in ("model", "diagnostic", "error")} for f in failures],
    }


def _metadata(metadata, hparams, models, prints) -> dict[str, dict]:
    """model -> metadata, read before anything is measured; a hyper-parameter no model has is a ValueError."""
    from .compare import read_metadata

    folders = {m: fp["folder"] for m, fp in prints.items()}
    meta = read_metadata(metadata, [m for m in models if m in prints], folders)
    columns = {c for row in meta.values() for c in row}
    missing = [h for h in hparams if h not in columns]
    if missing:
        raise ValueError(f"hparams: {missing} are not metadata columns of any model; columns: {sorted(columns)}")
    return meta


def _compare(scan_dir, measures, meta, hparams, figures: bool):
    from .._atomic import write_csv
    from .compare import correlations, figure_name, is_headline, measure_figure

    rows = correlations(measures, meta, hparams) if len(measures) else []
    paths = {}
    if rows:
        flat = [{**{k: v for k, v in r.items() if k != "psi_per_axis"},
                 **{f"psi_{a}": v for a, v in r["psi_per_axis"].items()}} for r in rows]  # fmt: skip
        paths["correlations"] = write_csv(os.path.join(scan_dir, "correlations.csv"), flat)
        if figures:
            from ..viz import save_figure

            for name in dict.fromkeys(r["measure"] for r in rows if is_headline(r["measure"])):
                fig = measure_figure(name, measures, meta, rows)
                if fig is not None:
                    save_figure(fig, os.path.join(scan_dir, figure_name(name)))
            paths["figures"] = os.path.join(scan_dir, "figures")
    return rows, paths


def _checked_output_dir(output_dir, jobs, threads, max_samples) -> str:
    """The scan folder as a string, after the counts are checked (before anything is read or written)."""
    positive_int(jobs, "jobs")
    positive_int(threads, "threads", allow_none=True)
    positive_int(max_samples, "max_samples", allow_none=True)
    if not isinstance(output_dir, (str, os.PathLike)) or not os.fspath(output_dir).strip():
        raise ValueError(f"output_dir: expected a folder path, got {output_dir!r}")
    return os.fspath(output_dir)


class _Collector:
    """The executor's ``on_done``: gathers each model's measured keys, failures and worker peak memory."""

    def __init__(self, failures: list[dict], progress: bool):
        self.failures, self.progress = failures, progress
        self.measured: list[str] = []
        self.worker_peaks: list[float] = []

    def __call__(self, spec, result, failure) -> None:
        if failure is not None:
            self.failures.append({"model": spec["model"], "diagnostic": None, "error": failure["error"],
                                  "traceback": failure["traceback"]})  # fmt: skip
            return
        self.measured.extend(result["measured"])
        if result.get("peak_rss_mb") is not None:
            self.worker_peaks.append(result["peak_rss_mb"])
        self.failures.extend({"model": spec["model"], **f} for f in result["failed"])
        if self.progress:
            print(f"scan: {spec['model']}: {len(result['measured'])} measured, {len(result['failed'])} failed")


def _write_tables(scan_dir: str, pairs, meta, hparams: list[str], figures: bool):
    """``(table, measures, correlation rows, paths)``: the table of every (model, key) pair's cached entry, written
    with the measures and the correlations (and their figures)."""
    from .._atomic import write_csv
    from .table import build_table, measures_frame, write_table

    entries = [(m, e) for m, k in pairs if (e := read_entry(scan_dir, k)) is not None]
    table, measures = build_table(entries), measures_frame(entries)
    paths = write_table(table, scan_dir)
    paths["measures"] = write_csv(os.path.join(scan_dir, "measures.csv"), measures.to_dict("records"))
    rows, more = _compare(scan_dir, measures, meta, hparams, figures)
    paths.update(more)
    return table, measures, rows, paths


def _write_summary(scan_dir: str, summary: dict, failures: list[dict], push_to_hub: str | None) -> dict[str, str]:
    """Write ``scan.json`` and ``failures.json`` (and push the table when asked); their paths."""
    from .._atomic import write_json

    paths = {"summary": write_json(os.path.join(scan_dir, "scan.json"), summary, sort_keys=True)}
    paths["failures"] = write_json(os.path.join(scan_dir, "failures.json"), failures)
    if push_to_hub:
        from .hub import push_scan

        paths["hub"] = push_scan(push_to_hub, scan_dir, summary)
    return paths


def scan(
    models,
    diagnostics,
    inputs=None,
    *,
    settings: Mapping | None = None,
    output_dir: str,
    executor: str = "local",
    jobs: int = 1,
    threads: int | None = None,
    metadata=None,
    hparams: Sequence[str] = (),
    executor_options: Mapping | None = None,
    max_samples: int | None = None,
    trust_remote_code: bool = False,
    overwrite: bool = False,
    push_to_hub: str | None = None,
    figures: bool = True,
    progress: bool = True,
) -> ScanResult:
    """Run ``diagnostics`` on every model of ``models`` and gather one tidy table (:mod:`hf_tdiag.zoo`).

    ``models``: folders, Hub ids, globs (``runs/main/checkpoint-*``) or list files (``@models.txt``); ``diagnostics``:
    names from the registry (``["srr", "schatten"]`` or ``"srr,schatten"``); ``inputs``: the input set
    (:func:`hf_tdiag.zoo.inputs.resolve_inputs`: a list of images or texts, or ``{"images": ..., "texts": ...}``),
    cut to ``max_samples`` per modality; ``settings``: ``{diagnostic: settings object or dict}`` (the rest at their
    defaults). ``executor``: ``"local"`` (``jobs`` processes with ``threads`` torch threads each; ``jobs=1`` in this
    process) or ``"ray"`` (one task per model; ``executor_options``: ``address``, ``num_cpus``, ``num_gpus``,
    ``max_retries``, ``memory`` in bytes, default twice the largest model's weights + 512 MiB).
    ``metadata``: a CSV path or a mapping model -> columns (models without a row: their folder's
    ``trainer_state.json`` / ``all_results.json``); ``hparams``: the metadata columns Ψ groups by. ``push_to_hub``:
    a dataset repository id to push the table and its card to.

    Writes into ``output_dir``: ``cache/`` (the source of truth), ``scan.parquet``, ``dataset/``, ``measures.csv``,
    ``scan.json``, ``failures.json``, and with targets ``correlations.csv`` (every summary number) and ``figures/``
    (one per headline measure, :data:`hf_tdiag.zoo.compare.HEADLINE`; ``figures=False``: none). A rerun measures only
    what the cache lacks; a model or diagnostic that fails is logged in ``failures`` and the others go on.
    """
    from ..study.executors import get_executor
    from .inputs import resolve_inputs
    from .models import expand_models
    from .worker import measure_model

    output_dir = _checked_output_dir(output_dir, jobs, threads, max_samples)
    names = _diagnostics(diagnostics)
    settings = _settings(names, settings)
    run_all = get_executor(executor)
    models = expand_models(models)
    inputs = resolve_inputs(inputs, limit=max_samples)
    _claim(output_dir, models, overwrite)
    remove_temporaries(output_dir)
    failures: list[dict] = []
    prints = _fingerprints(models, output_dir, trust_remote_code, failures)
    meta = _metadata(metadata, list(hparams), models, prints)
    specs, pairs, cached, digests = _plan(models, prints, names, settings, inputs, output_dir, trust_remote_code)
    done = _Collector(failures, progress)
    if specs:
        run_all(specs, jobs=jobs, threads=threads, on_done=done, task=measure_model,
                **_executor_options(executor, executor_options, prints))  # fmt: skip
    table, measures, rows, paths = _write_tables(output_dir, pairs, meta, list(hparams), figures)
    summary = _summary(models, prints, names, settings, digests, inputs, failures, done.measured, cached)
    summary["worker_peak_rss_mb"] = max(done.worker_peaks, default=None)
    paths.update(_write_summary(output_dir, summary, failures, push_to_hub))
    return ScanResult(table, measures, rows, failures, done.measured, cached, paths, summary)
