"""The joint objective ``J = L_rec + μ·L_gram`` in k dimensions, and its projected-gradient refinement.

With ``Â = U Wᵀ``: ``‖A − Â‖² = ‖A‖² − 2⟨U, AW⟩ + ⟨UᵀU, WᵀW⟩`` and ``Ĝ_i = U_i (WᵀW) U_iᵀ``, so the line
searches never form ``Â``; only ``AW`` (after a dictionary step) and ``AᵀU`` (after a code step) touch the
activations. ``L_rec = ‖A − Â‖²_F/‖A‖²_F``; ``L_gram = (1/B) Σ_i ‖G_i − Ĝ_i‖²_F/‖G_i‖²_F``. Rows ``X`` are
the activations reshaped to ``(rows, d)``; ``shape`` is the original ``(images, N, d)`` (or ``(rows, d)``),
``a2 = ‖A‖²_F``, ``G``/``g2`` the per-image Grams and their squared norms from :func:`grams`.
"""

from __future__ import annotations

import torch

from ..._progress import tqdm
from .gram import batched_gram_loss_grad


def grams(X, shape):
    """Per-image Grams ``G_i = A_i A_iᵀ`` (N×N) and ``‖G_i‖²_F`` (float64); (None, None) for row data."""
    if len(shape) != 3:
        return None, None
    A3 = X.reshape(shape)
    G = A3 @ A3.transpose(-1, -2)
    g2 = G.square().sum((-1, -2), dtype=torch.float64)
    if bool((g2 == 0).any()):
        raise ValueError("A: an image has all-zero activations, so its Gram loss is undefined")
    return G, g2


def losses(X, U, W, shape, a2, G=None, g2=None):
    """(L_rec, L_gram) for rows X ≈ U Wᵀ, forming Â (exact, no cancellation); L_gram is NaN for row data."""
    H = U @ W.T
    rec = float((X - H).square().sum(dtype=torch.float64)) / a2
    if len(shape) != 3:
        return rec, float("nan")
    gl, _ = batched_gram_loss_grad(X.reshape(shape), H.reshape(shape), G=G, g2=g2)
    return rec, float(gl.mean())


def quick_losses(X, U, W, shape, a2, G=None, g2=None, UtA=None):
    """(L_rec, L_gram) without forming Â: ‖A − UWᵀ‖² = ‖A‖² − 2⟨UᵀA, Wᵀ⟩ + ⟨UᵀU, WᵀW⟩ and Ĝ_i = U_i WᵀW U_iᵀ."""
    UtA = U.T @ X if UtA is None else UtA
    WtW = W.T @ W
    rec = a2 - 2 * float((UtA.double() * W.T.double()).sum()) + float(((U.T @ U).double() * WtW.double()).sum())
    rec = max(rec, 0.0) / a2
    if len(shape) != 3:
        return rec, float("nan")
    if G is None:  # N > d: the d×d route of the exact loss
        return rec, losses(X, U, W, shape, a2, G, g2)[1]
    U3 = U.reshape(*shape[:-1], U.shape[-1])
    Gh = U3 @ WtW @ U3.transpose(-1, -2)
    diff = (G - Gh).square().sum((-1, -2), dtype=torch.float64)
    return rec, float((diff / g2).mean())


def _gram_part(U, WtW, shape, G, g2):
    """(U per image, D_i = Ĝ_i − G_i, per-image L_gram)."""
    U3 = U.reshape(*shape[:-1], U.shape[-1])
    D = U3 @ WtW @ U3.transpose(-1, -2) - G
    return U3, D, D.square().sum((-1, -2), dtype=torch.float64) / g2


def objective_codes(mu, U, AW, WtW, shape, a2, G, g2):
    """(J, L_rec, L_gram, D) for codes U with the dictionary fixed (AW = A W)."""
    UtU = U.T @ U
    rec = (a2 - 2 * float((U * AW).sum(dtype=torch.float64)) + float((UtU.double() * WtW.double()).sum())) / a2
    _, D, gl = _gram_part(U, WtW, shape, G, g2)
    gl = float(gl.mean())
    return rec + mu * gl, rec, gl, D


def objective_dictionary(mu, W, U, UtU, AtU, shape, a2, G, g2):
    """(J, L_rec, L_gram, D, WᵀW) for a dictionary W with the codes fixed (AtU = Aᵀ U)."""
    WtW = W.T @ W
    rec = (a2 - 2 * float((AtU.double() * W.double()).sum()) + float((UtU.double() * WtW.double()).sum())) / a2
    _, D, gl = _gram_part(U, WtW, shape, G, g2)
    gl = float(gl.mean())
    return rec + mu * gl, rec, gl, D, WtW


class _State:
    """Factors and the cached products the line searches need (AW, WᵀW, UᵀU, AᵀU) and the step sizes."""

    def __init__(self, X, U, W, update_dictionary, a2):
        self.X, self.U, self.W = X, U, W
        self.WtW, self.AW, self.UtU = W.T @ W, X @ W, U.T @ U
        self.AtU = X.T @ U if update_dictionary else None
        self.tU = a2 / (2.0 * float(torch.linalg.eigvalsh(self.WtW.double()).max()) + 1e-30)
        self.tW = a2 / (2.0 * float(torch.linalg.eigvalsh(self.UtU.double()).max()) + 1e-30)


def _dictionary_step(s: _State, mu, shape, a2, G, g2) -> bool:
    """One Armijo-backtracked gradient step on W: ∂J/∂W = (2/‖A‖²)(W UᵀU − AᵀU) + (4μ/B) W Σ_i U_iᵀ D_i U_i / ‖G_i‖²."""
    B = shape[0]
    g2w = g2.to(s.X.dtype)[:, None, None]
    J, _, _, D, _ = objective_dictionary(mu, s.W, s.U, s.UtU, s.AtU, shape, a2, G, g2)
    U3 = s.U.reshape(*shape[:-1], s.U.shape[-1])
    S = (U3.transpose(-1, -2) @ (D / g2w) @ U3).sum(0)
    gW = (2.0 / a2) * (s.W @ s.UtU - s.AtU) + (4.0 * mu / B) * (s.W @ S)
    gnorm2 = float(gW.square().sum(dtype=torch.float64))
    for _ in range(40):
        W_new = s.W - s.tW * gW
        J_new, _, _, _, WtW_new = objective_dictionary(mu, W_new, s.U, s.UtU, s.AtU, shape, a2, G, g2)
        if J_new <= J - 0.5 * s.tW * gnorm2:
            s.W, s.WtW, s.AW = W_new, WtW_new, s.X @ W_new
            s.tW *= 1.5
            return True
        s.tW *= 0.5
    return False


def _codes_step(s: _State, mu, shape, a2, G, g2):
    """One projected step on U ≥ 0 with a quadratic-model backtracking test; returns (moved, L_rec, L_gram, J).

    ∂J/∂U_i = (2/‖A‖²)(U_i WᵀW − A_i W) + (4μ/B) D_i U_i WᵀW / ‖G_i‖².
    """
    B = shape[0]
    g2w = g2.to(s.X.dtype)[:, None, None]
    J, rec, gl, D = objective_codes(mu, s.U, s.AW, s.WtW, shape, a2, G, g2)
    U3 = s.U.reshape(*shape[:-1], s.U.shape[-1])
    gU = (2.0 / a2) * (s.U @ s.WtW - s.AW) + (4.0 * mu / B) * ((D / g2w) @ U3 @ s.WtW).reshape(s.U.shape)
    for _ in range(40):
        U_new = (s.U - s.tU * gU).clamp(min=0)
        step = U_new - s.U
        model = (
            J + float((gU * step).sum(dtype=torch.float64)) + float(step.square().sum(dtype=torch.float64)) / (2 * s.tU)
        )
        J_new, rec_new, gl_new, _ = objective_codes(mu, U_new, s.AW, s.WtW, shape, a2, G, g2)
        if J_new <= model:
            s.U = U_new
            s.UtU = U_new.T @ U_new
            if s.AtU is not None:
                s.AtU = s.X.T @ U_new
            s.tU *= 1.5
            return True, rec_new, gl_new, J_new
        s.tU *= 0.5
    return False, rec, gl, J


def refine(X, U, W, shape, a2, G, g2, iters, mu, update_dictionary, record=None, desc="refine", verbose=False):
    """Projected gradient with backtracking on J = L_rec + μ L_gram (monotone), U kept ≥ 0; returns (U, W).

    Each iteration: a dictionary step (when ``update_dictionary``), then a code step; stops when neither moves.
    """
    s = _State(X, U, W, update_dictionary, a2)
    for _ in tqdm(range(iters), desc=desc, disable=not verbose, leave=False):
        moved = _dictionary_step(s, mu, shape, a2, G, g2) if update_dictionary else False
        moved_u, rec, gl, J = _codes_step(s, mu, shape, a2, G, g2)
        if record is not None:
            record(desc, rec, gl, J)
        if not (moved or moved_u):
            break
    return s.U, s.W
