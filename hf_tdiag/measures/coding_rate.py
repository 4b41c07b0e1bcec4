"""Coding rates and sparse rate reduction (Yu et al. 2023; Hu, Zou & Xu 2024).

Token matrices are ``Z`` of shape ``(..., N, d)`` (N tokens of dimension d, the
layout Transformers uses); subspaces are ``U`` of shape ``(K, d, p)`` (K heads
of dimension p). Every function returns one value per sample, shape
``Z.shape[:-2]``, in float64. Head projections ``U_kᵀZ`` are computed in
float32 (float64 when ``Z`` is float64); Gram matrices and log-determinants
are float64, each log-determinant taken on the smaller side of its Gram matrix
(``logdet(I_n + c A Aᵀ) = logdet(I_m + c AᵀA)``) through a Cholesky
factorisation of the symmetric positive definite ``I + c·Gram``, batched over
samples and heads; all of it is differentiable except
``sparsity`` (a count, whose gradient is zero).

``head_projections`` and ``compression_rate_from_projections`` split ``Rᶜ`` into
its two costs so a caller can reuse head projections ``U_kᵀZ`` it already has
(e.g. the ones a CRATE forward pass computes), and ``srr_terms`` computes the
four terms of one state with each shared cost paid once.
"""

from __future__ import annotations

import math
from typing import Dict

import torch

__all__ = [
    "logdet_identity_plus_gram",
    "head_projections",
    "coding_rate",
    "compression_rate",
    "compression_rate_from_projections",
    "unit_tokens",
    "official_compression_rate",
    "sparsity",
    "sparse_rate_reduction",
    "srr_terms",
]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# ---------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------


def _check_tensor(x, name: str, min_ndim: int, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor {what}, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name}: expected a floating tensor (float16/bfloat16/float32/float64), got dtype {x.dtype}")
    if x.ndim < min_ndim:
        raise ValueError(f"{name}: expected {what}, got shape {tuple(x.shape)}")
    if any(s == 0 for s in x.shape[-2:]):
        raise ValueError(f"{name}: expected non-empty trailing dimensions {what}, got shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x.detach()).all()):
        raise ValueError(f"{name}: contains NaN or inf values (shape {tuple(x.shape)})")


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps: expected a finite positive number, got {eps!r}")
    return float(eps)


def _check_lam(lam) -> float:
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam):
        raise ValueError(f"lam: expected a finite number, got {lam!r}")
    return float(lam)


def _check_z(Z) -> None:
    _check_tensor(Z, "Z", 2, "of shape (..., N, d)")


def _check_u(U, d: int) -> None:
    _check_tensor(U, "U", 3, "of shape (K, d, p)")
    if U.ndim != 3:
        raise ValueError(f"U: expected shape (K, d, p), got shape {tuple(U.shape)}")
    if U.shape[0] == 0:
        raise ValueError("U: expected at least one subspace (K >= 1), got K = 0")
    if U.shape[1] != d:
        raise ValueError(f"U: expected shape (K, d={d}, p) to match Z's last dimension, got shape {tuple(U.shape)}")


# ---------------------------------------------------------------------------
# the one log-determinant
# ---------------------------------------------------------------------------


def logdet_identity_plus_gram(A: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """``logdet(I + scale·AᵀA)`` for ``A`` of shape (..., n, m), on the smaller Gram side, float64, via Cholesky."""
    A = A.to(torch.float64).contiguous()  # batched Gram products are several times faster on contiguous blocks
    n, m = A.shape[-2], A.shape[-1]
    gram = A.transpose(-2, -1) @ A if n >= m else A @ A.transpose(-2, -1)
    k = gram.shape[-1]
    eye = torch.eye(k, dtype=torch.float64, device=A.device)
    mat = eye + scale * gram
    L, info = torch.linalg.cholesky_ex(mat)
    if bool((info != 0).any()):
        # I + c·Gram is SPD in exact arithmetic; fall back to an eigen-decomposition if round-off broke it.
        evals = torch.linalg.eigvalsh(mat)
        return torch.log(evals.clamp_min(torch.finfo(torch.float64).tiny)).sum(-1)
    return 2.0 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)


# ---------------------------------------------------------------------------
# public measures
# ---------------------------------------------------------------------------


def _check_mask(token_mask, Z: torch.Tensor):
    """Validate a (..., N) token mask; return it as float64 on Z's device (or None)."""
    if token_mask is None:
        return None
    if not isinstance(token_mask, torch.Tensor):
        raise TypeError(f"token_mask: expected a torch.Tensor of shape {tuple(Z.shape[:-1])}, got {type(token_mask).__name__}")
    if tuple(token_mask.shape) != tuple(Z.shape[:-1]):
        raise ValueError(f"token_mask: expected shape {tuple(Z.shape[:-1])} (Z's leading dims and N), got {tuple(token_mask.shape)}")
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
    U_cat = U.to(device=Z.device, dtype=dtype).permute(1, 0, 2).reshape(d, K * p)
    # one matmul for all heads, then (..., N, K, p) -> contiguous (..., K, N, p)
    return (Z.to(dtype) @ U_cat).unflatten(-1, (K, p)).movedim(-2, -3).contiguous()


def _coding_rate(Z: torch.Tensor, eps: float, mask=None) -> torch.Tensor:
    d = Z.shape[-1]
    if mask is not None:
        Z = Z.to(torch.float64) * mask[..., None]  # masked tokens add nothing to the Gram
    return 0.5 * logdet_identity_plus_gram(Z, d / (_num_tokens(Z, mask) * eps**2))


def _compression_rate(A: torch.Tensor, eps: float, mask=None) -> torch.Tensor:
    p = A.shape[-1]
    if mask is None:
        scale = p / (A.shape[-2] * eps**2)
    else:
        A = A.to(torch.float64) * mask[..., None, :, None]
        scale = p / (mask.sum(-1)[..., None, None, None] * eps**2)
    return 0.5 * logdet_identity_plus_gram(A, scale).sum(-1)


def _sparsity(Z: torch.Tensor, mask=None) -> torch.Tensor:
    nonzero = Z.detach() != 0
    if mask is None:
        return nonzero.sum(dim=(-2, -1), dtype=torch.float64) / (Z.shape[-1] * Z.shape[-2])
    return (nonzero & mask.bool()[..., None]).sum(dim=(-2, -1), dtype=torch.float64) / (Z.shape[-1] * mask.sum(-1))


def head_projections(Z: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """Per-head projections ``A_k = Z U_k`` (the paper's ``U_kᵀZ``), shape (..., K, N, p), in one matmul.

    Computed in float64 if ``Z`` is float64, else in float32 (the Grams and log-determinants that
    follow are always float64).
    """
    _check_z(Z)
    _check_u(U, Z.shape[-1])
    return _projections(Z, U)


def coding_rate(Z: torch.Tensor, eps: float = 0.1, token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``R(Z) = ½ logdet(I + d/(Nε²) ZᵀZ)`` per sample (``token_mask`` (..., N): only those tokens, N = their count)."""
    eps = _check_eps(eps)
    _check_z(Z)
    return _coding_rate(Z, eps, _check_mask(token_mask, Z))


def compression_rate_from_projections(
    A: torch.Tensor, eps: float = 0.1, token_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``Rᶜ = Σ_k ½ logdet(I + p/(Nε²) A_kᵀA_k)`` from head projections ``A`` of shape (..., K, N, p)."""
    eps = _check_eps(eps)
    _check_tensor(A, "A", 3, "of shape (..., K, N, p)")
    mask = None
    if token_mask is not None:
        mask = _check_mask(token_mask, A.select(-3, 0))
    return _compression_rate(A, eps, mask)


def compression_rate(
    Z: torch.Tensor, U: torch.Tensor, eps: float = 0.1, token_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``Rᶜ(Z; U) = Σ_k ½ logdet(I + p/(Nε²) (U_kᵀZ)ᵀ(U_kᵀZ))`` per sample."""
    eps = _check_eps(eps)
    A = head_projections(Z, U)
    return _compression_rate(A, eps, _check_mask(token_mask, Z))


def unit_tokens(A: torch.Tensor) -> torch.Tensor:
    """Each token (row) of ``A`` (..., N, p) scaled to unit ℓ2 norm, ``a_i / ‖a_i‖`` (all-zero rows stay zero)."""
    _check_tensor(A, "A", 2, "of shape (..., N, p)")
    A = A.to(torch.float64) if A.dtype == torch.float64 else A.to(torch.float32)
    return A / torch.linalg.vector_norm(A, dim=-1, keepdim=True).clamp_min(torch.finfo(A.dtype).tiny)


def official_compression_rate(
    A: torch.Tensor, eps: float = 0.1, token_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Official CRATE ``Rᶜ = Σ_k ½ logdet(I + p/(Nε²) Âₖ Âₖᵀ)``, ``Âₖ`` = head k's tokens of ``A`` (..., K, N, p) at unit norm.

    ``A`` is the ``qkv`` output ``U_kᵀ LN₁(Z)`` of a block (``vis_utils/coding_rate.py`` of the official code
    takes ``eps`` as ε², 0.01; here ε = 0.1). Computed on the smaller Gram side like every ``Rᶜ`` here.
    """
    return compression_rate_from_projections(unit_tokens(A), eps, token_mask=token_mask)


def sparsity(Z: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``sparsity(Z) = ‖Z‖₀ / (dN)`` per sample (a count: its gradient is zero)."""
    _check_z(Z)
    return _sparsity(Z, _check_mask(token_mask, Z))


def sparse_rate_reduction(
    Z: torch.Tensor, U: torch.Tensor, eps: float = 0.1, lam: float = 1.0, token_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``SRR(Z; U) = Rᶜ(Z; U) − R(Z) + λ·sparsity(Z)`` per sample (lower is better)."""
    return srr_terms(Z, U, eps=eps, lam=lam, token_mask=token_mask)["srr"]


def srr_terms(
    Z: torch.Tensor,
    U: torch.Tensor | None = None,
    *,
    projections: torch.Tensor | None = None,
    eps: float = 0.1,
    lam: float = 1.0,
    token_mask: torch.Tensor | None = None,
) -> Dict[str, torch.Tensor]:
    """All four terms of one state: ``{"R", "Rc", "sparsity", "srr"}`` with ``srr = Rc − R + λ·sparsity``.

    Pass either ``U`` (K, d, p) or precomputed ``projections`` (..., K, N, p)
    equal to :func:`head_projections` ``(Z, U)`` (e.g. reused from a forward pass).
    ``token_mask`` (..., N) restricts every term to the unmasked tokens (N = their count per sample).
    """
    eps = _check_eps(eps)
    lam = _check_lam(lam)
    _check_z(Z)
    mask = _check_mask(token_mask, Z)
    if (U is None) == (projections is None):
        raise ValueError("srr_terms: pass exactly one of U (K, d, p) or projections (..., K, N, p)")
    if projections is None:
        _check_u(U, Z.shape[-1])
        projections = _projections(Z, U)
    else:
        _check_tensor(projections, "projections", 3, "of shape (..., K, N, p)")
        batch = tuple(Z.shape[:-2])
        if tuple(projections.shape[:-3]) != batch or projections.shape[-2] != Z.shape[-2]:
            raise ValueError(
                f"projections: expected shape {batch + ('K', Z.shape[-2], 'p')} to match Z of shape "
                f"{tuple(Z.shape)}, got {tuple(projections.shape)}"
            )
    R = _coding_rate(Z, eps, mask)
    Rc = _compression_rate(projections, eps, mask)
    sp = _sparsity(Z, mask)
    return {"R": R, "Rc": Rc, "sparsity": sp, "srr": Rc - R + lam * sp}
