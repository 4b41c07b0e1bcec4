"""``hf_tdiag.spectrum_bounds``: spectrum-adaptive Schatten and Edelman bound proxies of an encoder or a decoder.

Wires the weight probe (:mod:`hf_tdiag.probes.block_matrices`) to the math in
:mod:`hf_tdiag.measures.schatten`. Per layer ℓ and head h (row-vector
orientation, PyTorch weights ``(out, in)``):

* ``QK = W_Q,hᵀ W_K,h`` (N×N), ``Ṽ = W_V,hᵀ (W_O)ᵀ[rows of head h]`` (N×N),
  ``M_in`` = FFN input weightᵀ (N×I), ``M_out`` = FFN output weightᵀ (I×N).
  No 1/√d_h, no LayerNorm, biases, embeddings or pooler.
* Per-head spectra come from the d_h×d_h QR core (exact: the products have rank ≤ d_h),
  batched over heads; all math in float64 on the weights' device.

CRATE: Q = K = V = U_k (the shared ``attention.qkv`` rows of head k), W_O =
``attention.output_matrix()``. A CRATE block has no MLP; its ISTA step
``ReLU(z + η Dᵀ(z − D z) − ηλ)`` is parameterised by the dictionary ``D``
(``ista.weight``, read like an ``nn.Linear`` weight), so ``Dᵀ`` plays M_in and is
reported with type ``"ista"``, and M_out is the identity: ``‖M_out‖₂ = 1`` in
every factor, and, not being learned, it adds no term to ``B_ours`` and no
``‖M_out‖_{2,1}`` term to ξ_ℓ. L_φ is left as given (ISTA's ReLU is 1-Lipschitz;
pass ``L_phi=1.0`` for that reading).

Decoders (GPT-2 and Llama families, :mod:`hf_tdiag.probes.decoders`) — the extension of the paper's matrices:

* **Grouped-query attention.** Query head h reads K/V head g(h) = h // (H/H_kv). The attention output is
  Σ_h softmax(x W_Q,h (x W_K,g(h))ᵀ) x W_V,g(h) W_O,h — exactly multi-head attention with each K/V head repeated for
  the H/H_kv query heads of its group (Transformers' ``repeat_kv``). The paper's per-head analysis applies to that
  equivalent multi-head model, so there are H matrices of each kind per layer:
  ``QK_h = W_Q,hᵀ W_K,g(h)`` and ``Ṽ_h = W_V,g(h)ᵀ (W_O)ᵀ[rows of h]`` (N×N, rank ≤ d_h). A shared K/V head enters
  the products of every query head of its group; the bound's complexity is in the products, not in the factors.
* **Gated MLP** ``down(act(x W_gateᵀ) ⊙ x W_upᵀ)``: it is the paper's ``φ(x M_in) M_out`` with
  ``M_in = [W_gateᵀ | W_upᵀ]`` (N × 2I, type ``m_in``), ``M_out = W_downᵀ`` (I × N) and the non-elementwise
  φ(a, b) = act(a) ⊙ b from R^{2I} to R^I. Every step of the paper's argument that touches the MLP uses only that
  x ↦ x M_in is linear (its covering number), ‖M_in‖₂, ‖M_out‖₂ and a Lipschitz constant of φ, so the formulas carry
  over unchanged with ‖M_in‖₂ = ‖[W_gateᵀ | W_upᵀ]‖₂ and ‖M_in‖_{2,1} = ‖W_gateᵀ‖_{2,1} + ‖W_upᵀ‖_{2,1}. φ is
  bilinear in (act(a), b), so its Lipschitz constant is not universal — it grows with the size of the
  pre-activations on the data's domain; ``L_phi`` stays the user's number (default 1.13, GELU's) and is not derived.
  Counting gate and up as one matrix keeps one M_in term per layer, as in the paper, with one post-hoc p.
* **Rotary position embedding** is a parameter-free rotation R applied to q and k after the projections; it does
  not change the weight matrices, and the proxies are computed from the weights. The logit of a query x and a key
  x' at offset Δ is ``(x W_Q,hᵀ) R_Δ (x' W_K,g(h)ᵀ)ᵀ = x (W_Q,hᵀ R_Δ W_K,g(h)) x'ᵀ`` (PyTorch ``(p, d)`` weights):
  the matrix ``W_Q,hᵀ R_Δ W_K,g(h)`` has the same rank (≤ d_h) and the same spectral
  norm bound ‖W_Q,h‖₂‖W_K,g(h)‖₂ for every Δ, but not the same other singular values; ``QK_h`` is its Δ = 0 member
  (no supremum over offsets is taken). GPT-2's learned absolute positions are embeddings, excluded like BERT's.
* RMSNorm (and LayerNorm) scales, biases (Qwen's q/k/v biases, GPT-2's), Gemma's embedding scaling, per-head q/k
  norms (Qwen3, Gemma3), the embeddings and the LM head — tied or untied — are not matrices of the bound, as for
  BERT. GPT-2's ``Conv1D`` stores ``W (in, out)`` (``y = x W + b``): its weights already are the row-vector matrices.

Streaming (``streaming=True``, :mod:`hf_tdiag.probes.checkpoint`): the layout is read from the model class built
on the meta device; each job — a layer's heads, its M_in, its M_out — opens only the shards holding its tensors
(``safe_open``), and FFN matrices larger than 2²⁰ entries are reduced in row blocks of their tall orientation
(Gram ``Σ_c A_cᵀA_c`` by in-place ``dsyrk``; TSQR when ill-conditioned), so at most one block is in float64 at a
time. The in-memory path runs the same jobs on the model's parameters: same numbers, bit for bit.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._progress import tqdm
from .._threads import torch_threads
from ..measures import schatten as S
from ..probes.block_matrices import EncoderWeights, encoder_weights
from ..probes.spectrum_sources import DecoderSource, EncoderSource, ffn_job, head_job
from .report import FLOAT, INT, STR, ReportContract, typed_frame
from .settings import SchattenSettings, resolve

MATRIX_TYPES = ("qk", "v", "m_in", "ista", "m_out")


def _json_float(x: float) -> float | str | None:
    """JSON has no inf/NaN: a non-finite value (κ↑ = inf when p_opt = 0; NaN for a zero matrix) is written as null."""
    return x if math.isfinite(x) else None


@dataclass
class MatrixRecord:
    """One analysed matrix (row-vector orientation) and its place in the bound."""

    layer: int  # block number 1..L (JSON written before format 2 held the 0-based index; from_json converts it)
    head: int | None
    type: str
    shape: tuple[int, int]
    rank: int
    spectral_norm: float
    frobenius_norm: float
    nuclear_norm: float
    norm_2_1: float
    norm_1_1: float
    stable_rank: float
    gamma: float
    alpha: float
    p_opt: float
    min_contribution: float
    flip_factor_down: float  # κ↓: γα_ℓL × κ↓ makes a larger p win (0: p_opt is the largest p)
    flip_factor_up: float  # κ↑: γα_ℓL × κ↑ makes a smaller p win (inf: p_opt = 0)
    singular_values: np.ndarray  # kept (nonzero) singular values, descending
    contributions: np.ndarray  # c(W, p) on the report's p grid

    def to_dict(self, include_spectra: bool = True) -> dict[str, Any]:
        d = {
            "layer": self.layer,
            "head": self.head,
            "type": self.type,
            "shape": list(self.shape),
            "rank": self.rank,
            "spectral_norm": self.spectral_norm,
            "frobenius_norm": self.frobenius_norm,
            "nuclear_norm": self.nuclear_norm,
            "norm_2_1": self.norm_2_1,
            "norm_1_1": self.norm_1_1,
            "stable_rank": self.stable_rank,
            "gamma": self.gamma,
            "alpha": self.alpha,
            "p_opt": self.p_opt,
            "min_contribution": self.min_contribution,
            "flip_factor_down": _json_float(self.flip_factor_down),
            "flip_factor_up": _json_float(self.flip_factor_up),
        }
        if include_spectra:
            d["singular_values"] = self.singular_values.tolist()
            d["contributions"] = self.contributions.tolist()
        return d


# the per-matrix numbers of a MatrixRecord, as float columns of SchattenReport.to_pandas()
_RECORD_FLOATS = (
    "spectral_norm",
    "frobenius_norm",
    "nuclear_norm",
    "norm_2_1",
    "norm_1_1",
    "stable_rank",
    "gamma",
    "alpha",
    "p_opt",
    "min_contribution",
    "flip_factor_down",
    "flip_factor_up",
)


@dataclass
class SchattenReport(ReportContract):
    """Result of :func:`spectrum_bounds`: ``schatten_bound`` = B_ours (the spectrum-adaptive Schatten proxy
    Σ_W min_p c(W, p) + √L), ``edelman_bound`` = B_Edelman, and one :class:`MatrixRecord` per analysed matrix."""

    model: str
    model_type: str
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    L_phi: float
    rank_tol: float
    p_grid: np.ndarray
    schatten_bound: float
    edelman_bound: float
    alpha: np.ndarray  # (L,) propagation factors α_ℓ
    xi: np.ndarray  # (L,) Edelman layer terms ξ_ℓ
    matrices: list[MatrixRecord] = field(default_factory=list)
    layers_path: str = ""  # module path of the analysed layer list, e.g. "encoder.layer"
    layer_gains: np.ndarray | None = None  # (L,) f_k, α_ℓ = Π_{k>ℓ} f_k
    num_kv_heads: int | None = (
        None  # decoders with grouped-query attention: K/V heads (QK_h, Ṽ_h use head h // (H/H_kv))
    )
    gated: bool = False  # gated MLP: M_in = [W_gateᵀ | W_upᵀ] (N × 2I)

    @property
    def degenerate(self) -> bool:
        """True when p_opt = 0 for every matrix: B_ours = Σ_W √(rank(W)·N) + √L depends only on shapes and ranks."""
        return bool(self.matrices) and all(m.p_opt == 0 for m in self.matrices)

    def type_contributions(self, ps=(0.0, 0.5, 1.0, 2.0)) -> dict[str, np.ndarray]:
        """Σ_{W of each type} c(W, p) at each p in ``ps`` (any p ≥ 0, on the grid or not), from the kept spectra."""
        out: dict[str, np.ndarray] = {}
        for t in MATRIX_TYPES:
            recs = self.by_type(t)
            if recs:
                out[t] = np.sum([_curve(m, ps, self.num_layers, self.hidden_size) for m in recs], axis=0)
        return out

    def fixed_p_bounds(self, ps=(0.0, 0.5, 1.0, 2.0)) -> np.ndarray:
        """Σ_W c(W, p) + √L with one p for every matrix, at each p in ``ps`` (B_ours is never larger than any of them)."""
        return np.sum(list(self.type_contributions(ps).values()), axis=0) + math.sqrt(self.num_layers)

    def breakdown_tables(self, ps=(0.0, 0.5, 1.0, 2.0)) -> dict[str, tuple[list[str], list[list]]]:
        """What differs between models when p_opt is uninformative: name -> (headers, rows).

        ``"types"``: Σ c(W, p) per matrix type at each p in ``ps`` and the fixed-p bound Σ_W c(W, p) + √L;
        ``"layers"``: per layer f_ℓ, α_ℓ and the smallest flip factor κ↓ of its matrices (how far from p > 0 winning).
        """
        per_type = self.type_contributions(ps)
        fixed = self.fixed_p_bounds(ps)
        heads = ["type", "matrices", "p_opt = 0 (count)"] + [f"Σ c(W, {p:g})" for p in ps]
        rows = [
            [t, len(self.by_type(t)), sum(m.p_opt == 0 for m in self.by_type(t)), *map(float, v)]
            for t, v in per_type.items()
        ]
        rows.append(["all (+ √L)", len(self.matrices), sum(m.p_opt == 0 for m in self.matrices), *map(float, fixed)])
        gains = self.layer_gains if self.layer_gains is not None else np.full(self.num_layers, np.nan)
        layer_rows = []
        for layer in range(self.num_layers):
            downs = [
                m.flip_factor_down for m in self.matrices if m.layer == layer + 1 and math.isfinite(m.flip_factor_down)
            ]
            layer_rows.append(
                [layer + 1, float(gains[layer]), float(self.alpha[layer]), max(downs) if downs else float("nan")]
            )
        layer_heads = ["layer", "gain f_ℓ", "α_ℓ = Π_{k>ℓ} f_k", "largest κ↓ (×γα_ℓL for p > 0 to win)"]
        return {"types": (heads, rows), "layers": (layer_heads, layer_rows)}

    def degenerate_note(self) -> str | None:
        """One sentence for readers when :attr:`degenerate`, else None."""
        if not self.degenerate:
            return None
        shape_only = sum(math.sqrt(m.rank * self.hidden_size) for m in self.matrices) + math.sqrt(self.num_layers)
        scales = [m.gamma * m.alpha * self.num_layers for m in self.matrices]
        kmax = max(m.flip_factor_down for m in self.matrices if math.isfinite(m.flip_factor_down))
        return (
            f"p_opt = 0 for all {len(self.matrices)} matrices: B_ours = Σ_W √(rank(W)·N) + √L = {shape_only:.6g} depends "
            f"only on shapes and ranks, not on the singular values. The scales γα_ℓL (from {min(scales):.3g} to "
            f"{max(scales):.3g}; α of the first layer = {self.alpha[0]:.3g}, a product of {self.num_layers - 1} layer "
            f"gains) make every p > 0 lose: they would have to shrink by a factor of at least {1 / kmax:.3g} for any "
            "matrix to prefer p > 0."
        )

    @property
    def contribution_curves(self) -> np.ndarray:
        """c(W, p) for every matrix (rows, in ``matrices`` order) on ``p_grid`` (columns)."""
        return np.stack([m.contributions for m in self.matrices])

    def by_type(self, matrix_type: str) -> list[MatrixRecord]:
        """The records of one type (``"qk"``, ``"v"``, ``"m_in"``, ``"ista"``, ``"m_out"``)."""
        if matrix_type not in MATRIX_TYPES:
            raise ValueError(f"matrix_type: expected one of {MATRIX_TYPES}, got {matrix_type!r}")
        return [m for m in self.matrices if m.type == matrix_type]

    def summary(self) -> dict[str, Any]:
        """The headline numbers as a flat dict (one table row)."""
        return {
            "model": self.model,
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_heads": self.num_heads,
            "schatten_bound": self.schatten_bound,
            "edelman_bound": self.edelman_bound,
            "num_matrices": len(self.matrices),
            "mean_p_opt": float(np.mean([m.p_opt for m in self.matrices])),
            **{
                f"mean_p_opt_{t}": float(np.mean([m.p_opt for m in recs]))
                for t in MATRIX_TYPES
                if (recs := [m for m in self.matrices if m.type == t])
            },
        }

    def to_dict(self, include_spectra: bool = True) -> dict[str, Any]:
        """JSON-ready dict; ``include_spectra=False`` drops per-matrix singular values and curves."""
        return {
            "format_version": FORMAT_VERSION,
            "model": self.model,
            "model_type": self.model_type,
            "family": self.family,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_heads": self.num_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "L_phi": self.L_phi,
            "rank_tol": self.rank_tol,
            "p_grid": self.p_grid.tolist(),
            "schatten_bound": self.schatten_bound,
            "edelman_bound": self.edelman_bound,
            "alpha": self.alpha.tolist(),
            "xi": self.xi.tolist(),
            "layers_path": self.layers_path,
            "layer_gains": None if self.layer_gains is None else self.layer_gains.tolist(),
            "num_kv_heads": self.num_kv_heads,
            "gated": self.gated,
            "degenerate": self.degenerate,
            "matrices": [m.to_dict(include_spectra) for m in self.matrices],
        }

    @property
    def ours(self) -> float:
        """Deprecated name of :attr:`schatten_bound`."""
        warnings.warn("SchattenReport.ours is deprecated; use .schatten_bound", DeprecationWarning, stacklevel=2)
        return self.schatten_bound

    @property
    def edelman(self) -> float:
        """Deprecated name of :attr:`edelman_bound`."""
        warnings.warn("SchattenReport.edelman is deprecated; use .edelman_bound", DeprecationWarning, stacklevel=2)
        return self.edelman_bound

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SchattenReport:
        """Inverse of :meth:`to_dict` (with spectra); JSON written before format 2 (0-based ``layer``, keys
        ``ours``/``edelman``) is converted."""
        d = _upgrade(dict(data))
        if "singular_values" not in (d["matrices"][0] if d["matrices"] else {"singular_values": 1}):
            raise ValueError("path_or_text: the report was written without spectra (include_spectra=False)")
        mats = []
        for m in d["matrices"]:
            m = dict(
                m,
                shape=tuple(m["shape"]),
                singular_values=np.asarray(m["singular_values"], dtype=np.float64),
                contributions=np.asarray(m["contributions"], dtype=np.float64),
            )
            zero = m["rank"] == 0
            down, up = m["flip_factor_down"], m["flip_factor_up"]
            m["flip_factor_down"] = math.nan if down is None else down
            m["flip_factor_up"] = (math.nan if zero else math.inf) if up is None else up
            mats.append(MatrixRecord(**m))
        arrays = {k: np.asarray(d[k], dtype=np.float64) for k in ("p_grid", "alpha", "xi")}
        gains = None if d.get("layer_gains") is None else np.asarray(d["layer_gains"], dtype=np.float64)
        skip = {"matrices", "degenerate", "layer_gains", "format_version", *arrays}
        return cls(**{k: v for k, v in d.items() if k not in skip}, **arrays, matrices=mats, layer_gains=gains)

    def to_pandas(self):
        """One row per analysed matrix: ``layer`` (block 1..L), ``head`` (<NA> for FFN/ISTA matrices), ``type``, the
        matrix's rows and columns, its rank and norms, γ, α, ``p_opt``, its minimal contribution and flip factors."""
        columns = {"layer": INT, "head": INT, "type": STR, "rows": INT, "cols": INT, "rank": INT}
        columns.update({name: FLOAT for name in _RECORD_FLOATS})
        rows = []
        for m in self.matrices:
            row = {name: getattr(m, name) for name in _RECORD_FLOATS}
            row.update(layer=m.layer, head=m.head, type=m.type, rows=m.shape[0], cols=m.shape[1], rank=m.rank)
            rows.append(row)
        return typed_frame(rows, columns)

    def to_json(
        self, path: str | os.PathLike | None = None, include_spectra: bool = True, indent: int | None = None
    ) -> str:
        """:meth:`to_dict` as JSON text; also written (atomically) to ``path`` when given."""
        return super().to_json(path, indent=indent, include_spectra=include_spectra)

    def plot(self):
        """The optimal Schatten index p per matrix type and layer."""
        from ..viz.schatten import plot_optimal_p

        return plot_optimal_p(self)


#: the JSON format :meth:`SchattenReport.to_dict` writes: 2 = 1-based ``layer``, ``schatten_bound``/``edelman_bound``
FORMAT_VERSION = 2


def _upgrade(d: dict[str, Any]) -> dict[str, Any]:
    """A report dict in the current format: format 1 (no ``format_version``) numbered blocks from 0 and named the
    bounds ``ours``/``edelman``."""
    version = d.get("format_version", 1)
    if version > FORMAT_VERSION:
        raise ValueError(f"format_version: {version} is newer than this hf-tdiag reads ({FORMAT_VERSION}); upgrade")
    if version == 1:
        d["schatten_bound"], d["edelman_bound"] = d.pop("ours"), d.pop("edelman")
        d["matrices"] = [dict(m, layer=m["layer"] + 1) for m in d["matrices"]]
    return d


#: deprecated name of :class:`SchattenReport`
SpectrumBoundReport = SchattenReport


def _curve(m: MatrixRecord, ps, num_layers: int, hidden_size: int) -> np.ndarray:
    """c(W, p) of one record at the given p values, from its kept singular values, γ and α."""
    p = torch.as_tensor(np.asarray(ps, dtype=np.float64))
    sigma = torch.as_tensor(m.singular_values, dtype=torch.float64)
    powers = S.schatten_powers(sigma, p, min(m.shape))
    return S.contributions(powers, p, m.gamma, m.alpha, num_layers, hidden_size).numpy()


def _model_and_name(model_or_path, load_kwargs) -> tuple[torch.nn.Module, str]:
    if isinstance(model_or_path, torch.nn.Module):
        cfg = getattr(model_or_path, "config", None)
        name = getattr(cfg, "name_or_path", "") or type(model_or_path).__name__
        return model_or_path, str(name)
    if isinstance(model_or_path, (str, os.PathLike)):
        from transformers import AutoModel

        from hf_tdiag.loading import load_pretrained

        name = os.fspath(model_or_path)
        kwargs = dict(load_kwargs)
        trust = kwargs.pop("trust_remote_code", False)
        return load_pretrained(name, AutoModel, trust_remote_code=trust, name="model_or_path", **kwargs), name
    raise TypeError(
        f"model_or_path: expected a Transformers model (torch.nn.Module), a local folder or a Hub id, "
        f"got {type(model_or_path).__name__}"
    )


def _check_finite(w: EncoderWeights, layer: int, roles) -> None:
    for role in roles:
        t = getattr(w.layers[layer], role)
        if t is not None and not S.all_finite(t):
            raise ValueError(f"model: layer {layer} {role} ({w.layers[layer].names.get(role)}) contains NaN or inf")


_ffn_spectrum = ffn_job  # one FFN matrix's σ, column norms and ‖·‖_{1,1} (module attribute: tests patch it)


# Below this many entries per FFN matrix a thread pool costs more than it saves.
POOL_MIN_FFN_ENTRIES = 1 << 18


def _default_workers(device: torch.device, ffn_entries: int) -> int:
    """torch's CPU thread count for models with FFN matrices of ≥ 2¹⁸ entries (BERT-small and up), else 1."""
    if device.type != "cpu" or ffn_entries < POOL_MIN_FFN_ENTRIES:
        return 1
    return max(1, torch.get_num_threads())


def _all_spectra(
    source, svd_method: str, num_workers: int, progress: bool, by_layer: bool = False
) -> list[dict[str, torch.Tensor]]:
    """Per-layer spectra, computed by ``num_workers`` threads (the solvers release the GIL).

    Jobs: one per FFN matrix (the dense, expensive part), one per layer for the per-head cores; each job reads its
    tensors from ``source`` only while it runs. ``by_layer`` orders the jobs layer by layer (streaming: one layer's
    tensors at a time with one worker), else FFN first (the longest jobs start earliest).
    BLAS and torch run single-threaded inside every job (torch's thread count is restored on
    return), so ``num_workers`` threads use ``num_workers`` cores; results agree across worker
    counts to rounding (MKL's kernels may round differently with the memory alignment they get).
    """
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    L = source.shapes.num_layers
    kinds = ("in", "out", "heads") if source.shapes.has_ffn_out else ("in", "heads")
    if by_layer:
        jobs = [(i, kind) for i in range(L) for kind in kinds]
    else:
        jobs = [(i, kind) for kind in kinds for i in range(L)]

    release = getattr(source, "release", None)
    extra = {"release": release} if release is not None else {}

    def run(job):
        i, kind = job
        with source.tensors(i, kind) as tensors:
            if kind == "heads":
                out = head_job(tensors)
            else:
                sigma, cols, n11 = _ffn_spectrum(tensors, svd_method, **extra)
                out = {f"{kind}_sigma": sigma, f"{kind}_cols": cols, f"{kind}_11": n11}
        if release is not None:
            release()
        return out

    per_layer: list[dict[str, torch.Tensor]] = [{} for _ in range(L)]
    with (
        torch_threads(1),
        threadpool_limits(limits=1, user_api="blas"),
        tqdm(total=len(jobs), desc="spectra", disable=not progress, leave=False) as bar,
    ):
        if num_workers <= 1:
            results = map(run, jobs)
        else:
            pool = ThreadPoolExecutor(num_workers)
            results = pool.map(run, jobs)
        try:
            for job, res in zip(jobs, results):
                per_layer[job[0]].update(res)
                bar.update()
        finally:
            if num_workers > 1:
                pool.shutdown(cancel_futures=True)
    return per_layer


def _type_stats(sigma, cols, n11, g, a, n_full, ps, L, N, rank_tol) -> dict[str, np.ndarray]:
    """Everything the records of one matrix type need, batched over (layer[, head])."""
    powers = S.schatten_powers(sigma, ps, n_full, rank_tol)
    curves = S.contributions(powers, ps, g, a, L, N)
    best, p_opt = S.optimal_contribution(curves, ps)
    scale = torch.broadcast_to(g * a * L, best.shape)
    down, up = S.flip_factors(powers, ps, scale, N)
    clean = S.clean_spectrum(sigma, n_full, rank_tol)
    fro2 = powers[..., -1] if float(ps[-1]) == 2.0 else S.schatten_power(sigma, 2.0, n_full, rank_tol)
    stats = {
        "sigma": clean,
        "rank": (clean > 0).sum(-1),
        "spectral": S.spectral_norm(clean),
        "fro": fro2.sqrt(),
        "nuc": clean.sum(-1),
        "n21": cols.sum(-1),
        "n11": n11,
        "srank": S.stable_rank(sigma, n_full, rank_tol),
        "gamma": torch.broadcast_to(g, best.shape),
        "alpha": torch.broadcast_to(a, best.shape),
        "p_opt": p_opt,
        "best": best,
        "curves": curves,
        "down": down,
        "up": up,
    }
    return {k: v.cpu().numpy() for k, v in stats.items()}


def _records(stats: dict[str, dict[str, np.ndarray]], shapes: dict, L: int, H: int) -> list[MatrixRecord]:
    """One :class:`MatrixRecord` per matrix: per layer, QK heads, Ṽ heads, M_in (or ISTA), M_out."""
    records: list[MatrixRecord] = []
    for layer in range(L):
        for typ, st in stats.items():
            for h in range(H) if typ in ("qk", "v") else [None]:
                idx = (layer, h) if h is not None else (layer,)
                sig = st["sigma"][idx]
                records.append(
                    MatrixRecord(
                        layer=layer + 1,
                        head=h,
                        type=typ,
                        shape=shapes[typ],
                        rank=int(st["rank"][idx]),
                        spectral_norm=float(st["spectral"][idx]),
                        frobenius_norm=float(st["fro"][idx]),
                        nuclear_norm=float(st["nuc"][idx]),
                        norm_2_1=float(st["n21"][idx]),
                        norm_1_1=float(st["n11"][idx]),
                        stable_rank=float(st["srank"][idx]),
                        gamma=float(st["gamma"][idx]),
                        alpha=float(st["alpha"][idx]),
                        p_opt=float(st["p_opt"][idx]),
                        min_contribution=float(st["best"][idx]),
                        flip_factor_down=float(st["down"][idx]),
                        flip_factor_up=float(st["up"][idx]),
                        singular_values=sig[sig > 0].copy(),
                        contributions=st["curves"][idx].copy(),
                    )
                )
    return records


def _source(model_or_path, streaming: bool, load_kwargs):
    """(source, name, default worker count) for an in-memory model or, with ``streaming``, a checkpoint on disk."""
    if streaming:
        if not isinstance(model_or_path, (str, os.PathLike)):
            raise TypeError(
                "model_or_path: streaming=True reads a checkpoint's safetensors shards; expected a local folder or a "
                f"Hub id, got {type(model_or_path).__name__}"
            )
        from ..probes.checkpoint import open_checkpoint
        from ..probes.describe import describe

        kwargs = dict(load_kwargs)
        trust = kwargs.pop("trust_remote_code", False)
        if kwargs:
            raise TypeError(f"load_kwargs: streaming=True takes only trust_remote_code, got {sorted(kwargs)}")
        ckpt = open_checkpoint(model_or_path, trust_remote_code=trust)
        layout = describe(ckpt.meta_model).decoder_layout()
        return DecoderSource(layout, open_tensors=ckpt.tensors), ckpt.source, 1
    model, name = _model_and_name(model_or_path, load_kwargs)
    from ..probes.decoders import model_getter
    from ..probes.describe import describe

    desc = describe(model)
    if desc.decoder is not None:
        device = next(model.parameters()).device
        source = DecoderSource(desc.decoder, get=model_getter(model), device=device)
    else:
        w = encoder_weights(desc)
        for i in range(w.num_layers):
            _check_finite(w, i, ("query", "key", "value", "attn_output", "ffn_in", "ffn_out"))
        source = EncoderSource(w)
    return source, name, _default_workers(source.device, source.ffn_entries())


def _stacked_spectra(source, svd_method: str, num_workers: int, progress: bool, streaming: bool) -> dict:
    """Every layer's spectra and column norms (:func:`_all_spectra`), stacked over layers: ``{key: (L, ...)}``."""
    with torch.no_grad():
        per_layer = _all_spectra(source, svd_method, num_workers, progress, by_layer=streaming)
    return {key: torch.stack([d[key] for d in per_layer]) for key in per_layer[0]}


def _operator_norms(sp: dict, L: int) -> dict[str, torch.Tensor]:
    """Per-layer spectral norms of QK, V, M_in and M_out, and M_out's (2,1) norm (identity M_out: 1 and 0)."""
    norms = {key: S.spectral_norm(sp[f"{key}_sigma"]) for key in ("qk", "v", "in")}
    if "out_sigma" in sp:
        norms["out"], norms["out_21"] = S.spectral_norm(sp["out_sigma"]), sp["out_cols"].sum(-1)
    else:  # identity M_out (CRATE): norm 1, no (2,1) term
        dev = sp["qk_sigma"].device
        norms["out"] = torch.ones(L, dtype=torch.float64, device=dev)
        norms["out_21"] = torch.zeros(L, dtype=torch.float64, device=dev)
    return norms


def _matrix_groups(sh, sp: dict, gamma: dict, alpha: torch.Tensor) -> list[tuple]:
    """``(type, σ, column norms, (1,1) norms, γ, α, full dimension)`` of each matrix type, for :func:`_type_stats`
    (``sh``: the source's shapes; a gated M_in is N × 2I)."""
    L, N, H = sh.num_layers, sh.hidden_size, sh.num_heads
    groups = [
        ("qk", sp["qk_sigma"], sp["qk_cols"], sp["qk_11"], gamma["qk"], alpha[:, None], N),
        ("v", sp["v_sigma"], sp["v_cols"], sp["v_11"], gamma["v"][:, None].expand(L, H), alpha[:, None], N),
        (sh.ffn_in_type, sp["in_sigma"], sp["in_cols"], sp["in_11"], gamma["m_in"], alpha, min(N, sh.ffn_in_width)),
    ]
    if "out_sigma" in sp:
        groups.append(
            (
                "m_out",
                sp["out_sigma"],
                sp["out_cols"],
                sp["out_11"],
                gamma["m_out"],
                alpha,
                min(N, sh.intermediate_size),
            )
        )
    return groups


def spectrum_bounds(
    model_or_path,
    L_phi: float = SchattenSettings.L_phi,
    p_grid_m: int | None = SchattenSettings.p_grid_m,
    rank_tol: float = SchattenSettings.rank_tol,
    *,
    settings: SchattenSettings | None = None,
    svd_method: str = SchattenSettings.svd_method,
    num_workers: int | None = SchattenSettings.num_workers,
    progress: bool = False,
    streaming: bool = SchattenSettings.streaming,
    **load_kwargs,
) -> SchattenReport:
    """Spectrum-adaptive Schatten proxy B_ours = Σ_W min_p c(W, p) + √L and Edelman's proxy of an encoder or decoder.

    Args:
        model_or_path: a Transformers model (BERT-like, ViT-like, CRATE, or a GPT-2 / Llama-family decoder), a local
            folder or a Hub id (loaded with ``AutoModel.from_pretrained(model_or_path, **load_kwargs)`` through
            :func:`hf_tdiag.loading.load_pretrained`: ``trust_remote_code=False`` unless passed as True).
        L_phi: Lipschitz constant of the FFN activation (1.13 for GELU; for a gated MLP the constant of
            ``(a, b) ↦ act(a) ⊙ b`` on the data's domain — see the module docstring).
        p_grid_m: grid resolution m of p ∈ {0, 1/m, …, 2}; default ⌈L + ln N⌉.
        rank_tol: singular values ≤ rank_tol · min(rows, cols) · max(σ₁, 1) are exact zeros.
        svd_method: ``"auto"`` (Gram eigenvalues for well-conditioned FFN matrices, else SVD) or ``"svd"``.
        num_workers: threads that solve the FFN spectra and per-layer head cores side by side, each with one BLAS thread
            (default ``torch.get_num_threads()`` on CPU for FFN matrices of ≥ 2¹⁸ entries, else 1; 1 when
            streaming); results agree across values to rounding (~1e-15 relative).
        progress: show a progress bar over layers.
        streaming: read a decoder checkpoint (folder or Hub id; safetensors, sharded or not) one job's tensors at a
            time (``safe_open`` on the shards the index names) without instantiating the model: peak memory is
            about the largest layer's weights (times ``num_workers``), not the model's. Same numbers as the
            in-memory path, bit for bit.
        settings: a :class:`~hf_tdiag.diagnostics.settings.SchattenSettings` holding these keywords (an argument
            given with a value other than its default overrides it).
    """
    if not isinstance(streaming, bool):
        raise TypeError(f"streaming: expected True or False, got {streaming!r}")
    s = resolve(
        SchattenSettings,
        settings,
        L_phi=L_phi,
        p_grid_m=p_grid_m,
        rank_tol=rank_tol,
        svd_method=svd_method,
        num_workers=num_workers,
        streaming=streaming,
    )
    L_phi, p_grid_m, rank_tol, svd_method = s.L_phi, s.p_grid_m, float(s.rank_tol), s.svd_method
    num_workers, streaming = s.num_workers, s.streaming
    source, name, default_workers = _source(model_or_path, streaming, load_kwargs)
    sh = source.shapes
    L, N, H = sh.num_layers, sh.hidden_size, sh.num_heads
    ps = S.p_grid(L, N, p_grid_m)
    workers = default_workers if num_workers is None else num_workers
    sp = _stacked_spectra(source, svd_method, workers, progress, streaming)
    norms = _operator_norms(sp, L)
    gains = S.layer_gain(norms["in"], norms["out"], norms["v"], norms["qk"], L_phi)
    alpha = S.propagation_factors(norms["in"], norms["out"], norms["v"], norms["qk"], L_phi)
    gamma = S.type_factors(norms["in"], norms["out"], norms["v"])
    dev = sp["qk_sigma"].device
    stats = {g[0]: _type_stats(*g[1:], ps.to(dev), L, N, rank_tol) for g in _matrix_groups(sh, sp, gamma, alpha)}
    ours = float(
        S.spectrum_adaptive_bound(torch.cat([torch.as_tensor(st["best"]).reshape(-1) for st in stats.values()]), L)
    )
    xi = S.edelman_layer_terms(
        norms["in"],
        norms["out"],
        norms["v"],
        sp["qk_cols"].sum(-1),
        sp["v_cols"].sum(-1),
        sp["in_cols"].sum(-1),
        norms["out_21"],
    )
    edelman = float(S.edelman_bound(alpha, xi))
    shapes = {"qk": (N, N), "v": (N, N), sh.ffn_in_type: (N, sh.ffn_in_width), "m_out": (sh.intermediate_size, N)}
    records = _records(stats, shapes, L, H)
    return SchattenReport(
        model=name,
        model_type=sh.model_type,
        family=sh.family,
        num_layers=L,
        hidden_size=N,
        num_heads=H,
        head_dim=sh.head_dim,
        intermediate_size=sh.intermediate_size,
        L_phi=float(L_phi),
        rank_tol=rank_tol,
        p_grid=ps.numpy(),
        schatten_bound=ours,
        edelman_bound=edelman,
        alpha=alpha.cpu().numpy(),
        xi=xi.cpu().numpy(),
        matrices=records,
        layers_path=sh.layers_path,
        layer_gains=gains.cpu().numpy(),
        num_kv_heads=sh.num_kv_heads,
        gated=sh.gated,
    )


__all__ = [
    "MATRIX_TYPES",
    "FORMAT_VERSION",
    "MatrixRecord",
    "SchattenReport",
    "SpectrumBoundReport",
    "spectrum_bounds",
]
