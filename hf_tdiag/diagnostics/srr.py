"""Layer-by-layer sparse rate reduction of a model over a dataset (Yu et al. 2023; Hu, Zou & Xu 2024).

Wires :mod:`hf_tdiag.probes.token_states` and :mod:`hf_tdiag.probes.subspaces`
to :mod:`hf_tdiag.measures.coding_rate`. Blocks are numbered ℓ = 1…L; block ℓ's
states are all measured with its own subspaces ``U^ℓ`` (docs/guide/srr.md, "Which
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
from typing import Any

import torch
from torch import nn

from .._caller_state import module_modes, restore_modes
from .._model_limits import check_batch_ids, check_batch_states, check_finite_weights
from .._progress import tqdm
from ..batching import iter_batches
from ..measures.coding_rate import (
    coding_rate,
    compression_rate,
    compression_rate_from_projections,
    official_compression_rate,
    sparsity,
    srr_from_terms,
)
from ..probes.describe import describe
from ..probes.offload import releasing_memory
from ..probes.subspaces import subspace_heads, subspaces
from ..probes.token_states import model_device, token_states
from .entry import diagnostic_entry
from .settings import SRRSettings
from .srr_report import MEASUREMENTS, STATE_DESCRIPTIONS, STATES, TERMS, SRRReport

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
        return torch.stack([R, Rc, sp, srr_from_terms(R, Rc, sp, self.lam)], dim=-1)

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
    check_batch_ids(model, batch)  # before the model's own size mismatch or index error
    check_batch_states(model, batch, arch)
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


@diagnostic_entry(SRRSettings)
def layer_srr(
    model: nn.Module,
    inputs,
    *,
    settings: SRRSettings,
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

    Examples:
        >>> import torch, hf_tdiag
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification
        >>> _ = torch.manual_seed(0)
        >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10))
        >>> report = hf_tdiag.layer_srr(model, torch.randn(8, 1, 8, 8), progress=False)
        >>> report.layers, report.states, report.num_samples
        ([1, 2, 3, 4], ('output', 'input', 'mid'), 8)
        >>> report.to_pandas().query("state == 'output'")[["layer", "R", "Rc", "sparsity", "srr"]].round(3)
           layer       R      Rc  sparsity     srr
        1      1  54.954  43.489     0.496 -10.969
        2      2  62.339  51.320     0.342 -10.676
        3      3  64.834  57.250     0.287  -7.298
        4      4  65.561  57.992     0.276  -7.293
        >>> last = report.to_pandas().query("state == 'output' and layer == 4").iloc[0]
        >>> bool(abs(last.srr - (last.Rc - last.R + report.settings["lam"] * last.sparsity)) < 1e-9)  # the definition
        True
        >>> report.summary()["srr_last_layer"] == report.per_layer("srr")[-1]  # "layer L" is the last block's output
        True
    """
    s = settings
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module (a Transformers model), got {type(model).__name__}")
    if accelerator is not None:
        model = accelerator.unwrap_model(model)
    arch = describe(model)
    if s.apply_layernorm and not any(h.attention_norm is not None for h in arch.layers):
        warnings.warn(
            f"apply_layernorm: {arch.model_type or type(model).__name__} has no pre-attention LayerNorm (its blocks "
            "normalise after attention), so the states are measured without one, as with apply_layernorm=False",
            UserWarning,
            stacklevel=2,
        )
    device = model_device(model)
    # float32 views of the projection weights (no copy for a float32 model); float64 copies for precision="float64"
    u_dtype = torch.float64 if s.precision == "float64" else torch.float32
    U = [u.to(device=device, dtype=u_dtype) for u in subspaces(model, s.source, detach=True)]
    bad = [ell for ell, u in enumerate(U, 1) if not bool(torch.isfinite(u).all())]
    if bad:
        raise ValueError(f"model: the {s.source} projections of blocks {bad} contain NaN or inf values")
    check_finite_weights(model)  # any other weight with NaN/inf, named, before the states would carry it
    states = _states(arch, s.include_mid, s.measurement)
    per_batch = {k: getattr(s, k) for k in _PER_BATCH}
    with releasing_memory(model, [h.block for h in arch.layers]):  # offloaded blocks: their copies' pages freed
        values, embeddings = _measure(
            model,
            iter_batches(inputs, s.batch_size, accelerator),
            accelerator,
            s.max_batches,
            progress,
            include_mid=s.include_mid,
            arch=arch,
            U=U,
            **per_batch,
        )
    return SRRReport.from_values(
        values, states, _settings(model, arch, device, accelerator, states, **per_batch), embedding_values=embeddings
    )


# the settings each batch is measured with (batch_srr_values' keywords) and the report records
_PER_BATCH = ("source", "eps", "lam", "apply_layernorm", "reuse_projections", "measurement", "precision")


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
