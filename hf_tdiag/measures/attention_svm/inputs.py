"""Input checks and conversions shared by the Att-SVM solvers, and two small public helpers.

* ``to_f64`` / ``valid_mask`` / ``check_norm`` / ``selection``: argument checks that name the argument,
  the expectation and what was given; ``selection`` turns selected indices or a selected-set mask into
  the constraint grid ``kind (n, T)`` (0 none, 1 inequality ``≥ 1``, 2 equality ``= 0``).
* ``matrix_correlation``: ``⟨A, B⟩ / (‖A‖_F ‖B‖_F)``; ``attention_probs``: ``softmax(q kᵀ · scale)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["NORMS", "to_f64", "matrix_correlation", "attention_probs", "check_norm", "selection", "valid_mask"]

NORMS = ("fro", "nuc")


def to_f64(value, name: str, ndim: int | None = None, device=None) -> torch.Tensor:
    """A finite float64 tensor (detached) from a tensor or numpy array, with ``ndim`` dimensions if given."""
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or numpy array, got {type(value).__name__}")
    if not (value.is_floating_point() or value.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"{name}: expected a floating tensor, got dtype {value.dtype}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(value.shape)}")
    value = value.detach()
    if device is not None:
        value = value.to(device)
    value = value.to(torch.float64)
    if not torch.isfinite(value).all():
        raise ValueError(f"{name}: contains NaN or inf")
    return value


def matrix_correlation(A, B) -> float:
    """Cosine ``⟨A, B⟩ / (‖A‖_F ‖B‖_F)`` of two matrices of the same shape."""
    A = to_f64(A, "A")
    B = to_f64(B, "B", device=A.device)
    if A.shape != B.shape:
        raise ValueError(f"matrix_correlation: shapes differ, {tuple(A.shape)} vs {tuple(B.shape)}")
    na, nb = torch.linalg.norm(A), torch.linalg.norm(B)
    if na == 0 or nb == 0:
        raise ValueError("matrix_correlation: a matrix is zero, its direction is undefined")
    return float((A * B).sum() / (na * nb))


def attention_probs(
    queries: torch.Tensor, keys: torch.Tensor, key_mask: torch.Tensor | None = None, scale: float | None = None
) -> torch.Tensor:
    """``softmax(q kᵀ · scale)`` over keys: ``(..., N_q, p), (..., N_k, p) → (..., N_q, N_k)``; masked keys get 0."""
    if scale is None:
        scale = queries.shape[-1] ** -0.5
    logits = torch.matmul(queries.to(torch.float64), keys.to(torch.float64).transpose(-1, -2)) * scale
    if key_mask is not None:
        logits = logits.masked_fill(~key_mask.bool().unsqueeze(-2), -math.inf)
    return torch.softmax(logits, dim=-1)


def check_norm(norm: str) -> str:
    """``norm`` must be ``"fro"`` or ``"nuc"``."""
    if norm not in NORMS:
        raise ValueError(f"norm: expected one of {NORMS}, got {norm!r}")
    return norm


def selection(selected, n: int, T: int, valid: torch.Tensor, name: str = "selected"):
    """``(ref (n,), kind (n, T) int8)`` from token indices ``(n,)`` or a boolean selected-set mask ``(n, T)``."""
    device = valid.device
    if isinstance(selected, np.ndarray):
        selected = torch.from_numpy(selected)
    if not isinstance(selected, torch.Tensor):
        raise TypeError(
            f"{name}: expected a tensor of token indices (n,) or a boolean mask (n, T), got {type(selected).__name__}"
        )
    selected = selected.to(device)
    kind = torch.zeros(n, T, dtype=torch.int8, device=device)
    if selected.dtype == torch.bool:
        if tuple(selected.shape) != (n, T):
            raise ValueError(
                f"{name}: a boolean selected-set mask must have shape {(n, T)}, got {tuple(selected.shape)}"
            )
        if (selected & ~valid).any():
            raise ValueError(
                f"{name}: selects tokens the query cannot see (padding in token_mask, or future positions with causal=True)"
            )
        counts = selected.sum(1)
        if (counts == 0).any():
            bad = torch.nonzero(counts == 0).squeeze(1)[:5].tolist()
            raise ValueError(f"{name}: every query needs at least one selected token; queries {bad} have none")
        ref = selected.to(torch.int8).argmax(1)
        kind[selected] = 2
        kind[valid & ~selected] = 1
        kind[torch.arange(n, device=device), ref] = 0
        return ref, kind
    if selected.is_floating_point() or selected.dtype == torch.complex64:
        raise TypeError(f"{name}: expected integer token indices or a boolean mask, got dtype {selected.dtype}")
    if tuple(selected.shape) != (n,):
        raise ValueError(f"{name}: expected token indices of shape {(n,)}, got {tuple(selected.shape)}")
    ref = selected.long()
    if (ref < 0).any() or (ref >= T).any():
        raise ValueError(f"{name}: token indices must lie in [0, {T}), got range [{int(ref.min())}, {int(ref.max())}]")
    if not valid[torch.arange(n, device=device), ref].all():
        raise ValueError(
            f"{name}: selects tokens the query cannot see (padding in token_mask, or future positions with causal=True)"
        )
    kind[valid] = 1
    kind[torch.arange(n, device=device), ref] = 0
    return ref, kind


def valid_mask(token_mask, shape, device, name="token_mask") -> torch.Tensor:
    """Boolean ``shape`` mask of real tokens (all True when ``token_mask`` is None)."""
    if token_mask is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    if isinstance(token_mask, np.ndarray):
        token_mask = torch.from_numpy(token_mask)
    if not isinstance(token_mask, torch.Tensor):
        raise TypeError(f"{name}: expected a boolean tensor of shape {tuple(shape)}, got {type(token_mask).__name__}")
    if tuple(token_mask.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(token_mask.shape)}")
    return token_mask.to(device).bool()
