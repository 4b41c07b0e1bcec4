"""A grid of small encoders trained here, with both Schatten bound proxies at initialisation and after training.

The paper's Figure 1 (B_Schatten and B_Edelman vs depth L and width N on the BERT miniatures) on models
trained offline: ViTs (Transformers' ``ViTForImageClassification``, BERT-like blocks: per-head
Q/K/V, output projection, GELU MLP of width 4N) on scikit-learn's 8×8 digits with 4×4 patches
(4 tokens + CLS; 2×2 patches, ``patch_size=2``, cost ~3× more), on the fixed stratified
80/20 split of :func:`hf_tdiag.inputs.digits_split`.

One grid cell = one :class:`GridCell` (every setting that decides its result); :func:`run_cell`
trains it and returns its record, cached as ``<cache_dir>/runs/<key>.json`` (written atomically;
``key`` hashes the cell) with the full reports under ``<cache_dir>/reports/``. A grid that is
stopped loses only the cells in flight; running it again skips every cached cell.
:func:`run_grid` hands the cells to one of the study's executors (:mod:`hf_tdiag.study.executors`):
``"local"`` (``jobs`` processes, the default) or ``"ray"`` (a Ray task per cell, on this machine or a
cluster); each runs ``run_cell(cell, cache_dir)`` per cell, so a cell is recorded by whoever finishes it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .._defaults import DEFAULT_L_PHI
from .._validation import positive_int

GRID_VERSION = 1
SUMMARY_TYPES = ("qk", "v", "m_in", "m_out")

# name -> (layers, widths, overrides of GridCell's defaults)
GRIDS: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = {
    # the grid: ≤ 30 min on 2 CPU cores with jobs=2
    "cpu": ((2, 4, 6, 8), (64, 128, 256), {}),
    # the BERT miniatures' shapes (heads of width 64), longer training: for a GPU machine
    "gpu": ((2, 4, 6, 8, 10, 12), (128, 256, 512, 768), {"head_dim": 64, "steps": 3000, "batch_size": 128}),
    # one small cell, for tests and smoke runs
    "tiny": ((1, 2), (32,), {"head_dim": 16, "steps": 3, "batch_size": 8}),
}


@dataclass(frozen=True)
class GridCell:
    """One model of the grid and how it is trained (every field enters the cache key)."""

    num_layers: int
    hidden_size: int
    head_dim: int = 32  # heads = N / head_dim (N/32; 64 gives the miniatures' N/64)
    steps: int = 200
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    patch_size: int = 4
    seed: int = 0
    L_phi: float = DEFAULT_L_PHI

    def __post_init__(self):
        for name in ("num_layers", "hidden_size", "head_dim", "steps", "batch_size", "patch_size"):
            positive_int(getattr(self, name), name)
        if self.hidden_size % self.head_dim:
            raise ValueError(f"hidden_size: {self.hidden_size} is not a multiple of head_dim = {self.head_dim}")
        if 8 % self.patch_size:
            raise ValueError(f"patch_size: must divide the 8-pixel digits, got {self.patch_size}")

    @property
    def num_heads(self) -> int:
        return self.hidden_size // self.head_dim

    def key(self) -> str:
        """16 hex digits of SHA-1 over the cell's settings and the grid version."""
        text = json.dumps({"version": GRID_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def grid_cells(
    name: str = "cpu", layers: Iterable[int] | None = None, widths: Iterable[int] | None = None, **overrides
) -> list[GridCell]:
    """The cells of grid ``name`` (``GRIDS``), optionally with other layers/widths or GridCell overrides."""
    if name not in GRIDS:
        raise ValueError(f"name: expected one of {sorted(GRIDS)}, got {name!r}")
    g_layers, g_widths, g_over = GRIDS[name]
    settings = {**g_over, **{k: v for k, v in overrides.items() if v is not None}}
    return [GridCell(L, N, **settings) for L in (layers or g_layers) for N in (widths or g_widths)]


# --------------------------------------------------------------------------- model, data, training


def build_model(cell: GridCell):
    """A ViT classifier of the cell's shape on 8×8 one-channel digits, initialised from ``cell.seed``."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        image_size=8,
        patch_size=cell.patch_size,
        num_channels=1,
        hidden_size=cell.hidden_size,
        num_hidden_layers=cell.num_layers,
        num_attention_heads=cell.num_heads,
        intermediate_size=4 * cell.hidden_size,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(cell.seed)
    return ViTForImageClassification(cfg)


def digits_tensors():
    """(x_train, y_train, x_test, y_test): digits as float32 ``(n, 1, 8, 8)`` standardised with the training mean/std."""
    import torch

    from hf_tdiag.inputs import digits_split

    x_tr, x_te, y_tr, y_te = digits_split()
    x_tr = torch.tensor(x_tr, dtype=torch.float32)[:, None] / 255.0
    x_te = torch.tensor(x_te, dtype=torch.float32)[:, None] / 255.0
    mean, std = x_tr.mean(), x_tr.std()
    return (x_tr - mean) / std, torch.tensor(y_tr), (x_te - mean) / std, torch.tensor(y_te)


def _accuracy_and_loss(model, x, y, batch: int = 512) -> tuple[float, float]:
    import torch

    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out = model(pixel_values=x[i : i + batch], labels=y[i : i + batch])
            correct += int((out.logits.argmax(-1) == y[i : i + batch]).sum())
            loss += float(out.loss) * len(x[i : i + batch])
    return correct / len(x), loss / len(x)


def train(model, cell: GridCell, data, device: str = "cpu") -> dict[str, float]:
    """AdamW with linear warm-up and cosine decay for ``cell.steps`` steps of shuffled mini-batches; accuracies."""
    import torch

    x_tr, y_tr, x_te, y_te = (t.to(device) for t in data)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cell.lr, weight_decay=cell.weight_decay)
    warm = max(1, int(cell.warmup_fraction * cell.steps))

    def lr_at(step):
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, cell.steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gen = torch.Generator().manual_seed(cell.seed + 1)
    order, pos = torch.randperm(len(x_tr), generator=gen), 0
    t0 = time.perf_counter()
    for _ in range(cell.steps):
        if pos + cell.batch_size > len(order):
            order, pos = torch.randperm(len(x_tr), generator=gen), 0
        idx = order[pos : pos + cell.batch_size].to(device)
        pos += cell.batch_size
        loss = model(pixel_values=x_tr[idx], labels=y_tr[idx]).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - t0
    train_acc, train_loss = _accuracy_and_loss(model, x_tr, y_tr)
    test_acc, test_loss = _accuracy_and_loss(model, x_te, y_te)
    return {
        "train_accuracy": train_acc,
        "train_loss": train_loss,
        "test_accuracy": test_acc,
        "test_loss": test_loss,
        "train_seconds": seconds,
    }


# --------------------------------------------------------------------------- measuring and caching


def report_summary(report) -> dict[str, Any]:
    """The numbers the grid tables and figures use, from one :class:`SchattenReport`."""
    out = {
        "schatten_bound": report.schatten_bound,
        "edelman_bound": report.edelman_bound,
        "degenerate": report.degenerate,
        "alpha_first": float(report.alpha[0]),
        "mean_p_opt": float(np.mean([m.p_opt for m in report.matrices])),
    }
    for t in SUMMARY_TYPES:
        recs = report.by_type(t)
        out[f"mean_p_opt_{t}"] = float(np.mean([m.p_opt for m in recs]))
        out[f"frac_p0_{t}"] = float(np.mean([m.p_opt == 0 for m in recs]))
        out[f"mean_stable_rank_{t}"] = float(np.mean([m.stable_rank for m in recs]))
        out[f"mean_spectral_norm_{t}"] = float(np.mean([m.spectral_norm for m in recs]))
    fixed = report.fixed_p_bounds((0.0, 0.5, 1.0, 2.0))
    out.update({f"fixed_p_{p:g}": float(v) for p, v in zip((0.0, 0.5, 1.0, 2.0), fixed)})
    return out


def _paths(cache_dir: str, key: str) -> dict[str, str]:
    return {
        "record": os.path.join(cache_dir, "runs", f"{key}.json"),
        "init": os.path.join(cache_dir, "reports", f"{key}_init.json"),
        "trained": os.path.join(cache_dir, "reports", f"{key}_trained.json"),
    }


def load_record(cell: GridCell, cache_dir: str) -> dict | None:
    """The cached record of ``cell`` (None when absent, unreadable or of another cell)."""
    try:
        with open(_paths(cache_dir, cell.key())["record"], encoding="utf-8") as fh:
            rec = json.load(fh)
    except (OSError, ValueError):
        return None
    ok = isinstance(rec, dict) and rec.get("key") == cell.key() and rec.get("cell") == asdict(cell)
    return rec if ok and "trained" in rec else None


def run_cell(cell: GridCell, cache_dir: str, device: str | None = None) -> dict:
    """Train one cell (or return its cached record): proxies at initialisation and after training, accuracies."""
    import torch

    from hf_tdiag.diagnostics.schatten import schatten_bounds
    from hf_tdiag.study.cache import write_json_atomic

    cached = load_record(cell, cache_dir)
    if cached is not None:
        return {**cached, "cached": True}
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    paths = _paths(cache_dir, cell.key())
    os.makedirs(os.path.dirname(paths["init"]), exist_ok=True)
    t0 = time.perf_counter()
    model = build_model(cell)
    init = schatten_bounds(model, L_phi=cell.L_phi)
    init.to_json(paths["init"])
    metrics = train(model, cell, digits_tensors(), device)
    trained = schatten_bounds(model.cpu().eval(), L_phi=cell.L_phi)
    trained.to_json(paths["trained"])
    rec = {
        "key": cell.key(),
        "cell": asdict(cell),
        "num_heads": cell.num_heads,
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "init": report_summary(init),
        "trained": report_summary(trained),
        "metrics": metrics,
        "seconds": time.perf_counter() - t0,
    }
    write_json_atomic(paths["record"], rec)
    return {**rec, "cached": False}


def run_cell_spec(spec: dict) -> dict:
    """``run_cell`` of an executor spec (``cell`` as a dict, ``cache_dir``, ``device``, optionally ``threads``)."""
    if spec.get("threads"):
        import torch

        torch.set_num_threads(int(spec["threads"]))
    return run_cell(GridCell(**spec["cell"]), spec["cache_dir"], spec.get("device"))


def run_grid(
    cells: Iterable[GridCell],
    cache_dir: str,
    jobs: int = 1,
    device: str | None = None,
    log=print,
    threads: int | None = None,
    executor: str = "local",
    executor_options: dict | None = None,
) -> list[dict]:
    """Run every cell (cached ones are read back), largest cells first; records in input order.

    ``executor`` is one of :mod:`hf_tdiag.study.executors`: ``"local"`` (``jobs`` processes, ``threads`` torch
    threads each, default ``cpu_count // jobs``) or ``"ray"`` (a Ray task per cell asking for ``threads`` CPUs;
    ``executor_options``: ``address``, ``num_cpus``, ``num_gpus``, ``max_retries``). Cells that fail are logged
    with their traceback; after the others finish a RuntimeError names them (a rerun trains only those).
    """
    from hf_tdiag.study.executors import get_executor

    cells = list(cells)
    positive_int(jobs, "jobs")
    run_all = get_executor(executor)
    order = sorted(range(len(cells)), key=lambda i: -cells[i].num_layers * cells[i].hidden_size ** 2)
    specs = [
        {
            "index": i,
            "hparams": {"num_layers": cells[i].num_layers, "hidden_size": cells[i].hidden_size},
            "cell": asdict(cells[i]),
            "cache_dir": cache_dir,
            "device": device,
        }
        for i in order
    ]
    results: dict[int, dict] = {}
    failures: list[dict] = []

    def on_done(spec, rec, failure):
        if failure is not None:
            failures.append(failure)
            log(
                f"L={spec['cell']['num_layers']} N={spec['cell']['hidden_size']}: failed, {failure['error']}\n"
                f"{failure['traceback']}"
            )
        else:
            results[spec["index"]] = rec
            log(_line(rec))

    run_all(
        specs,
        jobs=jobs,
        threads=threads or max(1, (os.cpu_count() or 1) // jobs),
        on_done=on_done,
        task=run_cell_spec,
        **dict(executor_options or {}),
    )
    if failures:
        names = ", ".join(f"L={f['hparams']['num_layers']} N={f['hparams']['hidden_size']}" for f in failures)
        raise RuntimeError(f"{len(failures)} of {len(cells)} cells failed ({names}); first: {failures[0]['error']}")
    return [results[i] for i in range(len(cells))]


def _line(rec: dict) -> str:
    c, i, t, m = rec["cell"], rec["init"], rec["trained"], rec["metrics"]
    how = "cached" if rec.get("cached") else f"{rec['seconds']:.0f} s"
    return (
        f"L={c['num_layers']} N={c['hidden_size']}: test acc {m['test_accuracy']:.3f}; B_Schatten {i['schatten_bound']:.4g} -> "
        f"{t['schatten_bound']:.4g}, B_Edelman {i['edelman_bound']:.4g} -> {t['edelman_bound']:.4g} ({how})"
    )


def grid_rows(records: Iterable[dict], stage: str) -> list[dict[str, Any]]:
    """Flat rows (``num_layers``, ``hidden_size``, proxies, …) of one stage, ``"init"`` or ``"trained"``."""
    if stage not in ("init", "trained"):
        raise ValueError(f"stage: expected 'init' or 'trained', got {stage!r}")
    return [
        {
            "num_layers": r["cell"]["num_layers"],
            "hidden_size": r["cell"]["hidden_size"],
            "num_heads": r["num_heads"],
            **r[stage],
            **{f"metric_{k}": v for k, v in r["metrics"].items()},
        }
        for r in records
    ]


__all__ = [
    "GRIDS",
    "GridCell",
    "build_model",
    "digits_tensors",
    "grid_cells",
    "grid_rows",
    "load_record",
    "report_summary",
    "run_cell",
    "run_cell_spec",
    "run_grid",
    "train",
]


def load_report_pair(record: dict, cache_dir: str):
    """The full init and trained :class:`SchattenReport` of a cached record (spectra included)."""
    from hf_tdiag.diagnostics.schatten import SchattenReport

    paths = _paths(cache_dir, record["key"])
    return tuple(SchattenReport.from_json(paths[stage]) for stage in ("init", "trained"))
