"""Does SRR predict generalization? The correlation study of Hu, Zou & Xu (NeurIPS 2024).

Trains a grid of CRATE-family models (axes: variant, batch size, learning rate,
weight decay or dropout), each to the stop criterion (training loss ≤ 0.01 or
the step budget), records the generalization gap (validation loss − training
loss), computes the SRR measure and the baselines of Jiang et al. (2020) on the
training data, and ranks them by Kendall's τ and the granulated Ψ against the
gap.

Resumability: every finished run is one JSON file ``<study_dir>/runs/<key>.json``
written atomically (temporary file + ``os.replace``), where ``key`` hashes the
run's complete settings. A study killed at any point loses at most the runs in
flight; running it again skips every cached run (and the default trainer
resumes the interrupted training from its last epoch checkpoint). ``jobs > 1``
trains several runs at once in separate processes, each with ``cpu_count //
jobs`` threads and, where GPUs are present, its own GPU (round-robin).

Data flow: trainer → model → probes (weights, SRR) → measures (complexity,
sharpness, correlation) → table / plots. This module only wires them.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import csv
import hashlib
import importlib
import itertools
import json
import math
import multiprocessing as mp
import os
import shutil
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

__all__ = [
    "GRIDS",
    "MEASURES",
    "StudyGrid",
    "MeasureSettings",
    "run_key",
    "compute_measures",
    "run_study",
    "correlation_table",
    "load_records",
    "write_json_atomic",
]

STUDY_VERSION = 1

# measure name -> (label, what it is); the order is the table's order
MEASURES: dict[str, str] = {
    "srr_mean": "SRR, mean over layers (training data)",
    "srr_last": "SRR at the last layer (training data)",
    "l2_norm": "ℓ2 norm of all parameters",
    "path_norm": "path-norm: squared-weight forward of an all-ones input",
    "sum_spectral": "Σ spectral norms of the weight matrices",
    "log_prod_spectral": "log Π spectral norms of the weight matrices",
    "inverse_margin": "1/γ², γ = 10th-percentile output margin (training data)",
    "sharpness": "worst-case loss increase in a relative ρ-box (projected ascent)",
    "pac_bayes_flatness": "1/σ², σ = largest Gaussian weight noise keeping the loss increase ≤ threshold",
}


@dataclass
class StudyGrid:
    """A grid of training runs: ``axes`` are varied (cartesian product), ``fixed`` trainer settings are shared."""

    name: str
    axes: dict[str, list]
    fixed: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def __post_init__(self):
        if not isinstance(self.axes, Mapping) or not self.axes:
            raise ValueError(f"axes: expected a non-empty mapping axis -> list of values, got {self.axes!r}")
        for k, v in self.axes.items():
            if not isinstance(v, (list, tuple)) or len(v) == 0:
                raise ValueError(f"axes[{k!r}]: expected a non-empty list of values, got {v!r}")
            if len(set(map(json.dumps, v))) != len(v):
                raise ValueError(f"axes[{k!r}]: values must be distinct, got {v!r}")
        overlap = set(self.axes) & set(self.fixed)
        if overlap:
            raise ValueError(f"fixed: keys {sorted(overlap)} are also grid axes")

    def runs(self) -> list[dict[str, Any]]:
        """Every combination of axis values, as a dict per run (in a fixed order)."""
        keys = list(self.axes)
        return [dict(zip(keys, values)) for values in itertools.product(*(self.axes[k] for k in keys))]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "axes": dict(self.axes), "fixed": dict(self.fixed), "description": self.description}


@dataclass
class MeasureSettings:
    """How the measures are computed on each trained model (all on the training data)."""

    max_examples: int = 512  # training examples used for SRR and the margin
    batch_size: int = 128
    srr_eps: float = 0.1
    srr_lambda: float = 1.0
    sharpness_rho: float = 0.01
    sharpness_steps: int = 5
    sharpness_batches: int = 2
    pac_threshold: float = 0.1
    pac_samples: int = 3
    pac_iters: int = 10
    margin_quantile: float = 0.1
    seed: int = 0


# --------------------------------------------------------------------------- grids

_VARIANTS = ["crate", "crate-c", "crate-n", "crate-t"]

GRIDS: dict[str, StudyGrid] = {
    "digits": StudyGrid(
        name="digits",
        description="CRATE family on scikit-learn's 8x8 digits (embedded, offline); 32 runs, < 30 min on 2 CPU cores.",
        axes={
            "variant": list(_VARIANTS),
            "per_device_train_batch_size": [32, 128],
            "learning_rate": [1e-3, 3e-3],
            "weight_decay": [0.0, 0.1],
        },
        fixed={
            "preset": "crate-digits",
            # the trainer's digits recipe, pinned so the cache never outlives a change of its defaults
            "image_size": 16,
            "patch_size": 4,
            "pooling": "mean",
            "stop_at_train_loss": 0.01,
            "num_train_epochs": 100,
            "seed": 0,
        },
    ),
    "tiny": StudyGrid(
        name="tiny",
        description="2x2 smoke grid (seconds): two variants x two learning rates, a very small CRATE, few steps.",
        axes={"variant": ["crate", "crate-c"], "learning_rate": [3e-3, 1e-2]},
        fixed={
            "preset": "crate-digits",
            "image_size": 16,
            "patch_size": 4,
            "pooling": "mean",
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "stop_at_train_loss": 0.01,
            "max_train_steps": 80,
            "per_device_train_batch_size": 64,
            "seed": 0,
        },
    ),
    "cifar10": StudyGrid(
        name="cifar10",
        description=(
            "The paper's setting on GPUs: CIFAR-10 at 32 px, CRATE-32; 4 variants x 3 batch sizes x 3 learning rates "
            "x 3 weight decays = 108 runs, each to training loss 0.01 (needs the Hub dataset 'cifar10')."
        ),
        axes={
            "variant": list(_VARIANTS),
            "per_device_train_batch_size": [64, 128, 256],
            "learning_rate": [1e-4, 3e-4, 1e-3],
            "weight_decay": [0.0, 0.05, 0.1],
        },
        fixed={
            "preset": "crate-32",
            "dataset_name": "cifar10",
            "stop_at_train_loss": 0.01,
            "num_train_epochs": 200,
            "mixed_precision": "bf16",
            "seed": 0,
        },
    ),
}


# --------------------------------------------------------------------------- cache


def run_key(hparams: Mapping[str, Any], fixed: Mapping[str, Any], settings: MeasureSettings) -> str:
    """Hash of everything that determines a run's result (its hyperparameters, the shared settings, the measures)."""
    payload = {
        "version": STUDY_VERSION,
        "hparams": dict(hparams),
        "fixed": dict(fixed),
        "measures": asdict(settings),
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def write_json_atomic(path: str, obj: Any) -> None:
    """Write JSON so that ``path`` either holds the old content or the complete new one, never a partial file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, sort_keys=True, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_record(path: str, key: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("key") != key or "train" not in rec or "measures" not in rec:
        return None
    return rec


def load_records(study_dir: str) -> list[dict]:
    """Every finished run cached under ``study_dir/runs`` (unreadable or partial files are ignored)."""
    runs_dir = os.path.join(study_dir, "runs")
    if not os.path.isdir(runs_dir):
        return []
    out = []
    for name in sorted(os.listdir(runs_dir)):
        if name.endswith(".json") and not name.startswith("."):
            rec = _read_record(os.path.join(runs_dir, name), name[: -len(".json")])
            if rec is not None:
                out.append(rec)
    return out


# --------------------------------------------------------------------------- measures


def _finite_or_none(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def compute_measures(
    model, pixel_values, labels, settings: MeasureSettings | None = None, progress: bool = False
) -> tuple[dict[str, float | None], dict[str, str]]:
    """All measures of :data:`MEASURES` for a trained image classifier on (a subset of) its training data.

    Returns ``(values, errors)``: a measure that is undefined for this model (e.g. the
    inverse margin when ≥10% of the examples are misclassified) is ``None`` in
    ``values`` and its reason is in ``errors``.
    """
    import torch
    from torch.nn import functional as F

    from .measures import complexity, sharpness as sharp
    from .probes import weights as wprobe

    settings = settings or MeasureSettings()
    if not isinstance(pixel_values, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError("pixel_values, labels: expected torch.Tensors")
    if pixel_values.shape[0] != labels.shape[0]:
        raise ValueError(f"labels: expected {pixel_values.shape[0]} labels for the images, got {labels.shape[0]}")
    n = min(settings.max_examples, pixel_values.shape[0])
    device = next(model.parameters()).device
    x = pixel_values[:n].to(device)
    y = labels[:n].to(device)
    batches = [(x[i : i + settings.batch_size], y[i : i + settings.batch_size]) for i in range(0, n, settings.batch_size)]
    was_training = model.training
    model.eval()
    values: dict[str, float | None] = {}
    errors: dict[str, str] = {}

    def attempt(name: str, fn: Callable[[], Any]):
        try:
            values[name] = _finite_or_none(fn())
            if values[name] is None:
                errors[name] = "not finite"
        except (ValueError, RuntimeError) as err:
            values[name] = None
            errors[name] = f"{type(err).__name__}: {err}"

    try:
        srr = {}

        def srr_values():
            from .probes.srr import layer_srr

            report = layer_srr(
                model, x, batch_size=settings.batch_size, eps=settings.srr_eps, lam=settings.srr_lambda,
                include_mid=False, progress=progress,
            )
            per_layer = [float(v) for v in report.mean["block_input"]["srr"]]
            srr["per_layer"] = per_layer
            return per_layer

        try:
            per_layer = srr_values()
            values["srr_mean"] = _finite_or_none(sum(per_layer) / len(per_layer))
            values["srr_last"] = _finite_or_none(per_layer[-1])
        except (ValueError, RuntimeError) as err:
            values["srr_mean"] = values["srr_last"] = None
            errors["srr_mean"] = errors["srr_last"] = f"{type(err).__name__}: {err}"

        params = list(wprobe.trainable_parameters(model).values())
        mats = wprobe.weight_matrices(model)
        attempt("l2_norm", lambda: complexity.l2_norm(params))
        attempt("path_norm", lambda: wprobe.path_norm(model, {"pixel_values": x[:1]}))
        attempt("sum_spectral", lambda: complexity.sum_spectral_norm(mats))
        attempt("log_prod_spectral", lambda: complexity.log_prod_spectral_norm(mats))

        with torch.no_grad():
            logits = torch.cat([model(pixel_values=bx).logits for bx, _ in batches])
        attempt("inverse_margin", lambda: complexity.inverse_margin(logits, y, quantile=settings.margin_quantile))

        def loss_fn(batch):
            return F.cross_entropy(model(pixel_values=batch[0]).logits.float(), batch[1])

        sb = batches[: settings.sharpness_batches]
        attempt(
            "sharpness",
            lambda: sharp.sharpness(loss_fn, params, sb, rho=settings.sharpness_rho, steps=settings.sharpness_steps, progress=progress),
        )
        attempt(
            "pac_bayes_flatness",
            lambda: sharp.pac_bayes_flatness(
                loss_fn, params, sb, threshold=settings.pac_threshold, samples=settings.pac_samples,
                iters=settings.pac_iters, seed=settings.seed, progress=progress,
            )["flatness"],
        )
        if "per_layer" in srr:
            values["_srr_per_layer"] = srr["per_layer"]  # kept for plots; not a ranked measure
    finally:
        model.train(was_training)
    return values, errors


# --------------------------------------------------------------------------- training one run


def _resolve(path: str) -> Callable:
    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"train_fn: expected 'module:function', got {path!r}")
    return getattr(importlib.import_module(module), attr)


def _default_train(hparams: Mapping[str, Any], fixed: Mapping[str, Any], output_dir: str, max_examples: int | None = None):
    """Train one run with :func:`hf_tdiag.training.train`; return ``(results, model, training examples)``.

    The training examples are the first ``max_examples`` of the training split,
    preprocessed as the trainer's train-set evaluation sees them (no augmentation).

    The run checkpoints every epoch and resumes from its latest checkpoint, so a
    study killed in the middle of a training continues that training too.
    """
    from .training import train
    from .training.args import make_args
    from .training.data import build_datasets, load_raw_data
    from .training.model import image_size_of

    kwargs = {"disable_tqdm": True, "layer_srr_samples": 0, "checkpointing_steps": "epoch", "checkpoints_total_limit": 1}
    kwargs.update(fixed)
    kwargs.update(hparams)
    if kwargs.get("checkpointing_steps") is not None:
        kwargs.setdefault("resume_from_checkpoint", "latest")
    results = train(output_dir=output_dir, **kwargs)
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(output_dir)
    processor = AutoImageProcessor.from_pretrained(output_dir)
    args = make_args(output_dir=output_dir, **kwargs)
    if max_examples:
        args.max_train_samples = min(args.max_train_samples or max_examples, max_examples)
        args.max_eval_samples = 1  # only the training examples are needed
    raw = load_raw_data(args)
    data = build_datasets(args, raw, processor, model.config.num_channels, image_size_of(model.config))
    return results, model, data.train_eval


def _examples(train_examples, n: int):
    """First ``n`` training examples as ``(pixel_values, labels)`` tensors."""
    import torch

    if isinstance(train_examples, (tuple, list)) and len(train_examples) == 2:
        x, y = train_examples
        return x[:n], y[:n]
    count = min(n, len(train_examples))
    items = [train_examples[i] for i in range(count)]
    return torch.stack([it["pixel_values"] for it in items]), torch.stack([torch.as_tensor(it["labels"]) for it in items])


def _execute(spec: dict) -> dict:
    """Train, measure and cache one run (runs in a worker process when ``jobs > 1``)."""
    import torch

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    t0 = time.time()
    train_fn = _resolve(spec["train_fn"]) if spec.get("train_fn") else _default_train
    work_dir = os.path.join(spec["study_dir"], "work", spec["key"])
    settings = MeasureSettings(**spec["settings"])
    results, model, train_examples = train_fn(spec["hparams"], spec["fixed"], work_dir, max_examples=settings.max_examples)
    train_seconds = time.time() - t0
    pixel_values, labels = _examples(train_examples, settings.max_examples)
    values, errors = compute_measures(model, pixel_values, labels, settings)
    per_layer = values.pop("_srr_per_layer", None)
    record = {
        "key": spec["key"],
        "version": STUDY_VERSION,
        "hparams": spec["hparams"],
        "fixed": spec["fixed"],
        "train": {k: v for k, v in results.items() if isinstance(v, (int, float, str, bool)) or v is None},
        "measures": values,
        "measure_errors": errors,
        "srr_per_layer": per_layer,
        "model_config": {
            k: getattr(model.config, k, None)
            for k in ("model_type", "variant", "image_size", "patch_size", "num_channels", "hidden_size",
                      "num_hidden_layers", "num_attention_heads", "head_dim", "pooling", "hidden_dropout_prob")
        },
        "seconds": {"train": round(train_seconds, 3), "total": round(time.time() - t0, 3)},
    }
    for k, v in record["train"].items():
        if isinstance(v, float) and not math.isfinite(v):
            record["train"][k] = None
    write_json_atomic(os.path.join(spec["study_dir"], "runs", f"{spec['key']}.json"), record)
    if not spec.get("keep_models"):
        shutil.rmtree(work_dir, ignore_errors=True)
    return record


def _init_worker(threads: int, gpu_queue=None):
    """Worker setup: CPU threads, and one GPU per worker (``CUDA_VISIBLE_DEVICES``) when GPUs are present."""
    if gpu_queue is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu_queue.get())
    import torch

    torch.set_num_threads(max(1, threads))


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install must not stop a CPU study
        return 0


# --------------------------------------------------------------------------- the study


def correlation_table(records: Sequence[Mapping], measures: Sequence[str] | None = None, axes: Sequence[str] | None = None) -> list[dict]:
    """Kendall τ and granulated Ψ (with per-axis ψ_k) of each measure against the generalization gap.

    Runs without a gap, or where the measure is undefined, are left out for that measure.
    """
    from .measures.correlation import granulated_kendall, kendall_tau

    measures = list(measures or MEASURES)
    rows = []
    for m in measures:
        used = [
            r for r in records
            if r.get("measures", {}).get(m) is not None and r.get("train", {}).get("generalization_gap") is not None
        ]
        row: dict[str, Any] = {"measure": m, "description": MEASURES.get(m, ""), "n_runs": len(used), "tau": None, "psi": None, "psi_per_axis": {}}
        if len(used) >= 2:
            mv = [r["measures"][m] for r in used]
            gv = [r["train"]["generalization_gap"] for r in used]
            hp_axes = list(axes) if axes is not None else sorted(used[0]["hparams"])
            hps = [{a: r["hparams"][a] for a in hp_axes} for r in used]
            try:
                row["tau"] = kendall_tau(mv, gv)
            except ValueError:
                row["tau"] = None
            g = granulated_kendall(mv, gv, hps)
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
    counts. Returns a summary with the table and the output paths.
    """
    from tqdm.auto import tqdm

    if isinstance(grid, str):
        if grid not in GRIDS:
            raise ValueError(f"grid: unknown grid {grid!r}; available: {sorted(GRIDS)}")
        grid = GRIDS[grid]
    if not isinstance(grid, StudyGrid):
        raise TypeError(f"grid: expected a StudyGrid or a grid name, got {type(grid).__name__}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: expected a positive integer, got {jobs!r}")
    settings = settings or MeasureSettings()
    os.makedirs(os.path.join(study_dir, "runs"), exist_ok=True)
    write_json_atomic(
        os.path.join(study_dir, "study.json"),
        {"grid": grid.to_dict(), "settings": asdict(settings), "version": STUDY_VERSION, "train_fn": train_fn},
    )
    # clean temporary files of a killed writer
    for name in os.listdir(os.path.join(study_dir, "runs")):
        if name.startswith(".tmp-"):
            try:
                os.unlink(os.path.join(study_dir, "runs", name))
            except OSError:
                pass
    specs, records = [], []
    for hp in grid.runs():
        key = run_key(hp, grid.fixed, settings)
        rec = _read_record(os.path.join(study_dir, "runs", f"{key}.json"), key)
        if rec is not None:
            records.append(rec)
            continue
        specs.append(
            {
                "key": key, "hparams": hp, "fixed": copy.deepcopy(grid.fixed), "settings": asdict(settings),
                "study_dir": study_dir, "train_fn": train_fn, "keep_models": keep_models,
            }
        )
    cached = len(records)
    if limit is not None:
        specs = specs[: max(0, int(limit))]
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads: expected a positive integer or None, got {threads!r}")
    worker_threads = threads or max(1, (os.cpu_count() or 1) // jobs)
    bar = tqdm(total=len(specs), desc=f"study {grid.name} ({cached} cached)", disable=not progress)
    failures = []
    if jobs == 1:
        from ._threads import torch_threads

        with torch_threads(threads):
            for spec in specs:
                try:
                    rec = _execute(spec)
                except Exception as err:  # one failed run does not stop the study; it is retried next time
                    failures.append(
                        {"hparams": spec["hparams"], "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
                    )
                else:
                    records.append(rec)
                    if on_record:
                        on_record(rec)
                bar.update(1)
    else:
        ctx = mp.get_context("spawn")
        gpus = _gpu_count()
        gpu_queue = None
        if gpus:
            gpu_queue = ctx.Manager().Queue()
            for i in range(jobs):
                gpu_queue.put(i % gpus)  # several workers share a GPU when jobs > GPUs
        with cf.ProcessPoolExecutor(
            max_workers=jobs, mp_context=ctx, initializer=_init_worker, initargs=(worker_threads, gpu_queue)
        ) as pool:
            futures = {pool.submit(_execute, dict(spec, threads=worker_threads)): spec for spec in specs}
            for fut in cf.as_completed(futures):
                spec = futures[fut]
                try:
                    rec = fut.result()
                except Exception as err:
                    failures.append({"hparams": spec["hparams"], "error": f"{type(err).__name__}: {err}"})
                else:
                    records.append(rec)
                    if on_record:
                        on_record(rec)
                bar.update(1)
    bar.close()
    order = {run_key(hp, grid.fixed, settings): i for i, hp in enumerate(grid.runs())}
    records.sort(key=lambda r: order.get(r["key"], len(order)))
    return summarize(grid, records, study_dir, settings=settings, plot=plot, cached=cached, failures=failures)


def summarize(grid: StudyGrid, records: Sequence[Mapping], study_dir: str, settings: MeasureSettings | None = None,
              plot: bool = True, cached: int = 0, failures: Sequence[Mapping] = ()) -> dict:
    """Write ``table.json``, ``table.csv``, ``table.md`` and ``scatter.png`` for the finished runs."""
    axes = list(grid.axes)
    complete = len(records) == len(grid.runs())
    rows = correlation_table(records, axes=axes) if len(records) >= 2 else []
    converged = [r for r in records if r["train"].get("reached_train_loss_target")]
    rows_reached = correlation_table(converged, axes=axes) if len(converged) >= 2 else []
    paths = {}
    summary = {
        "grid": grid.to_dict(),
        "settings": asdict(settings or MeasureSettings()),
        "n_runs": len(records),
        "n_expected": len(grid.runs()),
        "complete": complete,
        "cached": cached,
        "failures": list(failures),
        "reached_stop": sum(bool(r["train"].get("reached_train_loss_target")) for r in records),
        "table": rows,
        "table_reached_target": rows_reached,
    }
    if rows:
        paths["json"] = os.path.join(study_dir, "table.json")
        write_json_atomic(paths["json"], summary)
        paths["csv"] = os.path.join(study_dir, "table.csv")
        with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["runs", "measure", "tau", "psi", *[f"psi_{a}" for a in axes], "n_runs"])
            for subset, table in (("all", rows), ("reached_target", rows_reached)):
                for r in table:
                    w.writerow([subset, r["measure"], r["tau"], r["psi"], *[r["psi_per_axis"].get(a) for a in axes], r["n_runs"]])
        paths["markdown"] = os.path.join(study_dir, "table.md")
        with open(paths["markdown"], "w", encoding="utf-8") as f:
            f.write(markdown_table(rows, axes, reached=rows_reached) + "\n")
        runs_csv = os.path.join(study_dir, "runs.csv")
        with open(runs_csv, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            train_keys = sorted({k for r in records for k in r["train"]})
            w.writerow(["key", *axes, *train_keys, *MEASURES])
            for r in records:
                w.writerow([r["key"], *[r["hparams"].get(a) for a in axes], *[r["train"].get(k) for k in train_keys],
                            *[r["measures"].get(m) for m in MEASURES]])
        paths["runs_csv"] = runs_csv
        if plot:
            from .viz.study import measure_scatter_grid

            fig = measure_scatter_grid(records, rows)
            paths["plot"] = os.path.join(study_dir, "scatter.png")
            fig.savefig(paths["plot"], dpi=120)
            import matplotlib.pyplot as plt

            plt.close(fig)
    summary["paths"] = paths
    summary["markdown"] = markdown_table(rows, axes, reached=rows_reached) if rows else ""
    return summary
