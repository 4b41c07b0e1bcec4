"""Layer-by-layer sparse rate reduction of a model over a dataset (Yu et al. 2023; Hu, Zou & Xu 2024).

Wires :mod:`hf_tdiag.probes.token_states` and :mod:`hf_tdiag.probes.subspaces`
to :mod:`hf_tdiag.measures.coding_rate`. Blocks are numbered ℓ = 1…L; block ℓ's
states are all measured with its own subspaces ``U^ℓ`` (DESIGN.md, "Which
states"):

* ``output`` — ``Z^ℓ``, the output of block ℓ (``hidden_states[ℓ]``). **"Layer ℓ"
  means this state** in every summary, table and figure;
* ``input`` — ``Z^{ℓ−1}``, the input of block ℓ (``hidden_states[ℓ−1]``);
* ``mid`` — CRATE only, ``Z^{ℓ−½} = Z^{ℓ−1} + MSSA(LN₁(Z^{ℓ−1}))``;
* ``embeddings`` — the embedding output ``Z^0`` (with ``U^1``), reported once.

``measurement="official"`` reproduces the official CRATE measurement
(``vis_utils/crate_hook.py`` + ``coding_rate.py``) as one state ``official``
per block ℓ: ``Rc`` from block ℓ's own ``qkv`` output ``U_kᵀ LN₁(Z^{ℓ−1})`` with
every token scaled to unit ℓ2 norm per head (:func:`official_compression_rate`),
``sparsity`` and ``R`` at the block output ``Z^ℓ`` (ISTA's output), and
``srr = Rc − R + λ·sparsity`` of those. Values are per sample; reports keep the
mean and standard deviation over samples.

Decoders (GPT-2, Llama, Mistral, Qwen2, …): the states come from the model's own causal forward pass (token t's
state depends on tokens ≤ t; nothing else in R, Rᶜ or sparsity is causal: each is a function of the set of a
sample's real tokens). Padding: the batch's ``attention_mask`` selects the real tokens of each sample, so with
right padding a padded sample measures exactly as it does alone (its real tokens never see the padding).
``Z^L`` is block L's output before the decoder's final norm (``ln_f`` / ``model.norm``) — Transformers'
``hidden_states[L]`` of a decoder has that norm applied, its ``hidden_states[ℓ]`` for ℓ < L are the block outputs.
``U`` per ``source`` with grouped-query attention (K = H query subspaces, or K = H_kv shared key/value subspaces,
each once): :mod:`hf_tdiag.probes.subspaces`; the report's settings carry ``num_subspaces`` and, per subspace,
the ``query_heads`` that read it.
"""

from __future__ import annotations

import platform
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._caller_state import module_modes, restore_modes
from .._progress import tqdm
from ..measures.coding_rate import (
    coding_rate,
    compression_rate,
    compression_rate_from_projections,
    official_compression_rate,
    sparsity,
)
from ..probes.describe import describe
from ..probes.subspaces import subspace_heads, subspaces
from ..probes.token_states import model_device, token_states
from .report import FLOAT, INT, STR, ReportContract, typed_frame
from .settings import SRRSettings, resolve

TERMS: tuple[str, ...] = ("R", "Rc", "sparsity", "srr")
STATES: tuple[str, ...] = ("output", "input", "mid")
MEASUREMENTS: tuple[str, ...] = SRRSettings.field_metadata("measurement")["choices"]
STATE_DESCRIPTIONS = {
    "output": "Z^l, the output of block l (hidden_states[l]), with block l's U^l; 'layer l' means this state",
    "input": "Z^{l-1}, the input of block l (hidden_states[l-1]), with block l's U^l",
    "mid": "Z^{l-1/2} = Z^{l-1} + MSSA(LN1(Z^{l-1})), block l's state after attention, with U^l (CRATE only)",
    "official": "official CRATE measurement of block l: Rc of its qkv output U^T LN1(Z^{l-1}) with unit-norm "
    "tokens per head; R and sparsity of its output Z^l",
    "embeddings": "Z^0, the embedding output (hidden_states[0]), with block 1's U^1",
}


def _mean_std(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return values.mean(0), values.std(0, correction=0)


@dataclass
class SRRReport(ReportContract):
    """Per-layer mean/std over samples of ``R``, ``Rc``, ``sparsity``, ``srr`` at each measured state.

    ``layers`` are the block numbers ``1…L``; ``mean[state][term]`` and ``std[state][term]`` hold one float per
    block (std with ddof=0), ``[ℓ−1]`` for block ℓ. ``embeddings`` (``None`` for the official measurement) is
    ``{"mean": {term: float}, "std": {term: float}}`` of ``Z^0``. ``values`` (optional) holds the per-sample
    numbers, shape ``(num_samples, len(states), num_layers, 4)``, and ``embedding_values`` ``(num_samples, 4)``.
    The first state is the report's primary one (``output``, or ``official``): what :meth:`per_layer` and the
    unprefixed :meth:`summary` keys describe.
    """

    states: tuple[str, ...]
    num_layers: int
    num_samples: int
    mean: dict[str, dict[str, list[float]]]
    std: dict[str, dict[str, list[float]]]
    settings: dict[str, Any] = field(default_factory=dict)
    values: torch.Tensor | None = None
    embeddings: dict[str, dict[str, float]] | None = None
    embedding_values: torch.Tensor | None = None

    @classmethod
    def from_values(
        cls,
        values: torch.Tensor,
        states: tuple[str, ...],
        settings: dict[str, Any],
        embedding_values: torch.Tensor | None = None,
    ) -> SRRReport:
        """Build a report from per-sample values ``(num_samples, S, L, 4)`` (and ``(num_samples, 4)`` of ``Z^0``)."""
        if values.ndim != 4 or values.shape[1] != len(states) or values.shape[3] != len(TERMS):
            raise ValueError(
                f"values: expected shape (num_samples, {len(states)}, L, {len(TERMS)}), got {tuple(values.shape)}"
            )
        if values.shape[0] == 0:
            raise ValueError("values: no samples were measured (the inputs were empty)")
        values = values.to(torch.float64)
        mean_t, std_t = _mean_std(values)
        mean = {s: {t: mean_t[i, :, j].tolist() for j, t in enumerate(TERMS)} for i, s in enumerate(states)}
        std = {s: {t: std_t[i, :, j].tolist() for j, t in enumerate(TERMS)} for i, s in enumerate(states)}
        embeddings = None
        if embedding_values is not None:
            if tuple(embedding_values.shape) != (values.shape[0], len(TERMS)):
                raise ValueError(
                    f"embedding_values: expected shape ({values.shape[0]}, {len(TERMS)}), got {tuple(embedding_values.shape)}"
                )
            embedding_values = embedding_values.to(torch.float64)
            e_mean, e_std = _mean_std(embedding_values)
            embeddings = {"mean": dict(zip(TERMS, e_mean.tolist())), "std": dict(zip(TERMS, e_std.tolist()))}
        return cls(
            tuple(states),
            values.shape[2],
            values.shape[0],
            mean,
            std,
            dict(settings),
            values,
            embeddings,
            embedding_values,
        )

    @property
    def layers(self) -> list[int]:
        """Block numbers ``1…L`` (``mean[state][term][ℓ−1]`` is block ℓ)."""
        return list(range(1, self.num_layers + 1))

    def per_layer(self, term: str = "srr", state: str | None = None) -> list[float]:
        """Means of ``term`` for blocks ``1…L`` at ``state`` (default: the primary state, block outputs ``Z^ℓ``)."""
        state = state or self.states[0]
        if state not in self.mean or term not in TERMS:
            raise ValueError(
                f"state/term: expected one of {list(self.mean)} and {list(TERMS)}, got {state!r}, {term!r}"
            )
        return list(self.mean[state][term])

    def summary(self) -> dict[str, float]:
        """Averages over blocks ``1…L`` and last-block values: ``srr_mean_over_layers``, ``srr_last_layer`` (Z^L), ...

        Keys of the primary state are unprefixed; other states are prefixed (``input_Rc_last_layer``,
        ``mid_srr_mean_over_layers``); ``embeddings_<term>`` are ``Z^0``'s values.
        """
        out: dict[str, float] = {}
        for state in self.states:
            prefix = "" if state == self.states[0] else f"{state}_"
            for term in TERMS:
                per_layer = self.mean[state][term]
                out[f"{prefix}{term}_mean_over_layers"] = float(sum(per_layer) / len(per_layer))
                out[f"{prefix}{term}_last_layer"] = float(per_layer[-1])
        if self.embeddings is not None:
            for term in TERMS:
                out[f"embeddings_{term}"] = float(self.embeddings["mean"][term])
        return out

    def to_dict(self, include_samples: bool = False) -> dict[str, Any]:
        """JSON-ready dict: settings, layers, per-state per-term mean/std lists, embeddings, summary (+ samples)."""
        out: dict[str, Any] = {
            "measure": "sparse_rate_reduction",
            "measurement": self.settings.get("measurement", "design"),
            "settings": self.settings,
            "num_samples": self.num_samples,
            "layers": self.layers,
            "states": {s: STATE_DESCRIPTIONS.get(s, s) for s in self.states},
            "terms": list(TERMS),
            "embeddings": self.embeddings,
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
            if self.embedding_values is not None:
                out["embedding_samples"] = {t: self.embedding_values[:, j].tolist() for j, t in enumerate(TERMS)}
        return out

    def to_json(self, path: str | None = None, include_samples: bool = False, indent: int = 2) -> str:
        """:meth:`to_dict` as JSON text; also written (atomically) to ``path`` if given."""
        return super().to_json(path, indent=indent, include_samples=include_samples)

    def to_pandas(self):
        """One row per block and measured state: ``layer`` (1..L), ``state``, the means of R, Rc, sparsity, srr and
        their standard deviations (``<term>_std``); the embeddings ``Z^0`` are a row with ``layer`` 0."""
        columns = {"layer": INT, "state": STR, "num_samples": INT}
        columns.update({term: FLOAT for term in TERMS})
        columns.update({f"{term}_std": FLOAT for term in TERMS})
        rows = []
        if self.embeddings is not None:
            row = {"layer": 0, "state": "embeddings", "num_samples": self.num_samples}
            row.update(self.embeddings["mean"])
            row.update({f"{t}_std": v for t, v in self.embeddings["std"].items()})
            rows.append(row)
        for state in self.states:
            for i, ell in enumerate(self.layers):
                row = {"layer": ell, "state": state, "num_samples": self.num_samples}
                row.update({t: self.mean[state][t][i] for t in TERMS})
                row.update({f"{t}_std": self.std[state][t][i] for t in TERMS})
                rows.append(row)
        return typed_frame(rows, columns)

    def plot(self, **kwargs):
        """Per-layer Rᶜ, R, sparsity and SRR of each measured state (:func:`hf_tdiag.viz.plot_layer_srr`)."""
        from ..viz import plot_layer_srr

        return plot_layer_srr(self, **kwargs)

    @classmethod
    def from_dict(cls, data: Mapping) -> SRRReport:
        """Inverse of :meth:`to_dict` (per-sample values only if they were included)."""
        states = tuple(data["states"])
        values = embedding_values = None
        if "samples" in data:
            values = torch.tensor(
                [[data["samples"][s][t] for t in TERMS] for s in states], dtype=torch.float64
            ).permute(2, 0, 3, 1)  # (S, 4, n, L) -> (n, S, L, 4)
        if data.get("embedding_samples") is not None:
            embedding_values = torch.tensor([data["embedding_samples"][t] for t in TERMS], dtype=torch.float64).T
        return cls(
            states,
            len(data["layers"]),
            int(data["num_samples"]),
            data["mean"],
            data["std"],
            dict(data["settings"]),
            values,
            data.get("embeddings"),
            embedding_values,
        )


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
        first = (
            inputs
            if isinstance(inputs, torch.Tensor)
            else next(v for v in inputs.values() if isinstance(v, torch.Tensor))
        )
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


# ---------------------------------------------------------------------------
# the measurement
# ---------------------------------------------------------------------------


class _StateTerms:
    """The four terms of one state, ``(B, 4)``; ``R`` and sparsity paid once per distinct tensor.

    Without a LayerNorm, block ℓ's output ``Z^ℓ`` is the very tensor block ℓ+1 receives as input
    (and ``Z^0`` is block 1's input): only ``Rᶜ`` differs between them, through ``U``.
    """

    def __init__(self, eps: float, lam: float, token_mask, precision: str = "auto"):
        self.eps, self.lam, self.mask, self.precision = eps, lam, token_mask, precision
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def _r_sparsity(self, Z):
        hit = self._cache.get(id(Z))
        if hit is None or hit[0] is not Z:
            # the one NaN/inf scan of this state; the measures below skip theirs
            R = coding_rate(Z, self.eps, token_mask=self.mask, precision=self.precision)
            hit = (Z, R, sparsity(Z, token_mask=self.mask, check_finite=False))
            self._cache[id(Z)] = hit
        return hit[1], hit[2]

    def __call__(self, Z, Rc) -> torch.Tensor:
        """The four terms, ``Rc`` given (computed after :meth:`rc`, which scans ``Z``)."""
        R, sp = self._r_sparsity(Z)
        return torch.stack([R, Rc, sp, Rc - R + self.lam * sp], dim=-1)

    def rc(self, Z, U, A=None):
        """``Rᶜ(Z; U)`` (from ``A`` = the forward's own projections when given); scans ``Z`` once."""
        self._r_sparsity(Z)
        kwargs = dict(token_mask=self.mask, precision=self.precision, check_finite=False)
        if A is not None:
            return compression_rate_from_projections(A, self.eps, **kwargs)
        return compression_rate(Z, U.to(Z.device), self.eps, **kwargs)


def measure_token_states(
    ts, U, states=("output", "input", "mid"), *, eps: float = 0.1, lam: float = 1.0, precision: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, S, L, 4)`` of :func:`token_states` ``ts`` for ``states`` ⊆ (output, input, mid) with ``U[ℓ−1]`` for
    block ℓ, and ``(B, 4)`` of the embeddings ``Z^0`` (the design measurement of one batch, without its forward)."""
    return _design_values(ts, U, _StateTerms(eps, lam, ts.token_mask, precision), states)


def _design_values(ts, U, terms: _StateTerms, states) -> tuple[torch.Tensor, torch.Tensor]:
    L = len(ts.block_outputs)
    reuse = ts.projections or [None] * L
    inputs = [terms(Z, terms.rc(Z, U[i], reuse[i])) for i, Z in enumerate(ts.block_inputs)]
    groups = {
        "output": lambda: [terms(Z, terms.rc(Z, U[i])) for i, Z in enumerate(ts.block_outputs)],
        "input": lambda: inputs,
        "mid": lambda: [terms(Z, terms.rc(Z, U[i])) for i, Z in enumerate(ts.mid_states)],
    }
    values = torch.stack([torch.stack(groups[s](), dim=1) for s in states], dim=1)
    return values, inputs[0]


def _official_values(ts, terms: _StateTerms) -> torch.Tensor:
    """``(B, 1, L, 4)``: official ``Rc`` of each block's qkv output, ``R`` and sparsity of its output ``Z^ℓ``."""
    per_block = []
    for i, Z in enumerate(ts.block_outputs):
        A = ts.source_outputs[i] if ts.source_outputs else None
        if A is None:
            raise ValueError(f"model: block {i + 1}'s attention projection was not observed in the forward pass")
        per_block.append(
            terms(Z, official_compression_rate(A, terms.eps, token_mask=terms.mask, precision=terms.precision))
        )
    return torch.stack(per_block, dim=1).unsqueeze(1)


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
    U: list[torch.Tensor] | None = None,
    measurement: str = "design",
    precision: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-sample values of one batch: ``(B, S, L, 4)`` (states × blocks × terms) and ``(B, 4)`` of ``Z^0``
    (``None`` for ``measurement="official"``). States as :func:`layer_srr` reports them."""
    arch = arch or describe(model)
    if U is None:
        U = [
            u.to(torch.float64 if precision == "float64" else torch.float32)
            for u in subspaces(model, source, detach=True)
        ]
    official = measurement == "official"
    ts = token_states(
        model,
        batch,
        apply_layernorm=apply_layernorm,
        mid=include_mid and not official,
        projection_source=source if (reuse_projections or official) else None,
        arch=arch,
    )
    terms = _StateTerms(eps, lam, ts.token_mask, precision)
    if official:
        return _official_values(ts, terms), None
    return _design_values(ts, U, terms, _states(arch, include_mid, measurement))


def _states(arch, include_mid: bool, measurement: str) -> tuple[str, ...]:
    if measurement == "official":
        return ("official",)
    return ("output", "input", "mid") if include_mid and arch.family == "crate" else ("output", "input")


def _total(batches, max_batches):
    try:
        total = len(batches)
    except TypeError:
        return None
    return min(total, max_batches) if max_batches is not None else total


def _measure(model, batches, accelerator, max_batches, progress, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Values of every batch (gathered across processes), in eval mode; the model's mode is restored."""
    show = progress and (accelerator is None or accelerator.is_local_main_process)
    was_training = module_modes(model)  # every submodule's flag
    model.eval()
    chunks, embedding_chunks = [], []
    try:
        for b, batch in enumerate(
            tqdm(batches, total=_total(batches, max_batches), desc="SRR", unit="batch", disable=not show)
        ):
            if max_batches is not None and b >= max_batches:
                break
            values, embeddings = batch_srr_values(model, batch, **kwargs)
            if accelerator is not None:
                values = accelerator.gather_for_metrics(values)
                embeddings = accelerator.gather_for_metrics(embeddings) if embeddings is not None else None
            chunks.append(values.detach().cpu())
            if embeddings is not None:
                embedding_chunks.append(embeddings.detach().cpu())
    finally:
        restore_modes(was_training)
    if not chunks:
        raise ValueError("inputs: no batches to measure (empty inputs)")
    return torch.cat(chunks), (torch.cat(embedding_chunks) if embedding_chunks else None)


def _settings(model, arch, device, accelerator, states, **given) -> dict[str, Any]:
    config = getattr(model, "config", None)
    heads = subspace_heads(arch, given["source"])
    return {
        "eps": float(given["eps"]),
        "lam": float(given["lam"]),
        "measurement": given["measurement"],
        "precision": given["precision"],
        "source": given["source"] if arch.family != "crate" else "qkv (shared U)",
        "apply_layernorm": bool(given["apply_layernorm"]),
        "layernorm_applied": bool(given["apply_layernorm"] and any(h.attention_norm is not None for h in arch.layers)),
        "include_mid": "mid" in states,
        "reuse_projections": bool(given["reuse_projections"]),
        "layers": "blocks 1..L; layer l = the output Z^l of block l; embeddings = Z^0",
        "model": getattr(config, "_name_or_path", "") or type(model).__name__,
        "model_type": arch.model_type,
        "variant": getattr(config, "variant", None),
        "family": arch.family,
        "num_layers": arch.num_layers,
        "num_heads": arch.num_heads,
        "num_kv_heads": arch.num_kv_heads or arch.num_heads,
        "causal": bool(arch.causal),
        **(
            {}
            if arch.family == "crate"
            else {"num_subspaces": heads["num_subspaces"], "query_heads": heads["query_heads"]}
        ),
        "head_dim": arch.head_dim,
        "hidden_size": arch.hidden_size,
        "dtype": str(next((p.dtype for p in model.parameters()), torch.float32)).replace("torch.", ""),
        "device": str(device),
        "num_processes": int(accelerator.num_processes) if accelerator is not None else 1,
        "std": "over samples, ddof=0",
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


def layer_srr(
    model: nn.Module,
    inputs,
    *,
    settings: SRRSettings | None = None,
    source: str = SRRSettings.source,
    eps: float = SRRSettings.eps,
    lam: float = SRRSettings.lam,
    apply_layernorm: bool = SRRSettings.apply_layernorm,
    include_mid: bool = SRRSettings.include_mid,
    batch_size: int = SRRSettings.batch_size,
    max_batches: int | None = SRRSettings.max_batches,
    reuse_projections: bool = SRRSettings.reuse_projections,
    measurement: str = SRRSettings.measurement,
    precision: str = SRRSettings.precision,
    accelerator=None,
    progress: bool = True,
) -> SRRReport:
    """Sparse rate reduction of every block of ``model``, averaged over the samples of ``inputs``.

    Reports, per block ℓ = 1…L with its ``U^ℓ``, the states ``output`` (``Z^ℓ`` = "layer ℓ"), ``input``
    (``Z^{ℓ−1}``) and for CRATE ``mid`` (``Z^{ℓ−½}``, unless ``include_mid=False``), plus ``embeddings``
    (``Z^0``); ``measurement="official"``: the official CRATE measurement instead (module docstring).
    ``precision``: ``"auto"`` (float32 Gram matrices where the condition check allows, float64 elsewhere) or
    ``"float64"`` (:mod:`hf_tdiag.measures.coding_rate`).
    ``inputs``: a tensor of model inputs (e.g. ``pixel_values``), a dict batch (e.g. a processor's output,
    ``attention_mask`` restricts the tokens measured), or a DataLoader / iterable of such batches (or of
    ``(inputs, labels)`` pairs). Runs on the model's device batch by batch with a progress bar.
    ``source`` picks ``U`` for non-CRATE models (``query``/``key``/``value``; CRATE has one shared ``U``).
    With an ``accelerate.Accelerator`` the batches are sharded across processes (a DataLoader is prepared if
    it is not already) and per-sample values are gathered with ``gather_for_metrics``, so each sample counts once.
    ``settings``: an :class:`~hf_tdiag.diagnostics.settings.SRRSettings` holding these keywords (a keyword given
    with a value other than its default overrides it).
    """
    s = resolve(
        SRRSettings,
        settings,
        source=source,
        eps=eps,
        lam=lam,
        apply_layernorm=apply_layernorm,
        include_mid=include_mid,
        batch_size=batch_size,
        max_batches=max_batches,
        reuse_projections=reuse_projections,
        measurement=measurement,
        precision=precision,
    )
    source, eps, lam, apply_layernorm, include_mid = s.source, s.eps, s.lam, s.apply_layernorm, s.include_mid
    batch_size, max_batches, reuse_projections = s.batch_size, s.max_batches, s.reuse_projections
    measurement, precision = s.measurement, s.precision
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module (a Transformers model), got {type(model).__name__}")
    if accelerator is not None:
        model = accelerator.unwrap_model(model)
    arch = describe(model)
    if apply_layernorm and not any(h.attention_norm is not None for h in arch.layers):
        warnings.warn(
            f"apply_layernorm: {arch.model_type or type(model).__name__} has no pre-attention LayerNorm (its blocks "
            "normalise after attention), so the states are measured without one, as with apply_layernorm=False",
            UserWarning,
            stacklevel=2,
        )
    device = model_device(model)
    # float32 views of the projection weights (no copy for a float32 model); float64 copies for precision="float64"
    u_dtype = torch.float64 if precision == "float64" else torch.float32
    U = [u.to(device=device, dtype=u_dtype) for u in subspaces(model, source, detach=True)]
    bad = [ell for ell, u in enumerate(U, 1) if not bool(torch.isfinite(u).all())]
    if bad:
        raise ValueError(f"model: the {source} projections of blocks {bad} contain NaN or inf values")
    states = _states(arch, include_mid, measurement)
    given = dict(
        source=source,
        eps=eps,
        lam=lam,
        apply_layernorm=apply_layernorm,
        reuse_projections=reuse_projections,
        measurement=measurement,
        precision=precision,
    )
    values, embeddings = _measure(
        model,
        _batches(inputs, batch_size, accelerator),
        accelerator,
        max_batches,
        progress,
        include_mid=include_mid,
        arch=arch,
        U=U,
        **given,
    )
    settings = _settings(model, arch, device, accelerator, states, **given)
    return SRRReport.from_values(values, states, settings, embedding_values=embeddings)


__all__ = [
    "SRRReport",
    "TERMS",
    "STATES",
    "MEASUREMENTS",
    "STATE_DESCRIPTIONS",
    "batch_srr_values",
    "measure_token_states",
    "layer_srr",
]
