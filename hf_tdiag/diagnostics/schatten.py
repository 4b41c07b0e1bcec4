"""``hf_tdiag.schatten_bounds``: spectrum-adaptive Schatten and Edelman bound proxies of an encoder or a decoder.

Wires the weight probes (:mod:`hf_tdiag.probes.block_matrices`, :mod:`hf_tdiag.probes.spectrum_sources`) to the math
in :mod:`hf_tdiag.measures.schatten`: per layer and head the matrices ``QK``, ``Ṽ``, ``M_in``, ``M_out`` (CRATE's
ISTA dictionary, CRATE-α's ``D``/``D₁``, decoders' grouped-query heads and gated MLPs), their spectra, the factors
γ and α and both proxies. Which matrices each architecture contributes, and why, is in the user guide
(docs/guide/schatten.md, "Which matrices each architecture contributes"); ToST is refused (its attention computes
no query–key softmax). ``streaming=True`` reads a checkpoint folder shard by shard; an Accelerate-offloaded model is
read one block at a time.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from .._progress import tqdm
from .._threads import torch_threads
from ..measures import schatten as S
from ..probes.block_matrices import EncoderWeights, encoder_weights
from ..probes.spectrum_sources import DecoderSource, EncoderSource, ffn_job, head_job, offloaded_source
from .entry import diagnostic_entry
from .schatten_report import FORMAT_VERSION, MATRIX_TYPES, MatrixRecord, SchattenReport
from .settings import SchattenSettings


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


TSSA_REFUSAL = (
    "model: ToST's token-statistics self-attention (TSSA) is not softmax attention: it forms no query–key logits, so "
    "the bound's attention matrices QK_h = W_Q,hᵀ W_K,h, Ṽ_h and their Lipschitz factor 1 + 4‖QK_h‖₂ do not describe "
    "it, and schatten_bounds does not apply to ToST"
)

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
    if desc.attention == "tssa":
        raise ValueError(TSSA_REFUSAL)
    from ..probes.offload import is_offloaded

    if is_offloaded(model):  # Accelerate big-model inference: one job's weights at a time from the offload store
        return offloaded_source(model, desc), name, 1
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
                sh.ffn_out_type,
                sp["out_sigma"],
                sp["out_cols"],
                sp["out_11"],
                gamma["m_out"],
                alpha,
                min(N, sh.intermediate_size),
            )
        )
    return groups


@diagnostic_entry(SchattenSettings)
def schatten_bounds(
    model_or_path,
    *,
    settings: SchattenSettings,
    progress: bool = False,
    **load_kwargs,
) -> SchattenReport:
    """Spectrum-adaptive Schatten proxy B_Schatten = Σ_W min_p c(W, p) + √L and Edelman's proxy of an encoder or decoder.

    Args:
        model_or_path: a Transformers model (BERT-like, ViT-like, CRATE, or a GPT-2 / Llama-family decoder), a local
            folder or a Hub id (loaded with ``AutoModel.from_pretrained(model_or_path, **load_kwargs)`` through
            :func:`hf_tdiag.loading.load_pretrained`: ``trust_remote_code=False`` unless passed as True).
        progress: show a progress bar over layers.
        settings: a :class:`~hf_tdiag.diagnostics.settings.SchattenSettings`; its fields are also keywords, and a
            keyword given replaces the object's value.

    About the settings: ``L_phi`` is 1.13 for GELU (for a gated MLP, the Lipschitz constant of
    ``(a, b) ↦ act(a) ⊙ b`` on the data's domain, which is not derived); ``num_workers`` threads solve the FFN
    spectra and per-layer head cores side by side, each with one BLAS thread (default ``torch.get_num_threads()``
    on CPU for FFN matrices of ≥ 2¹⁸ entries, else 1; 1 when streaming), and results agree across values to
    rounding (~1e-15 relative); ``streaming=True`` reads a decoder checkpoint (folder or Hub id; safetensors,
    sharded or not) one job's tensors at a time without instantiating the model: peak memory is about the largest
    layer's weights (times ``num_workers``), with the same numbers as the in-memory path, bit for bit.

    Examples:
        >>> import math, torch, hf_tdiag
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification
        >>> _ = torch.manual_seed(0)
        >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10))
        >>> report = hf_tdiag.schatten_bounds(model)  # a model object, a save_pretrained folder or a Hub id
        >>> report.num_layers, report.hidden_size, len(report.matrices), sorted({m.type for m in report.matrices})
        (4, 64, 36, ['ista', 'qk', 'v'])
        >>> round(report.schatten_bound, 1), f"{report.edelman_bound:.3e}"
        (612.9, '6.282e+02')
        >>> bound = sum(m.min_contribution for m in report.matrices) + math.sqrt(report.num_layers)
        >>> math.isclose(report.schatten_bound, bound)
        True
        >>> report.to_pandas()[["layer", "head", "type", "rank", "p_opt"]].head(3)
           layer  head type  rank  p_opt
        0      1     0   qk    16    2.0
        1      1     1   qk    16    2.0
        2      1     2   qk    16    2.0
    """
    s = settings
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
    shapes = {"qk": (N, N), "v": (N, N), sh.ffn_in_type: (N, sh.ffn_in_width)}
    shapes[sh.ffn_out_type] = (sh.intermediate_size, N)
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
    "schatten_bounds",
]
