"""Gram-matrix losses and the fidelity errors of a reconstruction ``Â`` of ``A`` (per image, float64).

``G = AAᵀ``, ``Ĝ = ÂÂᵀ``; ``L_gram = ‖G − Ĝ‖²_F / ‖G‖²_F``; ``δ_rec = ‖A − Â‖_F``; ``δ_gram = √L_gram``;
the lemma ``‖G − Ĝ‖_F ≤ 2‖A‖_F δ_rec + δ_rec²``. Inputs are one image ``(N, d)`` or a batch ``(images, N, d)``.
"""

from __future__ import annotations

import torch

from ._checks import _as_batch, _check_pair


def _gram_sq_norms(A: torch.Tensor, A_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per image ``‖G − Ĝ‖²_F`` and ``‖G‖²_F`` on the smaller side of the Gram (inputs (B, N, d))."""
    N, d = A.shape[-2], A.shape[-1]
    if N <= d:
        G = A @ A.transpose(-1, -2)
        Gh = A_hat @ A_hat.transpose(-1, -2)
        return (G - Gh).square().sum((-1, -2)), G.square().sum((-1, -2))
    # ‖AAᵀ − ÂÂᵀ‖² = ‖AᵀA‖² − 2‖AᵀÂ‖² + ‖ÂᵀÂ‖²  (d×d matrices when d < N)
    C = A.transpose(-1, -2) @ A
    Ch = A_hat.transpose(-1, -2) @ A_hat
    X = A.transpose(-1, -2) @ A_hat
    g2 = C.square().sum((-1, -2))
    diff = (g2 - 2 * X.square().sum((-1, -2)) + Ch.square().sum((-1, -2))).clamp(min=0)
    return diff, g2


def gram_loss(A: torch.Tensor, A_hat: torch.Tensor) -> torch.Tensor:
    """Per-image Gram loss ``L_gram = ‖AAᵀ − ÂÂᵀ‖²_F / ‖AAᵀ‖²_F`` in float64 ((images,) or a scalar for one (N, d) image)."""
    A, A_hat = _check_pair(A, A_hat)
    diff, g2 = _gram_sq_norms(_as_batch(A).double(), _as_batch(A_hat).double())
    if bool((g2 == 0).any()):
        raise ValueError("A: an image has all-zero activations, so its Gram loss is undefined")
    out = diff / g2
    return out[0] if A.ndim == 2 else out


def gram_loss_grad(A: torch.Tensor, A_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-image L_gram and its gradient ``∂L_gram,i/∂Â_i = 4(Ĝ_i − G_i)Â_i / ‖G_i‖²_F`` (working dtype)."""
    A, A_hat = _check_pair(A, A_hat)
    return batched_gram_loss_grad(_as_batch(A), _as_batch(A_hat), squeeze=A.ndim == 2)


def batched_gram_loss_grad(A, A_hat, squeeze=False, G=None, g2=None):
    """:func:`gram_loss_grad` on ``(images, N, d)`` batches without argument checks; ``G = AAᵀ`` and ``g2 = ‖G‖²_F`` may be
    passed when the caller already has them (the joint optimiser reuses them across steps)."""
    N, d = A.shape[-2], A.shape[-1]
    At = A_hat.transpose(-1, -2)
    if N <= d:
        if G is None:
            G = A @ A.transpose(-1, -2)
        D = A_hat @ At - G
        diff = D.square().sum((-1, -2), dtype=torch.float64)
        grad_dir = D @ A_hat
    else:
        Ch = At @ A_hat
        X = A.transpose(-1, -2) @ A_hat
        C = A.transpose(-1, -2) @ A
        diff = (
            C.square().sum((-1, -2), dtype=torch.float64)
            - 2 * X.square().sum((-1, -2), dtype=torch.float64)
            + Ch.square().sum((-1, -2), dtype=torch.float64)
        ).clamp(min=0)
        grad_dir = A_hat @ Ch - A @ X
    if g2 is None:
        g2 = _gram_sq_norms(A, A)[1].double() if N > d else G.square().sum((-1, -2), dtype=torch.float64)
    if bool((g2 == 0).any()):
        raise ValueError("A: an image has all-zero activations, so its Gram loss is undefined")
    loss = diff / g2
    grad = 4.0 * grad_dir / g2.to(A.dtype)[:, None, None]
    if squeeze:
        return loss[0], grad[0]
    return loss, grad


def gram_error(A: torch.Tensor, A_hat: torch.Tensor) -> torch.Tensor:
    """Per-image ``‖G − Ĝ‖_F = ‖AAᵀ − ÂÂᵀ‖_F`` in float64."""
    A, A_hat = _check_pair(A, A_hat)
    diff, _ = _gram_sq_norms(_as_batch(A).double(), _as_batch(A_hat).double())
    out = diff.sqrt()
    return out[0] if A.ndim == 2 else out


def gram_lemma_rhs(A: torch.Tensor, A_hat: torch.Tensor) -> torch.Tensor:
    """Right-hand side of the lemma ``‖G − Ĝ‖_F ≤ 2‖A‖_F δ_rec + δ_rec²`` per image (float64)."""
    A, A_hat = _check_pair(A, A_hat)
    Ab, Hb = _as_batch(A).double(), _as_batch(A_hat).double()
    delta = (Ab - Hb).square().sum((-1, -2)).sqrt()
    out = 2 * Ab.square().sum((-1, -2)).sqrt() * delta + delta**2
    return out[0] if A.ndim == 2 else out


def fidelity_errors(A: torch.Tensor, A_hat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-image ``δ_rec = ‖A − Â‖_F``, ``δ_rec/‖A‖_F``, ``δ_gram = √L_gram``, ``‖G‖_F``, ``‖G − Ĝ‖_F`` and the lemma bound."""
    A, A_hat = _check_pair(A, A_hat)
    Ab, Hb = _as_batch(A).double(), _as_batch(A_hat).double()
    delta = (Ab - Hb).square().sum((-1, -2)).sqrt()
    a_norm = Ab.square().sum((-1, -2)).sqrt()
    diff, g2 = _gram_sq_norms(Ab, Hb)
    if bool((g2 == 0).any()):
        raise ValueError("A: an image has all-zero activations, so its Gram loss is undefined")
    out = {
        "delta_rec": delta,
        "delta_rec_rel": delta / a_norm,
        "delta_gram": (diff / g2).sqrt(),
        "gram_norm": g2.sqrt(),
        "gram_error": diff.sqrt(),
        "lemma_rhs": 2 * a_norm * delta + delta**2,
    }
    if A.ndim == 2:
        out = {k: v[0] for k, v in out.items()}
    return out
