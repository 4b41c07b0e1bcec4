"""Spectrum-adaptive Schatten bound proxies (Sakai & Imaizumi 2026) and the Edelman et al. (2022) proxy.

Pure float64 tensor math on singular values and matrices; no model knowledge.
Matrices are in row-vector orientation (``x ↦ x W``), as the paper's code uses
them; a PyTorch ``nn.Linear`` weight ``(out, in)`` is ``Wᵀ`` here.

Conventions shared by every function:

* A singular value is kept only when ``σᵢ > τ`` with the rank threshold
  ``τ = rank_tol · n · max(σ₁, 1)``, ``n = min(rows, cols)`` of the *full*
  matrix (``len(σ)`` of its dense SVD). Kept-out values are exact zeros for
  every Schatten index p, including p = 0 (where Σσᵖ is the numerical rank).
* Spectra may be batched: ``sigma`` has shape ``(..., r)``; ``r`` may be
  smaller than ``n`` when the matrix is known to have rank ≤ r (a per-head
  product ``AB`` with inner width r), the missing values being exact zeros.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .._defaults import DEFAULT_L_PHI, DEFAULT_RANK_TOL  # noqa: E402  (re-exported)
from .._validation import all_finite, positive_int, real
from ..kernels import small
from ..kernels.lapack import symmetric_eigenvalues, syrk_accumulate

# A Gram matrix gives σᵢ with relative error ~ eps·(σ₁/σᵢ)²; we use it only when
# σ_min² ≥ GRAM_MIN_RATIO · σ_max² (condition number ≤ 1000), where that error stays below ~1e-10
# per singular value and ~1e-12 on Schatten sums (tests/test_schatten_measures.py measures both).
GRAM_MIN_RATIO = 1e-6


# ----------------------------------------------------------------------------- validation


def _tensor(x, name: str, *, min_dim: int = 0, finite: bool = True) -> torch.Tensor:
    """Convert ``x`` to a float64 tensor (same device), rejecting non-numeric inputs and (``finite``) NaN and inf."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
    elif isinstance(x, (np.ndarray, list, tuple, float, int)) and not isinstance(x, bool):
        if np.asarray(x).dtype == np.bool_:  # a numpy bool array would convert to 0.0 / 1.0
            raise TypeError(f"{name}: expected a real floating tensor, got a boolean array")
        try:
            t = torch.as_tensor(np.asarray(x, dtype=np.float64))
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name}: expected a numeric tensor/array, got {type(x).__name__} ({err})") from None
    else:
        raise TypeError(f"{name}: expected a torch.Tensor or numpy array, got {type(x).__name__}")
    if t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name}: expected a real floating tensor, got dtype {t.dtype}")
    if t.dim() < min_dim:
        raise ValueError(f"{name}: expected at least {min_dim} dimension(s), got shape {tuple(t.shape)}")
    t = t.to(torch.float64)
    if finite and not all_finite(t):
        raise ValueError(f"{name}: contains NaN or inf values (shape {tuple(t.shape)})")
    return t


_P_EXPECTED = "Schatten indices p, finite numbers >= 0 (p = 0 counts the rank)"


def _p_values(ps, name: str = "ps") -> torch.Tensor:
    """Schatten indices as float64; a string, a bool, NaN, inf or a negative index is named with its value."""
    items = ps if isinstance(ps, (list, tuple)) else [ps]
    if any(isinstance(v, (str, bytes, bool)) for v in items):
        raise TypeError(f"{name}: expected {_P_EXPECTED}, got {ps!r}")
    t = _tensor(ps, name, finite=False)
    bad = ~torch.isfinite(t) | (t < 0)
    if bool(bad.any()):
        value = float(t[bad].reshape(-1)[0])
        where = f" at index {tuple(int(i) for i in bad.nonzero()[0])}" if t.dim() else ""
        raise ValueError(f"{name}: expected {_P_EXPECTED}, got {value!r}{where}")
    return t


def singular_values(matrix, *, method: str = "auto", check: bool = True) -> torch.Tensor:
    """σ(W): float64 singular values of ``(..., m, n)`` matrices, descending, ``min(m, n)`` per matrix.

    ``method="svd"`` is LAPACK's divide-and-conquer SVD; ``"auto"`` first tries
    ``σᵢ = √λᵢ(WᵀW)`` on the smaller side of the Gram matrix (a symmetric rank-k
    update plus a symmetric eigensolve, 2–4× faster) and keeps it only for
    matrices with condition number ≤ 1000 (``σ_min² ≥ 1e-6 σ_max²``), where every singular
    value agrees with the SVD to ~1e-10 relative; every other matrix goes to the SVD.
    Releases the GIL throughout, so several matrices can be solved in threads. ``check=False`` skips the
    argument checks for a caller that passes finite float64 tensors and a valid ``method`` (the probes).
    """
    w = matrix
    if check:
        w = _tensor(matrix, "matrix", min_dim=2)
        if method not in ("auto", "svd"):
            raise ValueError(f"method: expected 'auto' or 'svd', got {method!r}")
    if w.shape[-1] == 0 or w.shape[-2] == 0:
        return w.new_zeros(*w.shape[:-2], 0)
    if method == "svd":
        return torch.linalg.svdvals(w)
    lam = _gram_eigenvalues(w)  # descending
    lam_max = lam[..., :1]
    good = (lam[..., -1:] >= GRAM_MIN_RATIO * lam_max) & (lam_max > 0)
    good = good.squeeze(-1)
    sigma = lam.clamp_min(0).sqrt()
    if bool(good.all()):
        return sigma
    out = sigma.clone()
    bad = ~good
    out[bad] = torch.linalg.svdvals(w[bad])
    return out


def _gram_eigenvalues(w: torch.Tensor) -> torch.Tensor:
    """λ(WᵀW) or λ(WWᵀ), whichever is smaller, descending; ``(..., m, n)`` float64.

    On CPU: NumPy's ``aᵀa`` (BLAS ``dsyrk``, one triangle) and ``eigvalsh`` (LAPACK
    ``dsyevd``, values only), both of which release the GIL; elsewhere ``torch``
    matmul + ``eigvalsh`` on the device.
    """
    tall = w.shape[-2] >= w.shape[-1]
    if w.device.type != "cpu":
        t = w if tall else w.mT
        return torch.linalg.eigvalsh(t.mT @ t).flip(-1)
    flat = w.reshape(-1, *w.shape[-2:])
    out = []
    for mat in flat:
        x = mat.numpy()
        gram = x.T @ x if tall else x @ x.T  # NumPy routes a matrix times its own transpose to dsyrk
        lam = np.linalg.eigvalsh(gram)
        out.append(torch.from_numpy(lam[::-1].copy()))  # a copy: ascontiguousarray keeps a 1-element view's stride
    return torch.stack(out).reshape(*w.shape[:-2], -1)


def low_rank_product_spectrum(left, right, *, check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """σ(AB) and the column norms ‖(AB)_{:,j}‖₂ of ``A (..., n, r) @ B (..., r, m)`` without forming AB.

    With ``A = Q_A R_A`` and ``Bᵀ = Q_B R_B`` (reduced QR), ``AB = Q_A (R_A R_Bᵀ) Q_Bᵀ``,
    so the nonzero singular values of the n×m product are those of the r×r core
    ``R_A R_Bᵀ`` and ``‖(AB)_{:,j}‖ = ‖R_A B_{:,j}‖``. Returns ``(σ (..., r'), norms (..., m))``
    with ``r' = min(r, n, m)``; when ``r ≥ min(n, m)`` the product is formed directly. ``check=False`` skips
    the conversion and NaN checks for a caller that passes finite float64 tensors.
    """
    a, b = (_tensor(left, "left", min_dim=2), _tensor(right, "right", min_dim=2)) if check else (left, right)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"left/right: inner dimensions differ, left {tuple(a.shape)} vs right {tuple(b.shape)}")
    n, r, m = a.shape[-2], a.shape[-1], b.shape[-1]
    if r >= min(n, m):
        prod = a @ b
        return small.svdvals(prod), torch.linalg.vector_norm(prod, dim=-2)
    r_a = small.qr_r(a)  # (..., r, r)
    r_b = small.qr_r(b.mT)  # (..., r, r)
    sigma = small.svdvals(r_a @ r_b.mT)
    col_norms = torch.linalg.vector_norm(r_a @ b, dim=-2)
    return sigma, col_norms


# Chunks of at most this many entries (8 MiB in float64) bound the working memory of the streamed spectra.
CHUNK_ENTRIES = 1 << 20


def chunk_rows(num_cols: int, chunk_entries: int | None = None) -> int:
    """Rows per chunk of a matrix with ``num_cols`` columns: ``max(1, chunk_entries // num_cols)`` (default
    :data:`CHUNK_ENTRIES`)."""
    return max(1, (CHUNK_ENTRIES if chunk_entries is None else chunk_entries) // max(1, num_cols))


def streamed_gram(chunks, on_chunk=None) -> torch.Tensor:
    """G = Σ_c A_cᵀ A_c of the row blocks ``A_c (r_c, n)`` of a tall matrix A, upper triangle, float64 ``(n, n)``.

    BLAS ``dsyrk`` accumulates in place (no ``n×n`` temporary), one block at a time, so A is never held whole;
    the lower triangle is left unspecified. The GIL is released during each ``dsyrk``
    (:mod:`hf_tdiag.kernels.lapack`), so jobs in threads run side by side.
    ``on_chunk(A_c)`` (float64) is called on every block as it passes.
    """
    gram = None
    for c in chunks:
        c = c.detach().to(torch.float64).cpu()
        if on_chunk is not None:
            on_chunk(c)
        if gram is None:
            gram = np.zeros((c.shape[1], c.shape[1]), dtype=np.float64, order="F")
        gram = syrk_accumulate(gram, c.numpy())
    return torch.from_numpy(gram)


def streamed_r_factor(chunks, on_chunk=None) -> torch.Tensor:
    """R of A = QR for a tall A given as row blocks (TSQR: R ← qr([R; A_c]).R); ``σ(A) = σ(R)``, float64 ``(n, n)``."""
    r = None
    for c in chunks:
        a = c.detach().to(torch.float64)
        if on_chunk is not None:
            on_chunk(a)
        r = torch.linalg.qr(a if r is None else torch.cat([r, a]), mode="r")[1]
    return r


def streamed_singular_values(make_chunks, method: str = "auto", on_chunk=None) -> torch.Tensor:
    """σ of a tall matrix ``(m, n)``, ``m ≥ n``, given as row blocks: ``make_chunks()`` yields them anew on each call.

    ``"auto"``: eigenvalues of the streamed Gram (:func:`streamed_gram`), kept when the condition number is ≤ 1000
    (the rule of :func:`singular_values`); otherwise — and for ``"svd"`` — the SVD of the TSQR factor R
    (:func:`streamed_r_factor`), a second pass over the blocks. Peak memory: one block plus two ``n×n`` matrices.
    ``on_chunk`` sees every float64 block of the first pass (for norms computed on the way).
    """
    if method not in ("auto", "svd"):
        raise ValueError(f"method: expected 'auto' or 'svd', got {method!r}")
    if method == "auto":
        gram = streamed_gram(make_chunks(), on_chunk)
        lam = symmetric_eigenvalues(gram.numpy())  # LAPACK dsyevd in place, values only, without the GIL
        del gram
        lam = torch.from_numpy(np.array(lam[::-1]))  # a copy: ascontiguousarray keeps a 1-element view's stride
        if float(lam[-1]) >= GRAM_MIN_RATIO * float(lam[0]) and float(lam[0]) > 0:
            return lam.clamp_min(0).sqrt()
        on_chunk = None
    return torch.linalg.svdvals(streamed_r_factor(make_chunks(), on_chunk))


def rank_threshold(sigma, full_dim: int | None = None, rank_tol: float = DEFAULT_RANK_TOL) -> torch.Tensor:
    """τ = rank_tol · n · max(σ₁, 1), with n = full_dim (default len(σ)); shape ``(...,)``."""
    s = _tensor(sigma, "sigma", min_dim=1)
    tol = real(rank_tol, "rank_tol", low=0, high=1, high_open=True)
    n = s.shape[-1] if full_dim is None else positive_int(full_dim, "full_dim")
    if full_dim is not None and s.shape[-1] > n:
        raise ValueError(f"full_dim: {n} is smaller than the number of singular values given ({s.shape[-1]})")
    if s.shape[-1] == 0:
        return s.new_full(s.shape[:-1], tol * n)
    top = s.abs().amax(dim=-1)
    return tol * n * torch.clamp(top, min=1.0)


def clean_spectrum(sigma, full_dim: int | None = None, rank_tol: float = DEFAULT_RANK_TOL) -> torch.Tensor:
    """σᵢ·[σᵢ > τ], sorted descending: singular values at or below the rank threshold become exact zeros."""
    s = _tensor(sigma, "sigma", min_dim=1)
    if bool((s < 0).any()):
        raise ValueError(f"sigma: singular values must be >= 0, got min {float(s.min())}")
    tau = rank_threshold(s, full_dim, rank_tol)
    s = torch.where(s > tau.unsqueeze(-1), s, torch.zeros_like(s))
    return torch.sort(s, dim=-1, descending=True).values


def schatten_powers(sigma, ps, full_dim: int | None = None, rank_tol: float = DEFAULT_RANK_TOL) -> torch.Tensor:
    """S_p(W) = Σ_{σᵢ>τ} σᵢᵖ for each p in ``ps`` (p = 0 gives the numerical rank); shape ``(..., len(ps))``."""
    s = clean_spectrum(sigma, full_dim, rank_tol)
    p = _p_values(ps, "ps").reshape(-1).to(s.device)
    kept = (s > 0).unsqueeze(-2)  # (..., 1, r)
    powered = torch.where(kept, s.unsqueeze(-2) ** p.unsqueeze(-1), torch.zeros((), dtype=s.dtype, device=s.device))
    return powered.sum(dim=-1)


def schatten_power(sigma, p: float, full_dim: int | None = None, rank_tol: float = DEFAULT_RANK_TOL) -> torch.Tensor:
    """S_p(W) = Σ_{σᵢ>τ} σᵢᵖ for p > 0 and #{σᵢ > τ} for p = 0; shape ``(...,)``."""
    if isinstance(p, (torch.Tensor, np.ndarray)) and p.ndim == 0:
        p = p.item()  # one index held in a 0-d tensor or array
    return schatten_powers(sigma, [real(p, "p", low=0)], full_dim, rank_tol)[..., 0]


def numerical_rank(sigma, full_dim: int | None = None, rank_tol: float = DEFAULT_RANK_TOL) -> torch.Tensor:
    """rank(W) = #{σᵢ > rank_tol · n · max(σ₁, 1)}; shape ``(...,)``, integer valued."""
    return (clean_spectrum(sigma, full_dim, rank_tol) > 0).sum(dim=-1)


def spectral_norm(sigma) -> torch.Tensor:
    """‖W‖₂ = σ₁ (0 for an empty spectrum)."""
    s = _tensor(sigma, "sigma", min_dim=1)
    if s.shape[-1] == 0:
        return s.new_zeros(s.shape[:-1])
    return s.amax(dim=-1)


def frobenius_norm(sigma, full_dim: int | None = None, rank_tol: float = DEFAULT_RANK_TOL) -> torch.Tensor:
    """‖W‖_F = (Σ σᵢ²)^{1/2} over the kept singular values."""
    return schatten_power(sigma, 2.0, full_dim, rank_tol).sqrt()


def nuclear_norm(sigma, full_dim: int | None = None, rank_tol: float = DEFAULT_RANK_TOL) -> torch.Tensor:
    """‖W‖_* = Σ σᵢ over the kept singular values."""
    return schatten_power(sigma, 1.0, full_dim, rank_tol)


def stable_rank(sigma, full_dim: int | None = None, rank_tol: float = DEFAULT_RANK_TOL) -> torch.Tensor:
    """srank(W) = ‖W‖_F² / ‖W‖₂² (0 for the zero matrix)."""
    fro2 = schatten_power(sigma, 2.0, full_dim, rank_tol)
    top = spectral_norm(clean_spectrum(sigma, full_dim, rank_tol))
    return torch.where(top > 0, fro2 / torch.where(top > 0, top, torch.ones_like(top)) ** 2, torch.zeros_like(top))


def norm_2_1(matrix) -> torch.Tensor:
    """‖W‖_{2,1} = Σ_j ‖W_{:,j}‖₂ (sum of column ℓ2 norms); batched over leading dims."""
    w = _tensor(matrix, "matrix", min_dim=2)
    return torch.linalg.vector_norm(w, dim=-2).sum(dim=-1)


def norm_1_1(matrix) -> torch.Tensor:
    """‖W‖_{1,1} = Σ_{i,j} |W_ij| (sum of absolute entries); batched over leading dims."""
    w = _tensor(matrix, "matrix", min_dim=2)
    return w.abs().sum(dim=(-2, -1))


# ----------------------------------------------------------------------------- the bound


def p_grid(num_layers: int, hidden_size: int, m: int | None = None) -> torch.Tensor:
    """p ∈ {0, 1/m, 2/m, …, 2} with m = ⌈L + ln N⌉ unless given; float64, 2m + 1 points."""
    L = positive_int(num_layers, "num_layers")
    N = positive_int(hidden_size, "hidden_size")
    m = math.ceil(L + math.log(N)) if m is None else positive_int(m, "m")
    return torch.arange(2 * m + 1, dtype=torch.float64) / m


def layer_gain(m_in_norm, m_out_norm, v_norms, qk_norms, L_phi: float = DEFAULT_L_PHI) -> torch.Tensor:
    """f_k = L_φ ‖M_in^k‖₂ ‖M_out^k‖₂ Σ_h ‖Ṽ^{k,h}‖₂ (1 + 4‖QK^{k,h}‖₂); ``v_norms, qk_norms`` are ``(L, H)``."""
    m_in = _tensor(m_in_norm, "m_in_norm", min_dim=1)
    m_out = _tensor(m_out_norm, "m_out_norm", min_dim=1)
    v = _tensor(v_norms, "v_norms", min_dim=2)
    qk = _tensor(qk_norms, "qk_norms", min_dim=2)
    L = m_in.shape[0]
    if m_out.shape != (L,) or v.shape[0] != L or qk.shape != v.shape or m_in.dim() != 1:
        raise ValueError(
            "m_in_norm/m_out_norm/v_norms/qk_norms: expected shapes (L,), (L,), (L, H), (L, H); got "
            f"{tuple(m_in.shape)}, {tuple(m_out.shape)}, {tuple(v.shape)}, {tuple(qk.shape)}"
        )
    phi = _tensor(L_phi, "L_phi")
    if phi.dim() != 0 or float(phi) <= 0:
        raise ValueError(f"L_phi: expected a positive scalar, got {L_phi!r}")
    return phi * m_in * m_out * (v * (1 + 4 * qk)).sum(dim=-1)


def propagation_factors(m_in_norm, m_out_norm, v_norms, qk_norms, L_phi: float = DEFAULT_L_PHI) -> torch.Tensor:
    """α_ℓ = Π_{k>ℓ} L_φ ‖M_in^k‖₂ ‖M_out^k‖₂ Σ_h ‖Ṽ^{k,h}‖₂ (1 + 4‖QK^{k,h}‖₂), empty product = 1; shape ``(L,)``."""
    gain = layer_gain(m_in_norm, m_out_norm, v_norms, qk_norms, L_phi)
    # α_ℓ = Π_{k=ℓ+1}^{L-1} f_k : reversed exclusive cumulative product
    shifted = torch.cat([gain[1:], gain.new_ones(1)])
    return torch.flip(torch.cumprod(torch.flip(shifted, [0]), 0), [0])


def type_factors(m_in_norm, m_out_norm, v_norms) -> dict[str, torch.Tensor]:
    """γ per type: QK 2‖Ṽ^{ℓ,h}‖₂‖M_out^ℓ‖₂‖M_in^ℓ‖₂ (L, H); Ṽ ‖M_out^ℓ‖₂‖M_in^ℓ‖₂ (L,); M_in ‖M_out^ℓ‖₂ (L,); M_out 1 (L,)."""
    m_in = _tensor(m_in_norm, "m_in_norm", min_dim=1)
    m_out = _tensor(m_out_norm, "m_out_norm", min_dim=1)
    v = _tensor(v_norms, "v_norms", min_dim=2)
    if m_in.shape != m_out.shape or v.shape[0] != m_in.shape[0]:
        raise ValueError(
            f"m_in_norm/m_out_norm/v_norms: expected shapes (L,), (L,), (L, H); got "
            f"{tuple(m_in.shape)}, {tuple(m_out.shape)}, {tuple(v.shape)}"
        )
    ffn = m_out * m_in
    return {"qk": 2 * v * ffn.unsqueeze(-1), "v": ffn, "m_in": m_out.clone(), "m_out": torch.ones_like(m_out)}


def contributions(powers, ps, gamma, alpha, num_layers: int, hidden_size: int) -> torch.Tensor:
    """c(W, p) = (Σσᵖ)^{1/(p+2)} · (γ α_ℓ L)^{p/(p+2)} · N^{(p+1)/(p+2)}; ``powers`` is ``(..., P)``, γ, α broadcast to ``(...)``."""
    s = _tensor(powers, "powers", min_dim=1)
    p = _p_values(ps, "ps").reshape(-1)
    if s.shape[-1] != p.shape[0]:
        raise ValueError(f"powers: last dimension {s.shape[-1]} does not match len(ps) = {p.shape[0]}")
    if bool((s < 0).any()):
        raise ValueError("powers: Schatten powers must be >= 0")
    g = _tensor(gamma, "gamma")
    a = _tensor(alpha, "alpha")
    if bool((g < 0).any()) or bool((a < 0).any()):
        raise ValueError("gamma/alpha: factors must be >= 0")
    L = positive_int(num_layers, "num_layers")
    N = positive_int(hidden_size, "hidden_size")
    scale = (g * a * L).unsqueeze(-1)  # (..., 1)
    # log-domain evaluation; x^0 = 1 exactly (also for x = 0), 0^{q>0} = 0
    log_s = torch.log(s)
    log_scale = torch.log(scale)
    scale_term = torch.where(p == 0, torch.zeros_like(log_scale * p), log_scale * (p / (p + 2)))
    log_c = log_s / (p + 2) + scale_term + math.log(N) * (p + 1) / (p + 2)
    return torch.exp(log_c)


def flip_factors(powers, ps, scale, hidden_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors κ↓ ≤ 1 ≤ κ↑ by which the scale s = γα_ℓL must be multiplied for arg-min_p c(W, p) to change.

    With t = ln s, ln c(W, p) = a_p + k_p t, a_p = ln(Σσᵖ)/(p+2) + ln N·(p+1)/(p+2), k_p = p/(p+2):
    lines in t, so p* = arg-min keeps winning until the nearest crossing
    t_p = (a_{p*} − a_p)/(k_p − k_{p*}). κ↓ = exp(max_{p>p*} t_p − t) (a larger p wins below it; 0 when
    p* is the largest p), κ↑ = exp(min_{p<p*} t_p − t) (a smaller p wins above it; inf when p* = 0).
    NaN where every c(W, p) is 0 (a zero matrix) or s = 0. ``powers`` is ``(..., P)``, ``scale`` broadcasts to ``(...)``.
    """
    s = _tensor(powers, "powers", min_dim=1)
    p = _p_values(ps, "ps").reshape(-1).to(s.device)
    if s.shape[-1] != p.shape[0]:
        raise ValueError(f"powers: last dimension {s.shape[-1]} does not match len(ps) = {p.shape[0]}")
    sc = torch.broadcast_to(_tensor(scale, "scale").to(s.device), s.shape[:-1])
    N = positive_int(hidden_size, "hidden_size")
    a = torch.log(s) / (p + 2) + math.log(N) * (p + 1) / (p + 2)  # (..., P)
    k = p / (p + 2)
    t = torch.log(sc).unsqueeze(-1)  # (..., 1)
    log_c = a + torch.where(k == 0, torch.zeros_like(t * k), t * k)
    star = torch.argmin(log_c, dim=-1, keepdim=True)  # first index on ties, as optimal_contribution
    a_star = torch.gather(a, -1, star)
    k_star = k[star]
    dk = k - k_star
    with torch.no_grad():
        cross = (a_star - a) / torch.where(dk == 0, torch.ones_like(dk), dk)
    inf = torch.tensor(math.inf, dtype=s.dtype, device=s.device)
    down = torch.where(dk > 0, cross, -inf).amax(dim=-1)
    up = torch.where(dk < 0, cross, inf).amin(dim=-1)
    t0 = t.squeeze(-1)
    kd, ku = torch.exp(down - t0), torch.exp(up - t0)
    bad = ~torch.isfinite(a_star.squeeze(-1)) | ~torch.isfinite(t0)
    nan = torch.full_like(kd, math.nan)
    return torch.where(bad, nan, kd), torch.where(bad, nan, ku)


def optimal_contribution(curve, ps) -> tuple[torch.Tensor, torch.Tensor]:
    """min_p c(W, p) and the arg-min p (the smallest p on ties); ``curve`` is ``(..., P)``."""
    c = _tensor(curve, "curve", min_dim=1)
    p = _p_values(ps, "ps").reshape(-1).to(c.device)
    if c.shape[-1] != p.shape[0]:
        raise ValueError(f"curve: last dimension {c.shape[-1]} does not match len(ps) = {p.shape[0]}")
    best, idx = torch.min(c, dim=-1)  # torch.min returns the first index on ties
    return best, p[idx]


def spectrum_adaptive_bound(min_contributions, num_layers: int) -> torch.Tensor:
    """B_Schatten = Σ_W min_p c(W, p) + √L."""
    c = _tensor(min_contributions, "min_contributions")
    L = positive_int(num_layers, "num_layers")
    return c.sum() + math.sqrt(L)


def edelman_layer_terms(
    m_in_norm, m_out_norm, v_norms, qk_norms_2_1, v_norms_2_1, m_in_norm_2_1, m_out_norm_2_1
) -> torch.Tensor:
    """ξ_ℓ = Σ_h[(‖M_out‖‖M_in‖‖Ṽ_h‖₂‖QK_h‖_{2,1})^{2/3} + (‖M_out‖‖M_in‖‖Ṽ_h‖_{2,1})^{2/3}] + (‖M_out‖‖M_in‖_{2,1})^{2/3} + ‖M_out‖_{2,1}^{2/3}."""
    m_in = _tensor(m_in_norm, "m_in_norm", min_dim=1)
    m_out = _tensor(m_out_norm, "m_out_norm", min_dim=1)
    v = _tensor(v_norms, "v_norms", min_dim=2)
    qk21 = _tensor(qk_norms_2_1, "qk_norms_2_1", min_dim=2)
    v21 = _tensor(v_norms_2_1, "v_norms_2_1", min_dim=2)
    in21 = _tensor(m_in_norm_2_1, "m_in_norm_2_1", min_dim=1)
    out21 = _tensor(m_out_norm_2_1, "m_out_norm_2_1", min_dim=1)
    L = m_in.shape[0]
    if not (
        m_out.shape == in21.shape == out21.shape == (L,) and v.shape == qk21.shape == v21.shape and v.shape[0] == L
    ):
        raise ValueError(
            "edelman_layer_terms: expected (L,) per-layer norms and (L, H) per-head norms; got "
            f"m_in {tuple(m_in.shape)}, m_out {tuple(m_out.shape)}, v {tuple(v.shape)}, qk_2_1 {tuple(qk21.shape)}, "
            f"v_2_1 {tuple(v21.shape)}, m_in_2_1 {tuple(in21.shape)}, m_out_2_1 {tuple(out21.shape)}"
        )
    ffn = (m_out * m_in).unsqueeze(-1)
    t = 2.0 / 3.0
    heads = ((ffn * v * qk21) ** t + (ffn * v21) ** t).sum(dim=-1)
    return heads + (m_out * in21) ** t + out21**t


def edelman_bound(alpha, xi) -> torch.Tensor:
    """B_Edelman = (1 + Σ_ℓ α_ℓ^{2/3} ξ_ℓ)^{3/2}."""
    a = _tensor(alpha, "alpha", min_dim=1)
    x = _tensor(xi, "xi", min_dim=1)
    if a.shape != x.shape:
        raise ValueError(f"alpha/xi: shapes differ, {tuple(a.shape)} vs {tuple(x.shape)}")
    if bool((a < 0).any()) or bool((x < 0).any()):
        raise ValueError("alpha/xi: must be >= 0")
    return (1 + (a ** (2.0 / 3.0) * x).sum()) ** 1.5


__all__: Sequence[str] = [
    "CHUNK_ENTRIES",
    "DEFAULT_L_PHI",
    "DEFAULT_RANK_TOL",
    "all_finite",
    "clean_spectrum",
    "contributions",
    "edelman_bound",
    "edelman_layer_terms",
    "flip_factors",
    "frobenius_norm",
    "layer_gain",
    "low_rank_product_spectrum",
    "norm_1_1",
    "norm_2_1",
    "nuclear_norm",
    "numerical_rank",
    "optimal_contribution",
    "p_grid",
    "propagation_factors",
    "rank_threshold",
    "schatten_power",
    "schatten_powers",
    "singular_values",
    "spectral_norm",
    "spectrum_adaptive_bound",
    "stable_rank",
    "streamed_gram",
    "streamed_r_factor",
    "streamed_singular_values",
]
