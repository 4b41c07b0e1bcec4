"""Coding rates and sparse rate reduction (Yu et al. 2023; Hu, Zou & Xu 2024).

Token matrices are ``Z`` of shape ``(..., N, d)`` (N tokens of dimension d, the
layout Transformers uses); subspaces are ``U`` of shape ``(K, d, p)`` (K heads
of dimension p). Every function returns one value per sample, shape
``Z.shape[:-2]``, in float64. Head projections ``U_kᵀZ`` are computed in
float32 (float64 when ``Z`` is float64); each log-determinant is taken on the
smaller side of its Gram matrix (``logdet(I_n + c A Aᵀ) = logdet(I_m + c AᵀA)``)
through a float64 Cholesky factorisation of the symmetric positive definite
``I + c·Gram``, batched over samples and heads; all of it is differentiable
except ``sparsity`` (a count, whose gradient is zero).

Precision (``precision=``): ``"float64"`` forms every Gram matrix in float64.
``"auto"`` (default) forms it in float32 from float32 inputs — the Gram product
is the measure's main cost — and keeps the Cholesky in float64; it checks the
condition of each matrix and recomputes in float64 where the float32 Gram could
cost more than ``FLOAT32_GRAM_TOLERANCE`` relative error (see
:func:`logdet_identity_plus_gram`). float64 inputs, and inputs that need a
gradient (the regulariser), always take the float64 path.

``head_projections`` and ``compression_rate_from_projections`` split ``Rᶜ`` into
its two costs so a caller can reuse head projections ``U_kᵀZ`` it already has
(e.g. the ones a CRATE forward pass computes), and ``srr_terms`` computes the
four terms of one state with each shared cost paid once.
"""

from __future__ import annotations

import functools
import math

import torch

from .._validation import check_tensor, finite_float, positive_float
from ..kernels import small
from ..kernels.gram import count_nonzero, lower_gram

__all__ = [
    "FLOAT32_GRAM_TOLERANCE",
    "PRECISIONS",
    "check_eps",
    "logdet_identity_plus_gram",
    "head_projections",
    "coding_rate",
    "compression_rate",
    "compression_rate_from_projections",
    "unit_tokens",
    "official_compression_rate",
    "sparsity",
    "sparse_rate_reduction",
    "srr_from_terms",
    "srr_terms",
]

PRECISIONS = ("auto", "float64")
# estimated relative error of a log-determinant allowed for a float32 Gram matrix: 10x below the 1e-5 promised;
# on CRATE-base states the estimate (float32_gram_error) ran 100-400x above the error measured against float64
FLOAT32_GRAM_TOLERANCE = 1e-6
_UNIT_ROUNDOFF_FLOAT32 = 2.0**-24


# ---------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------


def check_eps(eps) -> float:
    """``eps`` as a float: finite, > 0, and with a finite non-zero square (the rates divide by ε²)."""
    eps = positive_float(eps, "eps")
    if not 0.0 < eps * eps < math.inf:  # x * x overflows to inf (x ** 2 raises)
        raise ValueError(
            f"eps: expected a value whose square is a positive finite float (about 1e-150 to 1e150), got {eps!r}"
        )
    return eps


def _check_z(Z, finite: bool = True) -> None:
    check_tensor(Z, "Z", min_ndim=2, shape="(..., N, d)", finite=finite, nonempty_trailing=2)


def _check_u(U, d: int, finite: bool = True) -> None:
    check_tensor(U, "U", min_ndim=3, shape="(K, d, p)", finite=finite, nonempty_trailing=2)
    if U.ndim != 3:
        raise ValueError(f"U: expected shape (K, d, p), got shape {tuple(U.shape)}")
    if U.shape[0] == 0:
        raise ValueError("U: expected at least one subspace (K >= 1), got K = 0")
    if U.shape[1] != d:
        raise ValueError(f"U: expected shape (K, d={d}, p) to match Z's last dimension, got shape {tuple(U.shape)}")


# ---------------------------------------------------------------------------
# the one log-determinant
# ---------------------------------------------------------------------------


def _gram(A: torch.Tensor) -> torch.Tensor:
    """``AᵀA`` or ``AAᵀ``, whichever is smaller, in ``A``'s dtype, at least its lower triangle (what the Cholesky
    factorisation and ``eigvalsh`` read): by BLAS ``syrk`` on CPU where that pays (:mod:`hf_tdiag.kernels.gram`), else
    both triangles by a matmul (contiguous blocks batch several times faster)."""
    lower = lower_gram(A)
    if lower is not None:
        return lower
    A = A.contiguous()
    return A.transpose(-2, -1) @ A if A.shape[-2] >= A.shape[-1] else A @ A.transpose(-2, -1)


def _cholesky_logdet(mat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logdet, L, info)`` of SPD float64 ``mat``; eigenvalues where round-off broke positive definiteness."""
    L, info = small.cholesky_ex(mat)
    if bool((info != 0).any()):
        evals = small.eigvalsh(mat)
        return torch.log(evals.clamp_min(torch.finfo(torch.float64).tiny)).sum(-1), L, info
    return 2.0 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1), L, info


def _identity_plus(gram: torch.Tensor, scale) -> torch.Tensor:
    eye = torch.eye(gram.shape[-1], dtype=torch.float64, device=gram.device)
    return eye + scale * gram.to(torch.float64)


_PROBES = 8  # Hutchinson probes of tr(H⁻¹): a fixed Rademacher set, so the result is deterministic


@functools.lru_cache(maxsize=64)
def _rademacher(k: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(k)
    return (torch.randint(0, 2, (k, _PROBES), generator=g) * 2 - 1).to(device=device, dtype=torch.float32)


def float32_gram_error(mat: torch.Tensor, L: torch.Tensor, inner: int) -> torch.Tensor:
    """Estimated absolute logdet error of ``mat = I + c·G`` (k × k) formed and factored in float32:
    ``u·(√m + √k + 2)·tr(H⁻¹)``, ``u = 2⁻²⁴``.

    Rounding a Gram entry costs ``|δG_ij| ≲ u√m ‖a_i‖‖a_j‖`` (``m`` = ``inner`` length, random-walk
    accumulation), forming ``I + c·G`` ``2u`` relative per entry and the Cholesky factorisation a backward error
    ``≲ u√k`` per entry of the diagonally scaled ``H = D^{-½} mat D^{-½}`` (``D = diag(mat)``): an entrywise
    perturbation ``δH`` of that size, which moves ``logdet`` by ``tr(H⁻¹ δH)``, about ``|δH|·tr(H⁻¹)`` at most.
    ``tr(H⁻¹)`` — the condition measure, between ``1/λ_min(H)`` and ``k/λ_min(H)`` — is estimated from the
    Cholesky factor ``L`` of ``mat`` as ``mean_j ‖L⁻¹ D^{½} z_j‖²`` over fixed Rademacher vectors ``z_j``
    (Hutchinson; O(k²) per matrix).
    """
    k = mat.shape[-1]
    probes = torch.diagonal(mat, dim1=-2, dim2=-1).sqrt().to(torch.float32)[..., None] * _rademacher(k, mat.device)
    # an estimate needs one digit: the triangular solve runs in float32
    solved = small.solve_lower(L.to(torch.float32), probes)
    trace = solved.square().sum(-2, dtype=torch.float64).mean(-1)
    return _UNIT_ROUNDOFF_FLOAT32 * (math.sqrt(inner) + math.sqrt(k) + 2.0) * trace


def logdet_identity_plus_gram(A: torch.Tensor, scale: float | torch.Tensor, precision: str = "auto") -> torch.Tensor:
    """``logdet(I + scale·AᵀA)`` for ``A`` of shape (..., n, m), on the smaller Gram side, via Cholesky.

    ``precision="auto"``: Gram matrix and Cholesky in float32 for float32/16 inputs that need no gradient (the
    logarithms summed in float64), the whole call redone in float64 when :func:`float32_gram_error` exceeds
    ``FLOAT32_GRAM_TOLERANCE·|logdet|`` for any matrix (an ill-conditioned ``I + c·Gram``) or float32 round-off
    broke positive definiteness; ``"float64"``: always float64.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {list(PRECISIONS)}, got {precision!r}")
    float64 = precision == "float64" or A.dtype == torch.float64 or (A.requires_grad and torch.is_grad_enabled())
    if float64:
        return _cholesky_logdet(_identity_plus(_gram(A.to(torch.float64)), scale))[0]
    scale32 = scale.to(torch.float32) if isinstance(scale, torch.Tensor) else scale
    mat = _gram(A.to(torch.float32)).mul_(scale32)  # no gradient on this path: in place
    torch.diagonal(mat, dim1=-2, dim2=-1).add_(1.0)
    L, info = small.cholesky_ex(mat)
    if not bool((info != 0).any()):
        logdet = 2.0 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1).to(torch.float64)).sum(-1)
        error = float32_gram_error(mat, L, inner=max(A.shape[-2], A.shape[-1]))
        if not bool((error > FLOAT32_GRAM_TOLERANCE * logdet.abs().clamp_min(1.0)).any()):
            return logdet
    return logdet_identity_plus_gram(A, scale, precision="float64")


# ---------------------------------------------------------------------------
# public measures
# ---------------------------------------------------------------------------


def _check_mask(token_mask, Z: torch.Tensor):
    """Validate a (..., N) token mask; return it as float64 on Z's device (or None)."""
    if token_mask is None:
        return None
    if not isinstance(token_mask, torch.Tensor):
        raise TypeError(
            f"token_mask: expected a torch.Tensor of shape {tuple(Z.shape[:-1])}, got {type(token_mask).__name__}"
        )
    if tuple(token_mask.shape) != tuple(Z.shape[:-1]):
        raise ValueError(
            f"token_mask: expected shape {tuple(Z.shape[:-1])} (Z's leading dims and N), got {tuple(token_mask.shape)}"
        )
    if token_mask.dtype != torch.bool and not bool(((token_mask == 0) | (token_mask == 1)).all()):
        raise ValueError("token_mask: expected booleans or 0/1 values")
    mask = token_mask.to(device=Z.device, dtype=torch.float64)
    if bool((mask.sum(-1) == 0).any()):
        raise ValueError("token_mask: every sample needs at least one unmasked token")
    return mask


def _num_tokens(Z: torch.Tensor, mask) -> torch.Tensor | int:
    """N per sample: the mask's count, shape (..., 1, 1), or the plain int N."""
    return Z.shape[-2] if mask is None else mask.sum(-1)[..., None, None]


def _projections(Z: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    K, d, p = U.shape
    dtype = torch.float64 if Z.dtype == torch.float64 else torch.float32
    # rows k·p:(k+1)·p of W are U_kᵀ: a free view when U is itself a view of a (K·p, d) projection weight
    W = U.to(device=Z.device, dtype=dtype).transpose(-1, -2).reshape(K * p, d)
    # one matmul for all heads, then (..., N, K, p) -> contiguous (..., K, N, p)
    return torch.nn.functional.linear(Z.to(dtype), W).unflatten(-1, (K, p)).movedim(-2, -3).contiguous()


def _coding_rate(Z: torch.Tensor, eps: float, mask=None, precision: str = "auto") -> torch.Tensor:
    d = Z.shape[-1]
    if mask is not None:
        Z = Z * mask[..., None].to(Z.dtype)  # masked tokens add nothing to the Gram
    return 0.5 * logdet_identity_plus_gram(Z, d / (_num_tokens(Z, mask) * eps**2), precision)


def _compression_rate(A: torch.Tensor, eps: float, mask=None, precision: str = "auto") -> torch.Tensor:
    p = A.shape[-1]
    if mask is None:
        scale = p / (A.shape[-2] * eps**2)
    else:
        A = A * mask[..., None, :, None].to(A.dtype)
        scale = p / (mask.sum(-1)[..., None, None, None] * eps**2)
    return 0.5 * logdet_identity_plus_gram(A, scale, precision).sum(-1)


def _sparsity(Z: torch.Tensor, mask=None) -> torch.Tensor:
    if mask is None:
        counts = count_nonzero(Z)
        if counts is None:
            counts = torch.count_nonzero(Z.detach(), dim=(-2, -1)).to(torch.float64)
        return counts / (Z.shape[-1] * Z.shape[-2])
    nonzero = Z.detach() != 0
    return (nonzero & mask.bool()[..., None]).sum(dim=(-2, -1), dtype=torch.float64) / (Z.shape[-1] * mask.sum(-1))


def head_projections(Z: torch.Tensor, U: torch.Tensor, *, check_finite: bool = True) -> torch.Tensor:
    """Per-head projections ``A_k = Z U_k`` (the paper's ``U_kᵀZ``), shape (..., K, N, p), in one matmul.

    Computed in float64 if ``Z`` is float64, else in float32 (the Grams and log-determinants that
    follow are always float64).
    """
    _check_z(Z, check_finite)
    _check_u(U, Z.shape[-1], check_finite)
    return _projections(Z, U)


def coding_rate(
    Z: torch.Tensor,
    eps: float = 0.1,
    token_mask: torch.Tensor | None = None,
    precision: str = "auto",
    *,
    check_finite: bool = True,
) -> torch.Tensor:
    """``R(Z) = ½ logdet(I + d/(Nε²) ZᵀZ)`` per sample (``token_mask`` (..., N): only those tokens, N = their count).

    ``check_finite=False`` skips the NaN/inf scan for a caller that already made it (every function here).
    """
    eps = check_eps(eps)
    _check_z(Z, check_finite)
    return _coding_rate(Z, eps, _check_mask(token_mask, Z), precision)


def compression_rate_from_projections(
    A: torch.Tensor,
    eps: float = 0.1,
    token_mask: torch.Tensor | None = None,
    precision: str = "auto",
    *,
    check_finite: bool = True,
) -> torch.Tensor:
    """``Rᶜ = Σ_k ½ logdet(I + p/(Nε²) A_kᵀA_k)`` from head projections ``A`` of shape (..., K, N, p)."""
    eps = check_eps(eps)
    check_tensor(A, "A", min_ndim=3, shape="(..., K, N, p)", finite=check_finite, nonempty_trailing=2)
    mask = None
    if token_mask is not None:
        mask = _check_mask(token_mask, A.select(-3, 0))
    return _compression_rate(A, eps, mask, precision)


def compression_rate(
    Z: torch.Tensor,
    U: torch.Tensor,
    eps: float = 0.1,
    token_mask: torch.Tensor | None = None,
    precision: str = "auto",
    *,
    check_finite: bool = True,
) -> torch.Tensor:
    """``Rᶜ(Z; U) = Σ_k ½ logdet(I + p/(Nε²) (U_kᵀZ)ᵀ(U_kᵀZ))`` per sample."""
    eps = check_eps(eps)
    A = head_projections(Z, U, check_finite=check_finite)
    return _compression_rate(A, eps, _check_mask(token_mask, Z), precision)


def unit_tokens(A: torch.Tensor, *, check_finite: bool = True) -> torch.Tensor:
    """Each token (row) of ``A`` (..., N, p) scaled to unit ℓ2 norm, ``a_i / ‖a_i‖`` (all-zero rows stay zero)."""
    check_tensor(A, "A", min_ndim=2, shape="(..., N, p)", finite=check_finite, nonempty_trailing=2)
    A = A.to(torch.float64) if A.dtype == torch.float64 else A.to(torch.float32)
    return A / torch.linalg.vector_norm(A, dim=-1, keepdim=True).clamp_min(torch.finfo(A.dtype).tiny)


def official_compression_rate(
    A: torch.Tensor,
    eps: float = 0.1,
    token_mask: torch.Tensor | None = None,
    precision: str = "auto",
    *,
    check_finite: bool = True,
) -> torch.Tensor:
    """Official CRATE ``Rᶜ = Σ_k ½ logdet(I + p/(Nε²) Âₖ Âₖᵀ)``, ``Âₖ`` = head k's tokens of ``A`` (..., K, N, p) at unit norm.

    ``A`` is the ``qkv`` output ``U_kᵀ LN₁(Z)`` of a block (``vis_utils/coding_rate.py`` of the official code
    takes ``eps`` as ε², 0.01; here ε = 0.1). Computed on the smaller Gram side like every ``Rᶜ`` here.
    """
    Ahat = unit_tokens(A, check_finite=check_finite)
    return compression_rate_from_projections(Ahat, eps, token_mask=token_mask, precision=precision, check_finite=False)


def sparsity(Z: torch.Tensor, token_mask: torch.Tensor | None = None, *, check_finite: bool = True) -> torch.Tensor:
    """``sparsity(Z) = ‖Z‖₀ / (dN)`` per sample (a count: its gradient is zero)."""
    _check_z(Z, check_finite)
    return _sparsity(Z, _check_mask(token_mask, Z))


def srr_from_terms(R: torch.Tensor, Rc: torch.Tensor, sparsity: torch.Tensor, lam: float) -> torch.Tensor:
    """``SRR = Rᶜ − R + λ·sparsity`` from the three terms (Yu et al. 2023, eq. 1; lower is better)."""
    return Rc - R + lam * sparsity


def sparse_rate_reduction(
    Z: torch.Tensor,
    U: torch.Tensor,
    eps: float = 0.1,
    lam: float = 1.0,
    token_mask: torch.Tensor | None = None,
    precision: str = "auto",
) -> torch.Tensor:
    """``SRR(Z; U) = Rᶜ(Z; U) − R(Z) + λ·sparsity(Z)`` per sample (lower is better)."""
    return srr_terms(Z, U, eps=eps, lam=lam, token_mask=token_mask, precision=precision)["srr"]


def srr_terms(
    Z: torch.Tensor,
    U: torch.Tensor | None = None,
    *,
    projections: torch.Tensor | None = None,
    eps: float = 0.1,
    lam: float = 1.0,
    token_mask: torch.Tensor | None = None,
    precision: str = "auto",
) -> dict[str, torch.Tensor]:
    """All four terms of one state: ``{"R", "Rc", "sparsity", "srr"}`` with ``srr = Rc − R + λ·sparsity``.

    Pass either ``U`` (K, d, p) or precomputed ``projections`` (..., K, N, p)
    equal to :func:`head_projections` ``(Z, U)`` (e.g. reused from a forward pass).
    ``token_mask`` (..., N) restricts every term to the unmasked tokens (N = their count per sample).
    """
    eps = check_eps(eps)
    lam = finite_float(lam, "lam")
    _check_z(Z)
    mask = _check_mask(token_mask, Z)
    if (U is None) == (projections is None):
        raise ValueError("srr_terms: pass exactly one of U (K, d, p) or projections (..., K, N, p)")
    if projections is None:
        _check_u(U, Z.shape[-1])
        projections = _projections(Z, U)
    else:
        check_tensor(projections, "projections", min_ndim=3, shape="(..., K, N, p)", nonempty_trailing=2)
        batch = tuple(Z.shape[:-2])
        if tuple(projections.shape[:-3]) != batch or projections.shape[-2] != Z.shape[-2]:
            raise ValueError(
                f"projections: expected shape {batch + ('K', Z.shape[-2], 'p')} to match Z of shape "
                f"{tuple(Z.shape)}, got {tuple(projections.shape)}"
            )
    R = _coding_rate(Z, eps, mask, precision)
    Rc = _compression_rate(projections, eps, mask, precision)
    sp = _sparsity(Z, mask)
    return {"R": R, "Rc": Rc, "sparsity": sp, "srr": srr_from_terms(R, Rc, sp, lam)}
