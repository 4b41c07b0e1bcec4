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
pass ``L_phi=1.0`` for that reading). CRATE-MAE's encoder blocks are CRATE blocks and are read the same way.

CRATE-α: Q = K = V = U_k, W_O = ``attention.out_proj`` (no bias). Its block ends with a residual sparse-coding
step ``z⁺ = z½ + D₁a₂(x)``, ``x = LN₂(z½)``, with ``a₁ = ReLU(ηDᵀx − ηλ)``, ``a₂ = ReLU(a₁ − ηDᵀ(Da₁ − x) − ηλ)``
and ``D, D₁`` of shape (N, r·N). In row-vector form that is the paper's residual FFN ``φ(x M_in) M_out`` with
``M_in = D`` (N × r·N, type ``"ista_d"``, read from ``sparse_coding.D``), ``M_out = D₁ᵀ`` (r·N × N, type
``"ista_d1"``, from ``sparse_coding.D1``) and φ the two ISTA steps as a function of ``u = xD``:
``a₁ = ReLU(ηu − ηλ)``, ``a₂ = ReLU(a₁(I − ηDᵀD) + ηu − ηλ)``. Both matrices enter every formula exactly where
M_in and M_out do (spectra, γ, α, ξ_ℓ). What the paper's argument does not cover, and this reading leaves out:
φ here is not a fixed activation — it holds D a second time, through ``DᵀD`` — so (i) its Lipschitz constant in
``u`` is the weight-dependent ``η(1 + ‖I − ηDᵀD‖₂)``, not a universal L_φ (``L_phi`` stays the user's number, as
for CRATE), and (ii) D's covering term counts its first use ``x ↦ xD`` only, not its second one inside φ (CRATE's
ISTA step, ``x(I + ηD − ηDᵀD)``, also uses its D twice and is read the same way).

ToST is refused: its token-statistics attention (TSSA) computes no softmax of query–key logits, so the paper's
attention matrices QK_h, Ṽ_h and the attention's Lipschitz factor ``1 + 4‖QK_h‖₂`` do not describe it.

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

A model dispatched with Accelerate's big-model inference (``device_map`` with CPU/disk offload, ``cpu_offload``)
runs the same jobs, each reading its tensors from the offload store while it runs
(:func:`hf_tdiag.probes.spectrum_sources.offloaded_source`, one worker): about one block's weights at a time.
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
    "it, and spectrum_bounds does not apply to ToST"
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
def spectrum_bounds(
    model_or_path,
    *,
    settings: SchattenSettings,
    progress: bool = False,
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

    Examples:
        >>> import math, torch, hf_tdiag
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification
        >>> _ = torch.manual_seed(0)
        >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10))
        >>> report = hf_tdiag.spectrum_bounds(model)  # a model object, a save_pretrained folder or a Hub id
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
    "spectrum_bounds",
]
