"""One model of a scan, as a worker measures it: every diagnostic still missing from the cache, one entry each.

A *spec* (a plain dict that crosses process boundaries) names the model (``model``, its local ``folder``, its
``model_hash``), the scan folder, the input set, the torch ``threads`` and its ``jobs``: one per diagnostic, with
the settings and the cache ``key``. The worker holds this one model while it runs and drops it before it returns.
A weight-only diagnostic (Schatten) streams the checkpoint's safetensors shards without loading the model where the
folder allows it (a decoder saved as safetensors, :mod:`hf_tdiag.probes.checkpoint`); when every job streams, the
model is never loaded. A diagnostic that raises is returned as a failure, the model's other diagnostics still run;
a model that cannot be loaded raises (the executor logs it). The task is safe to run twice (a Ray retry): a job
whose entry exists is skipped.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time
import traceback

from .cache import SCAN_VERSION, read_entry, write_entry

#: the diagnostics a scan runs, each with its rule in :func:`run_diagnostic` (token_snr needs each input's label,
#: which a scan's inputs do not carry: run ``hf-tdiag token-snr`` per model)
SCANNED = ("srr", "schatten", "concept_fidelity", "attention_svm", "objective_ledger")

# a model at least this large is collected at once when the worker drops it (a full gc.collect costs ~0.4 s with
# torch, transformers and pandas loaded: more than measuring a tiny model; smaller ones go with reference counting)
FULL_COLLECT_BYTES = 64 << 20

__all__ = ["load_for_scan", "measure_model", "report_rows", "run_diagnostic", "scalar_summary"]


def _python(value):
    """A table cell as plain Python (numpy scalars unwrapped, missing values None)."""
    if value is None:
        return None
    try:
        import pandas as pd

        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return value.item() if hasattr(value, "item") else value


def _flat_scalars(data: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(_flat_scalars(v, f"{prefix}{k}_"))
        elif v is None or isinstance(v, (bool, int, float, str)):
            out[f"{prefix}{k}"] = v
    return out


def scalar_summary(report) -> dict:
    """The report's ``summary()`` numbers (booleans and text left out): the per-model measures a scan compares."""
    return {
        k: float(v)
        for k, v in _flat_scalars(report.summary()).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def report_rows(name: str, report) -> tuple[list[dict], list[list[str]]]:
    """``(rows, [[column, dtype], ...])`` of ``report`` for the table: its ``to_pandas()`` rows; the attention-SVM report
    (whose frame has a row per sampled query) gives its one head as one row of its summary's scalars."""
    import pandas as pd

    if name == "attention_svm":
        frame = pd.DataFrame([_flat_scalars(report.summary())]).convert_dtypes()
    else:
        frame = report.to_pandas()
    columns = [[c, str(t)] for c, t in frame.dtypes.items()]
    rows = [{c: _python(v) for c, v in row.items()} for row in frame.to_dict("records")]
    return rows, columns


def _first_batch(loaded, items):
    from ..batching import encoded_batches

    return next(iter(encoded_batches(loaded, items, max(1, len(items)))))


def run_diagnostic(name: str, loaded, items: list, settings, *, folder: str | None = None, stream: bool = False):
    """Diagnostic ``name`` of the loaded model (``hf_tdiag.loading.LoadedModel``) on ``items`` (raw images or texts),
    as a scan runs it; with ``stream`` (Schatten), from the shards in ``folder`` instead of ``loaded``.

    SRR and the ledger run on the items in batches of the settings' ``batch_size``; concepts at block ⌊L/2⌋ (the
    ``concepts`` command's default layer); the attention SVM on head 0 of the last block; Schatten on the weights.
    """
    from ..batching import encoded_batches
    from ..diagnostics.registry import diagnostic

    fn = diagnostic(name).load_function()
    if name == "schatten":
        return fn(folder if stream else loaded.model, settings=settings.replace(streaming=stream))
    if not items:
        raise ValueError(f"inputs: {name} measures {loaded.modality}s; the scan was given none (inputs=)")
    if name == "srr":
        return fn(loaded.model, encoded_batches(loaded, items, settings.batch_size), settings=settings, progress=False)
    if name == "objective_ledger":
        return fn(loaded.model, encoded_batches(loaded, items, settings.batch_size), settings=settings)
    if name == "concept_fidelity":
        layer = int(loaded.model.config.num_hidden_layers) // 2
        if loaded.modality == "text":
            return fn(loaded.model, list(items), layer, settings=settings, tokenizer=loaded.processor, progress=False)
        return fn(loaded.model, _first_batch(loaded, items), layer, settings=settings, progress=False)
    if name == "attention_svm":
        from ..probes.describe import describe

        layer = describe(loaded.model).num_layers
        return fn(loaded.model, _first_batch(loaded, items), layer, 0, settings=settings, progress=False)
    raise ValueError(f"diagnostic: the scan has no rule for {name!r}")


def streamable(folder: str, trust_remote_code: bool = False) -> bool:
    """True when Schatten can read ``folder`` shard by shard: a local safetensors checkpoint of a decoder."""
    if not os.path.isdir(folder) or not any(n.endswith(".safetensors") for n in os.listdir(folder)):
        return False
    try:
        from ..probes.checkpoint import open_checkpoint
        from ..probes.describe import describe

        return describe(open_checkpoint(folder, trust_remote_code=trust_remote_code).meta_model).decoder is not None
    except Exception:  # not a layout the streaming reader knows: the loaded model is measured instead
        return False


def load_for_scan(folder: str, trust_remote_code: bool = False):
    """The model in ``folder`` as a scan measures it (``hf_tdiag.loading.load_model``, eval mode, sdpa attention);
    a trainer checkpoint is its run's model with the checkpoint's weights loaded (every key, strictly)."""
    from ..loading import load_model
    from .models import run_checkpoint_parent

    parent = run_checkpoint_parent(folder)
    loaded = load_model(parent or folder, eager_attention=False, trust_remote_code=trust_remote_code)
    if parent is not None:
        from safetensors.torch import load_file

        loaded.model.load_state_dict(load_file(os.path.join(folder, "model.safetensors")), strict=True)
        loaded.source = folder
    return loaded


def _versions() -> dict:
    import torch
    import transformers

    from .. import __version__

    return {"hf_tdiag": __version__, "torch": torch.__version__, "transformers": transformers.__version__}


def _entry(spec: dict, job: dict, report, seconds: float, load_seconds: float, streamed: bool) -> dict:
    rows, columns = report_rows(job["diagnostic"], report)
    return {
        "key": job["key"],
        "version": SCAN_VERSION,
        "model": spec["model"],
        "model_hash": spec["model_hash"],
        "hash_method": spec["hash_method"],
        "revision": spec.get("revision"),
        "diagnostic": job["diagnostic"],
        "settings": job["settings"],
        "settings_hash": job["settings_hash"],
        "inputs_hash": job["inputs_hash"],
        "num_inputs": job["num_inputs"],
        "rows": rows,
        "columns": columns,
        "summary": {k: v for k, v in scalar_summary(report).items() if math.isfinite(v)},
        "seconds": {"load": round(load_seconds, 6), "measure": round(seconds, 6)},
        "streamed": streamed,
        "versions": _versions(),
    }


def _measure(spec: dict, job: dict, loaded, items, load_seconds: float, stream: bool) -> dict:
    from ..diagnostics.registry import diagnostic

    settings = diagnostic(job["diagnostic"]).settings(**job["settings"])
    t0 = time.perf_counter()
    report = run_diagnostic(job["diagnostic"], loaded, items, settings, folder=spec["folder"], stream=stream)
    entry = _entry(spec, job, report, time.perf_counter() - t0, load_seconds, stream)
    write_entry(spec["scan_dir"], entry)
    return entry


def measure_model(spec: dict) -> dict:
    """Measure the spec's missing jobs; ``{"model", "measured": [keys], "failed": [{diagnostic, error,
    traceback}], "peak_rss_mb": the worker's peak resident memory}`` (what an executor hands to the scan)."""
    import torch

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    todo = [j for j in spec["jobs"] if read_entry(spec["scan_dir"], j["key"]) is None]
    out = {"model": spec["model"], "measured": [], "failed": []}
    trust = bool(spec.get("trust_remote_code"))
    stream = {j["key"] for j in todo if j["diagnostic"] == "schatten" and streamable(spec["folder"], trust)}

    def attempt(job, loaded, items, load_seconds):
        try:
            _measure(spec, job, loaded, items, load_seconds, job["key"] in stream)
        except Exception as err:  # this diagnostic fails for this model; the others still run
            out["failed"].append(
                {
                    "diagnostic": job["diagnostic"],
                    "error": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc(),
                }  # fmt: skip
            )
        else:
            out["measured"].append(job["key"])

    for job in (j for j in todo if j["key"] in stream):
        attempt(job, None, [], 0.0)
    rest = [j for j in todo if j["key"] not in stream]
    if rest:
        t0 = time.perf_counter()
        loaded = load_for_scan(spec["folder"], trust)
        load_seconds = time.perf_counter() - t0
        items = spec["inputs"].for_modality(loaded.modality)
        for job in rest:
            attempt(job, loaded, items, load_seconds)
        size = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
        del loaded
        if size >= FULL_COLLECT_BYTES:  # one model at a time: a large one is gone before the worker takes the next
            gc.collect()
    out["peak_rss_mb"] = _peak_rss_mb()
    return out


def _peak_rss_mb() -> float | None:
    """This process's peak resident memory so far, in MiB (None where the OS does not say)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024  # macOS: bytes, Linux: KiB
