"""Layer-by-layer sparse rate reduction of a model over a dataset (Hu, Zou & Xu 2024).

Wires :mod:`hf_tdiag.probes.token_states` and :mod:`hf_tdiag.probes.subspaces`
to :func:`hf_tdiag.measures.srr_terms`: for each block ℓ it measures ``R``,
``Rᶜ(·; U^ℓ)``, ``sparsity`` and ``SRR`` at the block input ``Z^ℓ`` and, for
CRATE, at ``Z^{ℓ+½}`` (after MSSA, with the same ``U^ℓ``), per sample, and
reports the mean and standard deviation over samples.
"""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn
from tqdm.auto import tqdm

from ..measures.coding_rate import srr_terms
from .architecture import describe
from .subspaces import check_source, subspaces
from .token_states import model_device, token_states

TERMS: Tuple[str, ...] = ("R", "Rc", "sparsity", "srr")
STATES: Tuple[str, ...] = ("block_input", "mid")
STATE_DESCRIPTIONS = {
    "block_input": "Z^l, the input of block l",
    "mid": "Z^{l+1/2} = Z^l + MSSA(LN1(Z^l)), after block l's attention (CRATE only)",
}


@dataclass
class SRRReport:
    """Per-layer mean/std over samples of ``R``, ``Rc``, ``sparsity``, ``srr`` at each measured state.

    ``mean[state][term]`` and ``std[state][term]`` are lists with one float per layer (std with ddof=0).
    ``values`` (optional) holds the per-sample numbers, shape ``(num_samples, len(states), num_layers, 4)``.
    """

    states: Tuple[str, ...]
    num_layers: int
    num_samples: int
    mean: Dict[str, Dict[str, List[float]]]
    std: Dict[str, Dict[str, List[float]]]
    settings: Dict[str, Any] = field(default_factory=dict)
    values: Optional[torch.Tensor] = None

    @classmethod
    def from_values(cls, values: torch.Tensor, states: Tuple[str, ...], settings: Dict[str, Any]) -> "SRRReport":
        """Build a report from per-sample values ``(num_samples, S, L, 4)``."""
        if values.ndim != 4 or values.shape[1] != len(states) or values.shape[3] != len(TERMS):
            raise ValueError(f"values: expected shape (num_samples, {len(states)}, L, {len(TERMS)}), got {tuple(values.shape)}")
        if values.shape[0] == 0:
            raise ValueError("values: no samples were measured (the inputs were empty)")
        values = values.to(torch.float64)
        mean_t = values.mean(0)
        std_t = values.std(0, correction=0)
        mean = {s: {t: mean_t[i, :, j].tolist() for j, t in enumerate(TERMS)} for i, s in enumerate(states)}
        std = {s: {t: std_t[i, :, j].tolist() for j, t in enumerate(TERMS)} for i, s in enumerate(states)}
        return cls(tuple(states), values.shape[2], values.shape[0], mean, std, dict(settings), values)

    @property
    def layers(self) -> List[int]:
        return list(range(self.num_layers))

    def summary(self) -> Dict[str, float]:
        """Averages over layers and last-layer values, e.g. ``srr_mean_over_layers``, ``mid_Rc_last_layer``."""
        out: Dict[str, float] = {}
        for state in self.states:
            prefix = "" if state == "block_input" else f"{state}_"
            for term in TERMS:
                per_layer = self.mean[state][term]
                out[f"{prefix}{term}_mean_over_layers"] = float(sum(per_layer) / len(per_layer))
                out[f"{prefix}{term}_last_layer"] = float(per_layer[-1])
        return out

    def to_dict(self, include_samples: bool = False) -> Dict[str, Any]:
        """JSON-ready dict: settings, layers, per-state per-term mean/std lists, summary (and samples if asked)."""
        out: Dict[str, Any] = {
            "measure": "sparse_rate_reduction",
            "settings": self.settings,
            "num_samples": self.num_samples,
            "layers": self.layers,
            "states": {s: STATE_DESCRIPTIONS.get(s, s) for s in self.states},
            "terms": list(TERMS),
            "mean": self.mean,
            "std": self.std,
            "summary": self.summary(),
        }
        if include_samples:
            if self.values is None:
                raise ValueError("include_samples: this report has no per-sample values")
            out["samples"] = {
                s: {t: self.values[:, i, :, j].tolist() for j, t in enumerate(TERMS)} for i, s in enumerate(self.states)
            }
        return out

    def to_json(self, path: str | None = None, include_samples: bool = False, indent: int = 2) -> str:
        """Serialize :meth:`to_dict` to JSON text; also write it to ``path`` if given."""
        text = json.dumps(self.to_dict(include_samples), indent=indent)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        return text

    @classmethod
    def from_dict(cls, data: Mapping) -> "SRRReport":
        """Inverse of :meth:`to_dict` (per-sample values only if they were included)."""
        states = tuple(data["states"])
        values = None
        if "samples" in data:
            values = torch.tensor(
                [[data["samples"][s][t] for t in TERMS] for s in states], dtype=torch.float64
            ).permute(2, 0, 3, 1)  # (S, 4, n, L) -> (n, S, L, 4)
        return cls(states, len(data["layers"]), int(data["num_samples"]), data["mean"], data["std"], dict(data["settings"]), values)


# ---------------------------------------------------------------------------
# input streaming
# ---------------------------------------------------------------------------


def _split(inputs, batch_size: int) -> Iterable:
    if isinstance(inputs, torch.Tensor):
        return [inputs[i : i + batch_size] for i in range(0, inputs.shape[0], batch_size)]
    n = None
    for value in inputs.values():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            n = value.shape[0]
            break
    if n is None:
        raise ValueError("inputs: a dict batch needs at least one tensor with a batch dimension")
    return [
        {k: (v[i : i + batch_size] if isinstance(v, torch.Tensor) and v.ndim > 0 else v) for k, v in inputs.items()}
        for i in range(0, n, batch_size)
    ]


class _Rows(torch.utils.data.Dataset):
    """Rows of a tensor / dict of tensors, for sharding with Accelerate."""

    def __init__(self, inputs):
        self.inputs = inputs
        first = inputs if isinstance(inputs, torch.Tensor) else next(v for v in inputs.values() if isinstance(v, torch.Tensor))
        self.n = first.shape[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if isinstance(self.inputs, torch.Tensor):
            return self.inputs[i]
        return {k: v[i] for k, v in self.inputs.items() if isinstance(v, torch.Tensor)}


def _batches(inputs, batch_size: int, accelerator) -> Iterable:
    if isinstance(inputs, (torch.Tensor, Mapping)):
        if isinstance(inputs, torch.Tensor) and inputs.ndim == 0:
            raise ValueError("inputs: expected a batched tensor, got a scalar")
        if accelerator is None:
            return _split(inputs, batch_size)
        inputs = torch.utils.data.DataLoader(_Rows(inputs), batch_size=batch_size, shuffle=False)
    if accelerator is not None and isinstance(inputs, torch.utils.data.DataLoader):
        from accelerate.data_loader import DataLoaderDispatcher, DataLoaderShard

        if not isinstance(inputs, (DataLoaderShard, DataLoaderDispatcher)):
            inputs = accelerator.prepare_data_loader(inputs)
    if not hasattr(inputs, "__iter__"):
        raise TypeError(
            f"inputs: expected pixel values / input ids (tensor), a dict batch or a DataLoader, got {type(inputs).__name__}"
        )
    return inputs


def _check_settings(eps, lam, batch_size, max_batches):
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps: expected a finite positive number, got {eps!r}")
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam):
        raise ValueError(f"lam: expected a finite number, got {lam!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
    if max_batches is not None and (not isinstance(max_batches, int) or max_batches < 1):
        raise ValueError(f"max_batches: expected a positive int or None, got {max_batches!r}")


# ---------------------------------------------------------------------------
# the measurement
# ---------------------------------------------------------------------------


def batch_srr_values(
    model: nn.Module,
    batch,
    *,
    source: str = "query",
    eps: float = 0.1,
    lam: float = 1.0,
    apply_layernorm: bool = False,
    include_mid: bool = True,
    reuse_projections: bool = True,
    arch=None,
    U: Optional[List[torch.Tensor]] = None,
) -> torch.Tensor:
    """Per-sample values of one batch, shape ``(B, S, L, 4)`` (states × layers × (R, Rc, sparsity, srr))."""
    arch = arch or describe(model)
    if U is None:
        U = [u.to(torch.float64) for u in subspaces(model, source, detach=True)]
    ts = token_states(
        model,
        batch,
        apply_layernorm=apply_layernorm,
        mid=include_mid,
        projection_source=source if reuse_projections else None,
        arch=arch,
    )
    groups = [ts.block_inputs] + ([ts.mid_states] if ts.mid_states is not None else [])
    out = []
    for g, states in enumerate(groups):
        per_layer = []
        for i, Z in enumerate(states):
            A = ts.projections[i] if (g == 0 and ts.projections is not None) else None
            if A is not None:
                terms = srr_terms(Z, projections=A, eps=eps, lam=lam, token_mask=ts.token_mask)
            else:
                terms = srr_terms(Z, U[i].to(Z.device), eps=eps, lam=lam, token_mask=ts.token_mask)
            per_layer.append(torch.stack([terms[t] for t in TERMS], dim=-1))  # (B, 4)
        out.append(torch.stack(per_layer, dim=1))  # (B, L, 4)
    return torch.stack(out, dim=1)  # (B, S, L, 4)


def layer_srr(
    model: nn.Module,
    inputs,
    *,
    source: str = "query",
    eps: float = 0.1,
    lam: float = 1.0,
    apply_layernorm: bool = False,
    include_mid: bool = True,
    batch_size: int = 32,
    max_batches: int | None = None,
    reuse_projections: bool = True,
    accelerator=None,
    progress: bool = True,
) -> SRRReport:
    """Sparse rate reduction of every layer of ``model``, averaged over the samples of ``inputs``.

    ``inputs``: a tensor of model inputs (e.g. ``pixel_values``), a dict batch (e.g. a processor's output,
    ``attention_mask`` restricts the tokens measured), or a DataLoader / iterable of such batches (or of
    ``(inputs, labels)`` pairs). Runs on the model's device batch by batch with a progress bar.
    ``source`` picks ``U`` for non-CRATE models (``query``/``key``/``value``; CRATE has one shared ``U``).
    With an ``accelerate.Accelerator`` the batches are sharded across processes (a DataLoader is prepared if
    it is not already) and per-sample values are gathered with ``gather_for_metrics``, so each sample counts once.
    """
    check_source(source)
    _check_settings(eps, lam, batch_size, max_batches)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module (a Transformers model), got {type(model).__name__}")
    if accelerator is not None:
        model = accelerator.unwrap_model(model)
    arch = describe(model)
    device = model_device(model)
    U = [u.to(device=device, dtype=torch.float64) for u in subspaces(model, source, detach=True)]
    states = ("block_input", "mid") if include_mid and arch.family == "crate" else ("block_input",)
    batches = _batches(inputs, batch_size, accelerator)
    total = None
    try:
        total = len(batches)
    except TypeError:
        pass
    if max_batches is not None and total is not None:
        total = min(total, max_batches)
    show = progress and (accelerator is None or accelerator.is_local_main_process)
    was_training = model.training
    model.eval()
    chunks = []
    try:
        for b, batch in enumerate(tqdm(batches, total=total, desc="SRR", unit="batch", disable=not show)):
            if max_batches is not None and b >= max_batches:
                break
            values = batch_srr_values(
                model,
                batch,
                source=source,
                eps=eps,
                lam=lam,
                apply_layernorm=apply_layernorm,
                include_mid=include_mid,
                reuse_projections=reuse_projections,
                arch=arch,
                U=U,
            )
            if accelerator is not None:
                values = accelerator.gather_for_metrics(values)
            chunks.append(values.detach().cpu())
    finally:
        model.train(was_training)
    if not chunks:
        raise ValueError("inputs: no batches to measure (empty inputs)")
    values = torch.cat(chunks)
    config = getattr(model, "config", None)
    settings = {
        "eps": float(eps),
        "lam": float(lam),
        "source": source if arch.family != "crate" else "qkv (shared U)",
        "apply_layernorm": bool(apply_layernorm),
        "layernorm_applied": bool(apply_layernorm and any(h.attention_norm is not None for h in arch.layers)),
        "include_mid": "mid" in states,
        "reuse_projections": bool(reuse_projections),
        "model": getattr(config, "_name_or_path", "") or type(model).__name__,
        "model_type": arch.model_type,
        "variant": getattr(config, "variant", None),
        "family": arch.family,
        "num_layers": arch.num_layers,
        "num_heads": arch.num_heads,
        "head_dim": arch.head_dim,
        "hidden_size": arch.hidden_size,
        "dtype": str(next((p.dtype for p in model.parameters()), torch.float32)).replace("torch.", ""),
        "device": str(device),
        "num_processes": int(accelerator.num_processes) if accelerator is not None else 1,
        "std": "over samples, ddof=0",
        "torch": torch.__version__,
        "platform": platform.platform(),
    }
    return SRRReport.from_values(values, states, settings)


__all__ = ["SRRReport", "TERMS", "STATES", "batch_srr_values", "layer_srr"]
