"""``hf_tdiag.spectrum_bounds``: spectrum-adaptive Schatten and Edelman bound proxies of an encoder.

Wires the weight probe (:mod:`hf_tdiag.probes.bert_weights`) to the math in
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
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .._threads import torch_threads
from .._validation import positive_float, positive_int, real
from ..measures import schatten as S
from .bert_weights import EncoderWeights, encoder_weights

MATRIX_TYPES = ("qk", "v", "m_in", "ista", "m_out")


def _json_float(x: float) -> float | str | None:
    """JSON has no inf/NaN: a non-finite value (κ↑ = inf when p_opt = 0; NaN for a zero matrix) is written as null."""
    return x if math.isfinite(x) else None


@dataclass
class MatrixRecord:
    """One analysed matrix (row-vector orientation) and its place in the bound."""

    layer: int
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


@dataclass
class SpectrumBoundReport:
    """Result of :func:`spectrum_bounds`. ``ours`` = B_ours, ``edelman`` = B_Edelman."""

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
    ours: float
    edelman: float
    alpha: np.ndarray  # (L,) propagation factors α_ℓ
    xi: np.ndarray  # (L,) Edelman layer terms ξ_ℓ
    matrices: list[MatrixRecord] = field(default_factory=list)
    layers_path: str = ""  # module path of the analysed layer list, e.g. "encoder.layer"
    layer_gains: np.ndarray | None = None  # (L,) f_k, α_ℓ = Π_{k>ℓ} f_k

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
            downs = [m.flip_factor_down for m in self.matrices if m.layer == layer and math.isfinite(m.flip_factor_down)]
            layer_rows.append([layer, float(gains[layer]), float(self.alpha[layer]), max(downs) if downs else float("nan")])
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
            "ours": self.ours,
            "edelman": self.edelman,
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
            "ours": self.ours,
            "edelman": self.edelman,
            "alpha": self.alpha.tolist(),
            "xi": self.xi.tolist(),
            "layers_path": self.layers_path,
            "layer_gains": None if self.layer_gains is None else self.layer_gains.tolist(),
            "degenerate": self.degenerate,
            "matrices": [m.to_dict(include_spectra) for m in self.matrices],
        }

    @classmethod
    def from_json(cls, path_or_text: str | os.PathLike) -> "SpectrumBoundReport":
        """A report written by :meth:`to_json` (with spectra), read back from a file path or a JSON string."""
        text = str(path_or_text)
        if not text.lstrip().startswith("{"):
            with open(path_or_text, encoding="utf-8") as fh:
                text = fh.read()
        d = json.loads(text)
        if "singular_values" not in (d["matrices"][0] if d["matrices"] else {"singular_values": 1}):
            raise ValueError("path_or_text: the report was written without spectra (include_spectra=False)")
        mats = []
        for m in d["matrices"]:
            m = dict(m, shape=tuple(m["shape"]), singular_values=np.asarray(m["singular_values"], dtype=np.float64),
                     contributions=np.asarray(m["contributions"], dtype=np.float64))
            zero = m["rank"] == 0
            down, up = m["flip_factor_down"], m["flip_factor_up"]
            m["flip_factor_down"] = math.nan if down is None else down
            m["flip_factor_up"] = (math.nan if zero else math.inf) if up is None else up
            mats.append(MatrixRecord(**m))
        arrays = {k: np.asarray(d[k], dtype=np.float64) for k in ("p_grid", "alpha", "xi")}
        gains = None if d.get("layer_gains") is None else np.asarray(d["layer_gains"], dtype=np.float64)
        skip = {"matrices", "degenerate", "layer_gains", *arrays}
        return cls(**{k: v for k, v in d.items() if k not in skip}, **arrays, matrices=mats, layer_gains=gains)

    def to_json(self, path: str | os.PathLike | None = None, include_spectra: bool = True, indent: int | None = None) -> str:
        """Serialise :meth:`to_dict`; also write it to ``path`` when given."""
        text = json.dumps(self.to_dict(include_spectra), indent=indent)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        return text


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


def _head_spectra(w: EncoderWeights, layer: int) -> dict[str, torch.Tensor]:
    """QK_h and Ṽ_h spectra and column norms of one layer, from the d_h×d_h cores."""
    f64 = torch.float64
    q, k, v, o = (w.heads(layer, role).to(f64) for role in ("query", "key", "value", "attn_output"))
    out = {}
    out["qk_sigma"], out["qk_cols"] = S.low_rank_product_spectrum(q.mT, k, check=False)  # QK_h = W_Q,hᵀ W_K,h
    out["v_sigma"], out["v_cols"] = S.low_rank_product_spectrum(v.mT, o, check=False)  # Ṽ_h = W_V,hᵀ (W_O)ᵀ[h]
    # ‖·‖_{1,1} needs the entries: the N×N products are formed here, one head at a time
    out["qk_11"] = torch.stack([(q[h].mT @ k[h]).abs().sum() for h in range(q.shape[0])])
    out["v_11"] = torch.stack([(v[h].mT @ o[h]).abs().sum() for h in range(v.shape[0])])
    return out


def _ffn_spectrum(weight: torch.Tensor, svd_method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """σ, column norms and ‖·‖_{1,1} of an FFN matrix in row-vector orientation (``weight`` is the ``(out, in)`` Linear weight)."""
    m = weight.to(torch.float64).mT
    return S.singular_values(m, method=svd_method, check=False), torch.linalg.vector_norm(m, dim=-2), m.abs().sum()


# Below this many entries per FFN matrix a thread pool costs more than it saves.
POOL_MIN_FFN_ENTRIES = 1 << 18


def _default_workers(device: torch.device, ffn_entries: int) -> int:
    """torch's CPU thread count for models with FFN matrices of ≥ 2¹⁸ entries (BERT-small and up), else 1."""
    if device.type != "cpu" or ffn_entries < POOL_MIN_FFN_ENTRIES:
        return 1
    return max(1, torch.get_num_threads())


def _all_spectra(w: EncoderWeights, svd_method: str, num_workers: int, progress: bool) -> list[dict[str, torch.Tensor]]:
    """Per-layer spectra, computed by ``num_workers`` threads (the solvers release the GIL).

    Jobs: one per FFN matrix (the dense, expensive part), one per layer for the per-head cores.
    BLAS and torch run single-threaded inside every job (torch's thread count is restored on
    return), so ``num_workers`` threads use ``num_workers`` cores; results agree across worker
    counts to rounding (MKL's kernels may round differently with the memory alignment they get).
    """
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    L = w.num_layers
    for i in range(L):
        _check_finite(w, i, ("query", "key", "value", "attn_output", "ffn_in", "ffn_out"))
    jobs: list[tuple[int, str, Any]] = [(i, "in", w.layers[i].ffn_in) for i in range(L)]
    jobs += [(i, "out", w.layers[i].ffn_out) for i in range(L) if w.layers[i].ffn_out is not None]
    jobs += [(i, "heads", None) for i in range(L)]  # FFN first: the longest jobs start earliest

    def run(job):
        i, kind, weight = job
        if kind == "heads":
            return _head_spectra(w, i)
        sigma, cols, n11 = _ffn_spectrum(weight, svd_method)
        return {f"{kind}_sigma": sigma, f"{kind}_cols": cols, f"{kind}_11": n11}

    per_layer: list[dict[str, torch.Tensor]] = [{} for _ in range(L)]
    with torch_threads(1), threadpool_limits(limits=1, user_api="blas"), tqdm(
        total=len(jobs), desc="spectra", disable=not progress, leave=False
    ) as bar:
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
                        layer=layer,
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


def _check_bound_arguments(L_phi, rank_tol, svd_method, num_workers) -> float:
    """Check :func:`spectrum_bounds`' settings; return ``rank_tol`` as a float."""
    positive_float(L_phi, "L_phi")
    if svd_method not in ("auto", "svd"):
        raise ValueError(f"svd_method: expected 'auto' or 'svd', got {svd_method!r}")
    positive_int(num_workers, "num_workers", allow_none=True)
    return real(rank_tol, "rank_tol", low=0, high=1, high_open=True)


def _stacked_spectra(w: EncoderWeights, svd_method: str, num_workers: int | None, progress: bool) -> dict:
    """Every layer's spectra and column norms (:func:`_all_spectra`), stacked over layers: ``{key: (L, ...)}``."""
    if num_workers is None:
        num_workers = _default_workers(w.layers[0].query.device, w.layers[0].ffn_in.numel())
    with torch.no_grad():
        per_layer = _all_spectra(w, svd_method, num_workers, progress)
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


def _matrix_groups(w: EncoderWeights, sp: dict, gamma: dict, alpha: torch.Tensor) -> list[tuple]:
    """``(type, σ, column norms, (1,1) norms, γ, α, full dimension)`` of each matrix type, for :func:`_type_stats`."""
    L, N, H = w.num_layers, w.hidden_size, w.num_heads
    n_in = min(N, w.intermediate_size)
    groups = [
        ("qk", sp["qk_sigma"], sp["qk_cols"], sp["qk_11"], gamma["qk"], alpha[:, None], N),
        ("v", sp["v_sigma"], sp["v_cols"], sp["v_11"], gamma["v"][:, None].expand(L, H), alpha[:, None], N),
        (w.ffn_in_type, sp["in_sigma"], sp["in_cols"], sp["in_11"], gamma["m_in"], alpha, n_in),
    ]
    if "out_sigma" in sp:
        groups.append(("m_out", sp["out_sigma"], sp["out_cols"], sp["out_11"], gamma["m_out"], alpha, n_in))
    return groups


def spectrum_bounds(
    model_or_path,
    L_phi: float = S.DEFAULT_L_PHI,
    p_grid_m: int | None = None,
    rank_tol: float = S.DEFAULT_RANK_TOL,
    *,
    svd_method: str = "auto",
    num_workers: int | None = None,
    progress: bool = False,
    **load_kwargs,
) -> SpectrumBoundReport:
    """Spectrum-adaptive Schatten proxy B_ours = Σ_W min_p c(W, p) + √L and Edelman's proxy of an encoder.

    Args:
        model_or_path: a Transformers model (BERT-like, ViT-like or CRATE), a local folder or a Hub id
            (loaded with ``AutoModel.from_pretrained(model_or_path, **load_kwargs)`` through
            :func:`hf_tdiag.loading.load_pretrained`: ``trust_remote_code=False`` unless passed as True).
        L_phi: Lipschitz constant of the FFN activation (1.13 for GELU).
        p_grid_m: grid resolution m of p ∈ {0, 1/m, …, 2}; default ⌈L + ln N⌉.
        rank_tol: singular values ≤ rank_tol · min(rows, cols) · max(σ₁, 1) are exact zeros.
        svd_method: ``"auto"`` (Gram eigenvalues for well-conditioned FFN matrices, else SVD) or ``"svd"``.
        num_workers: threads that solve the FFN spectra and per-layer head cores side by side, each with one BLAS thread
            (default ``torch.get_num_threads()`` on CPU for FFN matrices of ≥ 2¹⁸ entries, else 1); results
            agree across values to rounding (~1e-15 relative).
        progress: show a progress bar over layers.
    """
    rank_tol = _check_bound_arguments(L_phi, rank_tol, svd_method, num_workers)
    model, name = _model_and_name(model_or_path, load_kwargs)
    w = encoder_weights(model)
    L, N, H = w.num_layers, w.hidden_size, w.num_heads
    ps = S.p_grid(L, N, p_grid_m)
    sp = _stacked_spectra(w, svd_method, num_workers, progress)
    norms = _operator_norms(sp, L)
    gains = S.layer_gain(norms["in"], norms["out"], norms["v"], norms["qk"], L_phi)
    alpha = S.propagation_factors(norms["in"], norms["out"], norms["v"], norms["qk"], L_phi)
    gamma = S.type_factors(norms["in"], norms["out"], norms["v"])
    dev = sp["qk_sigma"].device
    stats = {g[0]: _type_stats(*g[1:], ps.to(dev), L, N, rank_tol) for g in _matrix_groups(w, sp, gamma, alpha)}
    ours = float(S.spectrum_adaptive_bound(torch.cat([torch.as_tensor(st["best"]).reshape(-1) for st in stats.values()]), L))
    xi = S.edelman_layer_terms(
        norms["in"], norms["out"], norms["v"], sp["qk_cols"].sum(-1), sp["v_cols"].sum(-1), sp["in_cols"].sum(-1),
        norms["out_21"],
    )
    edelman = float(S.edelman_bound(alpha, xi))
    shapes = {"qk": (N, N), "v": (N, N), w.ffn_in_type: (N, w.intermediate_size), "m_out": (w.intermediate_size, N)}
    records = _records(stats, shapes, L, H)
    return SpectrumBoundReport(
        model=name,
        model_type=w.model_type,
        family=w.family,
        num_layers=L,
        hidden_size=N,
        num_heads=H,
        head_dim=w.head_dim,
        intermediate_size=w.intermediate_size,
        L_phi=float(L_phi),
        rank_tol=rank_tol,
        p_grid=ps.numpy(),
        ours=ours,
        edelman=edelman,
        alpha=alpha.cpu().numpy(),
        xi=xi.cpu().numpy(),
        matrices=records,
        layers_path=w.layer_paths[0].rsplit(".", 1)[0],
        layer_gains=gains.cpu().numpy(),
    )


__all__ = ["MATRIX_TYPES", "MatrixRecord", "SpectrumBoundReport", "spectrum_bounds"]
