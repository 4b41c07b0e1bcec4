"""Concept extraction and concept-fidelity math (pure tensors, no model knowledge).

Notation (DESIGN.md, "Concept fidelity"): per image the layer-l patch-token activations are
``A ∈ R^{N×d}`` (tokens by features). A Semi-NMF (Ding, Li & Jordan, TPAMI 2010) writes
``Â = U Wᵀ`` with codes ``U ≥ 0`` (N×k) and a signed dictionary ``W`` (d×k); scikit-learn style,
``components_ = Wᵀ`` has shape ``(k, d)``. Batches of images are ``(images, N, d)``; row data is
``(rows, d)``.

Losses used for fitting:

* ``L_rec  = ‖A − Â‖²_F / ‖A‖²_F`` (relative, so that it is on the same scale as the Gram loss),
* ``L_gram = (1/B) Σ_i ‖G_i − Ĝ_i‖²_F / ‖G_i‖²_F`` with per-image Grams ``G_i = A_i A_iᵀ``,
  ``Ĝ_i = Â_i Â_iᵀ`` (the dictionary is shared across images),
* the joint objective ``L_rec + μ·L_gram``; ``μ = 0`` is plain Semi-NMF.

Reported fidelity quantities: ``δ_rec = ‖A − Â‖_F``, ``δ_gram = √L_gram`` (per image), the lemma
``‖G − Ĝ‖_F ≤ 2‖A‖_F δ_rec + δ_rec²`` and the KL bound
``KL ≤ ½‖W_c‖²_op · L_block^{2 L_suf} · (√N δ_rec + α‖G‖_F δ_gram)²``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from tqdm.auto import tqdm

__all__ = [
    "SemiNMF",
    "ClassifierSupervisedSemiNMF",
    "semi_nmf_objective",
    "mu_update_codes",
    "lstsq_dictionary",
    "nnls_codes",
    "gram_loss",
    "gram_loss_grad",
    "gram_error",
    "gram_lemma_rhs",
    "fidelity_errors",
    "kl_divergence",
    "kl_bound",
    "match_concepts",
    "truncated_svd_error",
    "jacobian_spectral_norm",
]

_INITS = ("nndsvda", "nndsvd", "svd", "kmeans", "random")


# --------------------------------------------------------------------------- validation


def _check_tensor(x, name: str, ndims: tuple[int, ...]) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or numpy array, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")
    if x.ndim not in ndims:
        shapes = " or ".join({2: "(rows, d)", 3: "(images, N, d)", 1: "(n,)"}[n] for n in ndims)
        raise ValueError(f"{name}: expected shape {shapes}, got {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: contains NaN or inf values")
    return x


def _check_pair(A, A_hat) -> tuple[torch.Tensor, torch.Tensor]:
    A = _check_tensor(A, "A", (2, 3))
    A_hat = _check_tensor(A_hat, "A_hat", (2, 3))
    if A.shape != A_hat.shape:
        raise ValueError(f"A_hat: expected the shape of A {tuple(A.shape)}, got {tuple(A_hat.shape)}")
    return A, A_hat


# --------------------------------------------------------------------------- Semi-NMF steps


def semi_nmf_objective(A: torch.Tensor, U: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Semi-NMF objective ``‖A − U Wᵀ‖²_F`` (float64 scalar; A is (rows, d), U (rows, k), W (d, k))."""
    return (A.double() - U.double() @ W.double().T).square().sum()


def _solve_dictionary(UtA: torch.Tensor, UtU: torch.Tensor, dtype: torch.dtype, ridge: float = 0.0) -> torch.Tensor:
    """``W = (UᵀU)⁻¹ UᵀA`` transposed to (d, k): the k×k system in float64 (Cholesky, jitter, pinv fallback)."""
    UtU = UtU.double()
    UtA = UtA.double()
    k = UtU.shape[0]
    scale = float(UtU.diagonal().mean()) or 1.0
    eye = torch.eye(k, dtype=torch.float64, device=UtU.device)
    jitter = ridge
    for _ in range(6):
        L, info = torch.linalg.cholesky_ex(UtU + (jitter * scale) * eye)
        if int(info) == 0:
            return torch.cholesky_solve(UtA, L).T.to(dtype)
        jitter = max(jitter * 100.0, 1e-12)
    return (torch.linalg.pinv(UtU) @ UtA).T.to(dtype)


def lstsq_dictionary(A: torch.Tensor, U: torch.Tensor, ridge: float = 0.0) -> torch.Tensor:
    """Exact dictionary step ``W = Aᵀ U (UᵀU)⁻¹`` (Ding et al. eq. 9), k×k solve in float64."""
    return _solve_dictionary(U.T @ A, U.T @ U, A.dtype, ridge)


def _mu_ratio(U: torch.Tensor, AW: torch.Tensor, Pp: torch.Tensor, Pn: torch.Tensor, eps: float) -> torch.Tensor:
    """``√(([AW]⁺ + U[WᵀW]⁻) / ([AW]⁻ + U[WᵀW]⁺))`` given ``Pp = [WᵀW]⁺``, ``Pn = [WᵀW]⁻``."""
    pos = AW.clamp(min=0)
    denom = (pos - AW).add_(U @ Pp).add_(eps)  # [AW]⁻ = [AW]⁺ − AW exactly
    return pos.add_(U @ Pn).div_(denom).sqrt_()


def _split_gram(WtW: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return WtW.clamp(min=0), (-WtW).clamp(min=0)


def mu_update_codes(
    A: torch.Tensor, U: torch.Tensor, W: torch.Tensor, AW: torch.Tensor | None = None, eps: float = 1e-12
) -> torch.Tensor:
    """Ding–Li–Jordan code step ``U ← U ∘ √(([AW]⁺ + U[WᵀW]⁻) / ([AW]⁻ + U[WᵀW]⁺))`` (never increases the objective)."""
    if AW is None:
        AW = A @ W
    return U * _mu_ratio(U, AW, *_split_gram(W.T @ W), eps)


def _mu_pass(X: torch.Tensor, U: torch.Tensor, W: torch.Tensor, chunk: int, eps: float = 1e-12):
    """One MU code step on all rows, in place, streamed over row chunks so that each chunk of ``A`` is read once.

    Returns ``(UᵀA, UᵀU, ⟨AW, U⟩)`` of the updated codes: the next dictionary step and the objective need
    nothing else.
    """
    k, d = U.shape[1], X.shape[1]
    Pp, Pn = _split_gram(W.T @ W)
    UtA = torch.zeros(k, d, dtype=X.dtype, device=X.device)
    UtU = torch.zeros(k, k, dtype=X.dtype, device=X.device)
    for start in range(0, X.shape[0], chunk):
        Xc = X[start : start + chunk]
        Uc = U[start : start + chunk]
        Uc.mul_(_mu_ratio(Uc, Xc @ W, Pp, Pn, eps))
        UtA.addmm_(Uc.T, Xc)
        UtU.addmm_(Uc.T, Uc)
    # ⟨AW, U⟩ = ⟨UᵀA, Wᵀ⟩ (float64): k×d instead of rows×k work
    return UtA, UtU, float((UtA.double() * W.T.double()).sum())


def nnls_codes(
    A: torch.Tensor, W: torch.Tensor, U0: torch.Tensor | None = None, max_iter: int = 500, tol: float = 1e-3
) -> torch.Tensor:
    """Codes for a fixed dictionary: ``argmin_{U≥0} ‖A − U Wᵀ‖²_F`` by exact coordinate descent (HALS sweeps).

    Each sweep minimizes exactly over one concept's column at a time (in the working dtype; WᵀW, AW and
    the residual check in float64). Stops when the KKT
    residual (projected gradient) satisfies ``‖P(U WᵀW − A W)‖_F ≤ tol·‖A W‖_F`` — independent of the
    start, so a warm start ``U0`` and the cold start ``max(0, A W (WᵀW)⁻¹)`` reach the unique minimizer
    (WᵀW ≻ 0) to that tolerance.
    """
    WtW64 = (W.T @ W).double()
    AW = A @ W
    AWt64 = AW.double().T.contiguous()
    diag = WtW64.diagonal()
    if float(diag.min()) <= 0:
        raise ValueError("W: a concept vector is all zeros; codes are undefined")
    if U0 is None:
        Ut = torch.linalg.lstsq(WtW64, AWt64).solution.clamp(min=0)
    else:
        Ut = U0.double().T.clamp(min=0)
    target = tol * max(float(AWt64.norm()), 1e-300)

    def kkt(Xt):
        G = WtW64 @ Xt.double() - AWt64
        return float(torch.where(Xt > 0, G, G.clamp(max=0)).norm())

    # sweeps in the working dtype on (k, rows) layout: each concept's codes are one contiguous row
    Ut = Ut.to(A.dtype).contiguous()
    WtW = WtW64.to(A.dtype)
    AWt = AWt64.to(A.dtype)
    inv = (1.0 / diag).tolist()
    k = WtW.shape[0]
    for sweep in range(max_iter):
        if sweep % 5 == 0 and kkt(Ut) <= target:
            break
        for j in range(k):
            step = (AWt[j] - WtW[j] @ Ut).mul_(inv[j])
            Ut[j].add_(step).clamp_(min=0)
    return Ut.T.contiguous()


# --------------------------------------------------------------------------- Gram losses


def _as_batch(x: torch.Tensor) -> torch.Tensor:
    return x.unsqueeze(0) if x.ndim == 2 else x


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
    return _gram_loss_grad(_as_batch(A), _as_batch(A_hat), squeeze=A.ndim == 2)


def _gram_loss_grad(A, A_hat, squeeze=False, G=None, g2=None):
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


# --------------------------------------------------------------------------- KL and its bound


def kl_divergence(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Per-row ``KL(σ(p) ‖ σ(q)) = Σ_c σ(p)_c (log σ(p)_c − log σ(q)_c)`` in float64."""
    for name, x in (("logits_p", logits_p), ("logits_q", logits_q)):
        _check_tensor(x, name, (1, 2))
    if logits_p.shape != logits_q.shape:
        raise ValueError(f"logits_q: expected the shape of logits_p {tuple(logits_p.shape)}, got {tuple(logits_q.shape)}")
    lp = torch.log_softmax(logits_p.double(), dim=-1)
    lq = torch.log_softmax(logits_q.double(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(-1).clamp(min=0)


def kl_bound(
    w_c_op: float,
    l_block: float,
    n_suffix_blocks: int,
    n_tokens: int,
    delta_rec,
    alpha: float,
    gram_norm,
    delta_gram,
    l_norm: float = 1.0,
) -> dict[str, torch.Tensor]:
    """``KL ≤ ½ (‖W_c‖_op L_norm)² · L_block^{2 L_suf} · (√N δ_rec + α‖G‖_F δ_gram)²`` and its two terms.

    ``l_norm`` is the Lipschitz constant of whatever non-linear map sits between the last block and
    the linear head (the final LayerNorm of ViT/CRATE); 1 where the head is purely linear.
    """
    if n_suffix_blocks < 0:
        raise ValueError(f"n_suffix_blocks: expected >= 0, got {n_suffix_blocks}")
    if n_tokens < 1:
        raise ValueError(f"n_tokens: expected >= 1, got {n_tokens}")
    for name, v in (("w_c_op", w_c_op), ("l_block", l_block), ("alpha", alpha), ("l_norm", l_norm)):
        if not math.isfinite(float(v)) or float(v) < 0:
            raise ValueError(f"{name}: expected a finite non-negative number, got {v}")
    delta_rec = torch.as_tensor(delta_rec, dtype=torch.float64)
    gram_norm = torch.as_tensor(gram_norm, dtype=torch.float64)
    delta_gram = torch.as_tensor(delta_gram, dtype=torch.float64)
    const = 0.5 * (float(w_c_op) * float(l_norm)) ** 2 * float(l_block) ** (2 * n_suffix_blocks)
    rec_term = math.sqrt(n_tokens) * delta_rec
    gram_term = float(alpha) * gram_norm * delta_gram
    return {
        "bound": const * (rec_term + gram_term) ** 2,
        "rec_term": rec_term,
        "gram_term": gram_term,
        "bound_rec_only": const * rec_term**2,
        "bound_gram_only": const * gram_term**2,
        "constant": torch.tensor(const, dtype=torch.float64),
    }


# --------------------------------------------------------------------------- matching, SVD floor


def match_concepts(components_a, components_b) -> dict:
    """Hungarian matching maximizing total cosine similarity between two dictionaries' rows ((k_a, d), (k_b, d))."""
    a = _check_tensor(components_a, "components_a", (2,)).double().cpu()
    b = _check_tensor(components_b, "components_b", (2,)).double().cpu()
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"components_b: expected {a.shape[1]} features like components_a, got {b.shape[1]}")
    na, nb = a.norm(dim=1, keepdim=True), b.norm(dim=1, keepdim=True)
    if bool((na == 0).any()) or bool((nb == 0).any()):
        raise ValueError("components: a concept vector is all zeros; cosine similarity is undefined")
    cos = (a / na) @ (b / nb).T
    rows, cols = linear_sum_assignment(cos.numpy(), maximize=True)
    matched = cos[rows, cols]
    return {
        "rows": rows.tolist(),
        "cols": cols.tolist(),
        "cosine": matched,
        "mean_cosine": float(matched.mean()),
        "similarity": cos,
    }


def truncated_svd_error(A: torch.Tensor, k: int) -> float:
    """Eckart–Young floor ``min_{rank ≤ k} ‖A − B‖_F = √(Σ_{i>k} σ_i²)`` (float64; A is (rows, d) or (images, N, d))."""
    A = _check_tensor(A, "A", (2, 3))
    X = A.reshape(-1, A.shape[-1]).double()
    s = torch.linalg.svdvals(X.T @ X if X.shape[0] > X.shape[1] else X @ X.T).clamp(min=0)
    tail = s.sort(descending=True).values[k:].sum()
    return float(tail.clamp(min=0).sqrt())


def jacobian_spectral_norm(
    f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, n_iter: int = 20, rel_step: float = 1e-6, seed: int = 0
) -> torch.Tensor:
    """Per-sample ``σ_max(∂f/∂x)`` at ``x`` by power iteration on ``JᵀJ`` (central-difference JVPs, autograd VJPs).

    ``f`` must act on each sample (first dim) independently; use float64 inputs for accurate differences.
    Returns a float64 tensor of shape ``(samples,)``; a lower estimate that tightens with ``n_iter``.
    """
    x = _check_tensor(x, "x", (2, 3, 4)).detach()
    if isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1:
        raise ValueError(f"n_iter: expected a positive int, got {n_iter!r}")
    B = x.shape[0]
    view = (B,) + (1,) * (x.ndim - 1)

    def per_sample_norm(t):
        return t.flatten(1).norm(dim=1).clamp(min=1e-300)

    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(x.shape, generator=gen, dtype=torch.float64).to(device=x.device, dtype=x.dtype)
    v = v / per_sample_norm(v).view(view)
    h = (rel_step * per_sample_norm(x).clamp(min=1.0)).view(view)
    xg = x.clone().requires_grad_(True)
    with torch.enable_grad():
        y = f(xg)
    sigma = torch.zeros(B, dtype=torch.float64, device=x.device)
    for _ in range(n_iter):
        with torch.no_grad():
            jv = (f(x + h * v) - f(x - h * v)) / (2 * h.view((B,) + (1,) * (y.ndim - 1)))
        sigma = jv.flatten(1).norm(dim=1).double()
        (w,) = torch.autograd.grad(y, xg, grad_outputs=jv, retain_graph=True)
        v = w / per_sample_norm(w).view(view)
    return sigma


# --------------------------------------------------------------------------- the estimator


def _kmeans_codes(X: torch.Tensor, k: int, seed: int, n_iter: int = 30) -> torch.Tensor:
    """Ding et al.'s start ``U = H + 0.2`` from a k-means clustering (k-means++ seeded by ``seed``, Lloyd steps)."""
    gen = torch.Generator().manual_seed(seed)
    n = X.shape[0]
    x2 = X.square().sum(1)

    def sqdist(C):
        return (x2[:, None] - 2 * X @ C.T + C.square().sum(1)[None, :]).clamp(min=0)

    first = int(torch.randint(n, (1,), generator=gen))
    centers = [X[first]]
    dmin = sqdist(X[first : first + 1])[:, 0]
    for _ in range(1, k):
        probs = dmin.double().cpu()
        if float(probs.sum()) <= 0:
            idx = int(torch.randint(n, (1,), generator=gen))
        else:
            idx = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
        centers.append(X[idx])
        dmin = torch.minimum(dmin, sqdist(X[idx : idx + 1])[:, 0])
    C = torch.stack(centers)
    labels = sqdist(C).argmin(1)
    for _ in range(n_iter):
        H = torch.nn.functional.one_hot(labels, k).to(X.dtype)
        counts = H.sum(0)
        C_new = (H.T @ X) / counts.clamp(min=1)[:, None]
        C = torch.where(counts[:, None] > 0, C_new, C)
        new_labels = sqdist(C).argmin(1)
        if bool((new_labels == labels).all()):
            break
        labels = new_labels
    return torch.nn.functional.one_hot(labels, k).to(X.dtype) + 0.2



class SemiNMF:
    """Semi-NMF concepts ``A ≈ U Wᵀ`` (U ≥ 0) with optional Gram alignment, scikit-learn style.

    Fitting runs ``max_iter`` Ding–Li–Jordan multiplicative updates (plain Semi-NMF), then, when
    ``gram_weight = μ > 0``, ``refine_iter`` projected-gradient steps on ``L_rec + μ·L_gram``
    (per-image Grams; needs ``A`` of shape ``(images, N, d)``). The fitted codes are what
    :meth:`transform` returns for the training data: non-negative least squares for the final
    dictionary (exact coordinate-descent sweeps to the KKT tolerance ``encode_tol`` from the projected
    least-squares start), followed (μ > 0) by the same code-only refinement.

    Parameters: ``n_concepts`` (k); ``gram_weight`` (μ); ``max_iter`` MU iterations;
    ``refine_iter`` joint-objective iterations; ``tol`` relative objective decrease that stops
    the MU phase early (0 runs all iterations); ``init`` ``"nndsvda"`` (default: for each of the top-k
    singular score vectors its dominant signed part, zeros filled with the mean — Boutsidis & Gallopoulos'
    NNDSVDa adapted to Semi-NMF), ``"nndsvd"`` (the same with a tiny floor instead: sparser codes, slower
    MU progress), ``"svd"`` (the exact rank-(k−1) truncated SVD as k−1 shifted score columns plus one
    constant offset concept: starts at the rank-(k−1) optimum, PCA-like concepts), ``"kmeans"`` (Ding et
    al.'s cluster indicators + 0.2 from a seeded k-means++/Lloyd clustering) or ``"random"`` (|Gaussian|
    from a generator seeded with ``random_state``); ``encode_tol`` the KKT tolerance of the code solver;
    ``device``/``dtype`` for the work (default: the device of ``A``, float32 unless ``A`` is float64);
    ``verbose`` shows a progress bar. The MU loop streams over row chunks (one read of each chunk of ``A``
    per iteration for both products) in the working dtype; k×k solves and all loss sums are float64.

    Attributes after ``fit``: ``components_`` (k, d), ``codes_`` (shape of A with d → k),
    ``history_`` (per-iteration ``phase``, ``rec_loss`` = L_rec, ``gram_loss`` = L_gram (NaN for
    row data), ``objective``), ``n_iter_``, ``reconstruction_err_`` (‖A − Â‖_F).
    """

    def __init__(
        self,
        n_concepts: int,
        gram_weight: float = 0.0,
        max_iter: int = 200,
        refine_iter: int = 100,
        tol: float = 0.0,
        init: str = "nndsvda",
        encode_tol: float = 1e-3,
                device=None,
        dtype: torch.dtype | None = None,
        random_state: int = 0,
        verbose: bool = False,
    ):
        if isinstance(n_concepts, bool) or not isinstance(n_concepts, int) or n_concepts < 1:
            raise ValueError(f"n_concepts: expected a positive int, got {n_concepts!r}")
        if not math.isfinite(float(gram_weight)) or gram_weight < 0:
            raise ValueError(f"gram_weight: expected a finite number >= 0, got {gram_weight!r}")
        for name, v in (("max_iter", max_iter), ("refine_iter", refine_iter)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
        if init not in _INITS:
            raise ValueError(f"init: expected one of {_INITS}, got {init!r}")
        if dtype is not None and dtype not in (torch.float32, torch.float64):
            raise TypeError(f"dtype: expected torch.float32, torch.float64 or None, got {dtype}")
        self.n_concepts = n_concepts
        self.gram_weight = float(gram_weight)
        self.max_iter = max_iter
        self.refine_iter = refine_iter
        self.tol = float(tol)
        self.init = init
        if not encode_tol > 0:
            raise ValueError(f"encode_tol: expected a positive number, got {encode_tol!r}")
        self.encode_tol = float(encode_tol)
        self.device = device
        self.dtype = dtype
        self.random_state = random_state
        self.verbose = verbose

    # ---------------------------------------------------------------- helpers
    def _prepare(self, A, name="A") -> torch.Tensor:
        A = _check_tensor(A, name, (2, 3))
        dtype = self.dtype or (torch.float64 if A.dtype == torch.float64 else torch.float32)
        device = self.device if self.device is not None else A.device
        return A.to(device=device, dtype=dtype)

    def _check_fitted(self):
        if getattr(self, "components_", None) is None:
            raise ValueError(f"{type(self).__name__}: not fitted yet; call fit(A) first")

    def _check_size(self, A: torch.Tensor):
        rows, d = A.reshape(-1, A.shape[-1]).shape
        if self.n_concepts > min(rows, d):
            raise ValueError(
                f"n_concepts: expected at most min(rows, d) = min({rows}, {d}) = {min(rows, d)} concepts "
                f"for activations of shape {tuple(A.shape)}, got {self.n_concepts}"
            )
        if self.gram_weight > 0 and A.ndim != 3:
            raise ValueError(
                f"A: gram_weight > 0 needs per-image Grams, i.e. A of shape (images, N, d); got {tuple(A.shape)}"
            )

    def _initialize(self, X: torch.Tensor) -> torch.Tensor:
        k = self.n_concepts
        if self.init == "random":
            gen = torch.Generator().manual_seed(int(self.random_state))
            scale = math.sqrt(float(X.abs().mean()) / k)
            return (torch.randn(X.shape[0], k, generator=gen, dtype=torch.float64).abs() * scale).to(X)
        if self.init == "kmeans":
            return _kmeans_codes(X, k, int(self.random_state))
        r = k - 1 if self.init == "svd" else k
        M = self._top_scores(X, r)  # scores P S of the top-r singular directions, (rows, r) float64
        if self.init == "svd":
            # U = [M + 1 mᵀ, 1] ≥ 0 and W = [Q, −Q m] reproduce the rank-(k−1) SVD exactly
            shift = (-M.min(0).values).clamp(min=0) if r > 0 else M.new_zeros(0)
            scale = float(shift.max()) if r > 0 and float(shift.max()) > 0 else 1.0
            U = torch.cat([M + shift, torch.full((X.shape[0], 1), scale, dtype=M.dtype, device=M.device)], 1)
            return U.to(X.dtype)
        # nndsvd-like: the dominant signed part of each score vector; "nndsvda" fills the zeros with the mean
        pos, neg = M.clamp(min=0), (-M).clamp(min=0)
        U = torch.where(pos.norm(dim=0) >= neg.norm(dim=0), pos, neg)
        mean = float(U.mean()) if float(U.mean()) > 0 else 1.0
        if self.init == "nndsvda":
            return torch.where(U > 0, U, torch.full_like(U, mean)).to(X.dtype)
        return (U + 1e-3 * mean).to(X.dtype)

    def _top_scores(self, X: torch.Tensor, r: int) -> torch.Tensor:
        """Scores ``A Q_r`` on the top-r right singular vectors (deterministic signs), float64.

        Exact (eigh of AᵀA) for ``init="svd"`` or when r is not small against d; otherwise a seeded
        randomized range finder (Halko, Martinsson & Tropp 2011; one power iteration), which costs a few
        (rows × d × r) products instead of the (rows × d × d) covariance.
        """
        d = X.shape[1]
        if r == 0:
            return torch.zeros(X.shape[0], 0, dtype=torch.float64, device=X.device)
        if self.init == "svd" or 2 * (r + 10) > d:
            evals, evecs = torch.linalg.eigh((X.T @ X).double())
            Q = evecs[:, evals.argsort(descending=True)[:r]]
        else:
            gen = torch.Generator().manual_seed(int(self.random_state))
            omega = torch.randn(d, r + 10, generator=gen, dtype=torch.float64).to(device=X.device, dtype=X.dtype)
            Y = torch.linalg.qr((X @ omega).double()).Q.to(X.dtype)
            Z = torch.linalg.qr((X.T @ Y).double()).Q.to(X.dtype)
            Y = torch.linalg.qr((X @ Z).double()).Q
            B = Y.to(X.dtype).T @ X
            Q = torch.linalg.svd(B.double(), full_matrices=False).Vh[:r].T
        Q = Q * torch.where(Q.sum(0) < 0, -1.0, 1.0).to(Q)
        return (X @ Q.to(X.dtype)).double()

    def _losses(self, X, U, W, shape, a2, G=None, g2=None):
        """(L_rec, L_gram) for rows X ≈ U Wᵀ; L_gram is NaN for row data."""
        H = U @ W.T
        rec = float((X - H).square().sum(dtype=torch.float64)) / a2
        if len(shape) != 3:
            return rec, float("nan")
        gl, _ = _gram_loss_grad(X.reshape(shape), H.reshape(shape), G=G, g2=g2)
        return rec, float(gl.mean())

    def _quick_losses(self, X, U, W, shape, a2, G=None, g2=None, UtA=None):
        """(L_rec, L_gram) without forming Â: ‖A − UWᵀ‖² = ‖A‖² − 2⟨UᵀA, Wᵀ⟩ + ⟨UᵀU, WᵀW⟩ and Ĝ_i = U_i WᵀW U_iᵀ."""
        UtA = U.T @ X if UtA is None else UtA
        WtW = W.T @ W
        rec = a2 - 2 * float((UtA.double() * W.T.double()).sum()) + float(((U.T @ U).double() * WtW.double()).sum())
        rec = max(rec, 0.0) / a2
        if len(shape) != 3:
            return rec, float("nan")
        if G is None:  # N > d: the d×d route of the exact loss
            return rec, self._losses(X, U, W, shape, a2, G, g2)[1]
        U3 = U.reshape(*shape[:-1], U.shape[-1])
        Gh = U3 @ WtW @ U3.transpose(-1, -2)
        diff = (G - Gh).square().sum((-1, -2), dtype=torch.float64)
        return rec, float((diff / g2).mean())

    def _grams(self, X, shape):
        """Per-image Grams ``G_i = A_i A_iᵀ`` (N×N) and ``‖G_i‖²_F`` (float64); (None, None) for row data."""
        if len(shape) != 3:
            return None, None
        A3 = X.reshape(shape)
        G = A3 @ A3.transpose(-1, -2)
        g2 = G.square().sum((-1, -2), dtype=torch.float64)
        if bool((g2 == 0).any()):
            raise ValueError("A: an image has all-zero activations, so its Gram loss is undefined")
        return G, g2

    # The joint objective in k dimensions: with Â = U Wᵀ, ‖A − Â‖² = ‖A‖² − 2⟨U, AW⟩ + ⟨UᵀU, WᵀW⟩ and
    # Ĝ_i = U_i (WᵀW) U_iᵀ, so line searches never form Â; only AW (after a dictionary step) and AᵀU
    # (after a code step) touch the activations.
    def _gram_part(self, U, WtW, shape, G, g2):
        U3 = U.reshape(*shape[:-1], U.shape[-1])
        D = U3 @ WtW @ U3.transpose(-1, -2) - G
        return U3, D, D.square().sum((-1, -2), dtype=torch.float64) / g2

    def _J_codes(self, U, AW, WtW, shape, a2, G, g2):
        """(J, L_rec, L_gram, D) for codes U with the dictionary fixed (AW = A W)."""
        UtU = U.T @ U
        rec = (a2 - 2 * float((U * AW).sum(dtype=torch.float64)) + float((UtU.double() * WtW.double()).sum())) / a2
        U3, D, gl = self._gram_part(U, WtW, shape, G, g2)
        gl = float(gl.mean())
        return rec + self.gram_weight * gl, rec, gl, D

    def _J_dict(self, W, U, UtU, AtU, shape, a2, G, g2):
        """(J, L_rec, L_gram, D, WᵀW) for a dictionary W with the codes fixed (AtU = Aᵀ U)."""
        WtW = W.T @ W
        rec = (a2 - 2 * float((AtU.double() * W.double()).sum()) + float((UtU.double() * WtW.double()).sum())) / a2
        U3, D, gl = self._gram_part(U, WtW, shape, G, g2)
        gl = float(gl.mean())
        return rec + self.gram_weight * gl, rec, gl, D, WtW

    def _refine(self, X, U, W, shape, a2, G, g2, iters, update_dictionary, record=None, desc="refine"):
        """Projected gradient with backtracking on J = L_rec + μ L_gram (monotone), U kept ≥ 0.

        ∂J/∂U_i = (2/‖A‖²)(U_i WᵀW − A_i W) + (4μ/B) D_i U_i WᵀW / ‖G_i‖², and
        ∂J/∂W = (2/‖A‖²)(W UᵀU − AᵀU) + (4μ/B) W Σ_i U_iᵀ D_i U_i / ‖G_i‖², with D_i = Ĝ_i − G_i.
        """
        mu, B = self.gram_weight, shape[0]
        WtW = W.T @ W
        AW = X @ W
        UtU = U.T @ U
        AtU = X.T @ U if update_dictionary else None
        tU = a2 / (2.0 * float(torch.linalg.eigvalsh(WtW.double()).max()) + 1e-30)
        tW = a2 / (2.0 * float(torch.linalg.eigvalsh(UtU.double()).max()) + 1e-30)
        g2w = g2.to(X.dtype)[:, None, None]
        for _ in tqdm(range(iters), desc=desc, disable=not self.verbose, leave=False):
            moved = False
            if update_dictionary:
                J, rec, gl, D, _ = self._J_dict(W, U, UtU, AtU, shape, a2, G, g2)
                U3 = U.reshape(*shape[:-1], U.shape[-1])
                S = (U3.transpose(-1, -2) @ (D / g2w) @ U3).sum(0)
                gW = (2.0 / a2) * (W @ UtU - AtU) + (4.0 * mu / B) * (W @ S)
                gnorm2 = float(gW.square().sum(dtype=torch.float64))
                for _ in range(40):
                    W_new = W - tW * gW
                    J_new, _, _, _, WtW_new = self._J_dict(W_new, U, UtU, AtU, shape, a2, G, g2)
                    if J_new <= J - 0.5 * tW * gnorm2:
                        W, WtW, moved = W_new, WtW_new, True
                        AW = X @ W
                        tW *= 1.5
                        break
                    tW *= 0.5
            J, rec, gl, D = self._J_codes(U, AW, WtW, shape, a2, G, g2)
            U3 = U.reshape(*shape[:-1], U.shape[-1])
            gU = (2.0 / a2) * (U @ WtW - AW) + (4.0 * mu / B) * ((D / g2w) @ U3 @ WtW).reshape(U.shape)
            for _ in range(40):
                U_new = (U - tU * gU).clamp(min=0)
                step = U_new - U
                model = J + float((gU * step).sum(dtype=torch.float64)) + float(step.square().sum(dtype=torch.float64)) / (2 * tU)
                J_new, rec_new, gl_new, _ = self._J_codes(U_new, AW, WtW, shape, a2, G, g2)
                if J_new <= model:
                    U, moved = U_new, True
                    J, rec, gl = J_new, rec_new, gl_new
                    UtU = U.T @ U
                    if update_dictionary:
                        AtU = X.T @ U
                    tU *= 1.5
                    break
                tU *= 0.5
            if record is not None:
                record(desc, rec, gl, J)
            if not moved:
                break
        return U, W

    def _encode(self, X, W, shape, a2, G, g2, record=None, U0=None):
        U = nnls_codes(X, W, U0=U0, tol=self.encode_tol)
        if self.gram_weight > 0 and len(shape) == 3 and self.refine_iter > 0:
            U, _ = self._refine(X, U, W, shape, a2, G, g2, self.refine_iter, update_dictionary=False,
                                record=record, desc="encode")
        return U

    # ---------------------------------------------------------------- public API
    def fit(self, A, y=None) -> SemiNMF:
        """Fit concepts to activations ``A`` of shape ``(rows, d)`` or ``(images, N, d)``."""
        A = self._prepare(A)
        self._check_size(A)
        shape = tuple(A.shape)
        X = A.reshape(-1, shape[-1])
        a2 = float(X.square().sum(dtype=torch.float64))
        if a2 == 0:
            raise ValueError("A: all activations are zero; there is nothing to factorize")
        G, g2 = self._grams(X, shape)
        hist = {"phase": [], "rec_loss": [], "gram_loss": [], "objective": []}

        def record(phase, rec, gl, J=None):
            hist["phase"].append(phase)
            hist["rec_loss"].append(rec)
            hist["gram_loss"].append(gl)
            hist["objective"].append(rec + self.gram_weight * gl if J is None else J)

        U = self._initialize(X).clone()
        UtA, UtU = U.T @ X, U.T @ U
        W = _solve_dictionary(UtA, UtU, X.dtype)
        record("init", *self._quick_losses(X, U, W, shape, a2, G, g2, UtA=UtA))
        prev = float("inf")
        n_iter = 0
        chunk = max(256, (1 << 20) // max(1, X.shape[1]))  # ~4 MB of float32 activations per chunk
        for it in tqdm(range(self.max_iter), desc="Semi-NMF", disable=not self.verbose):
            W = _solve_dictionary(UtA, UtU, X.dtype)
            UtA, UtU, dot = _mu_pass(X, U, W, chunk)
            # ‖A − UWᵀ‖² = ‖A‖² − 2⟨AW, U⟩ + ⟨UᵀU, WᵀW⟩ without forming Â (float64 sums)
            obj = a2 - 2 * dot + float((UtU.double() * (W.T @ W).double()).sum())
            hist["phase"].append("mu")
            hist["rec_loss"].append(max(obj, 0.0) / a2)
            hist["gram_loss"].append(float("nan"))
            hist["objective"].append(float("nan"))
            n_iter = it + 1
            if self.tol > 0 and prev - obj <= self.tol * a2:
                break
            prev = obj
        W = _solve_dictionary(UtA, UtU, X.dtype)
        record("mu-end", *self._quick_losses(X, U, W, shape, a2, G, g2, UtA=UtA))
        for i in range(len(hist["objective"])):
            if hist["phase"][i] == "mu":
                hist["objective"][i] = hist["rec_loss"][i]
        if self.gram_weight > 0 and self.refine_iter > 0:
            U, W = self._refine(X, U, W, shape, a2, G, g2, self.refine_iter, update_dictionary=True, record=record)
        # codes_ come from exactly the procedure transform() runs on the stored dictionary (NNLS from the
        # cold start — faster than from the MU codes, whose tiny non-zeros coordinate descent must undo —
        # then for μ > 0 the code-only refinement)
        W = W.T.contiguous().T
        U = self._encode(X, W, shape, a2, G, g2)
        record("final", *self._losses(X, U, W, shape, a2, G, g2))  # exact (no cancellation) for the result
        self._finish(X, U, W, shape, hist, n_iter, a2)
        return self

    def _finish(self, X, U, W, shape, hist, n_iter, a2):
        self.components_ = W.T.contiguous()
        self.codes_ = U.reshape(*shape[:-1], self.n_concepts)
        self.history_ = hist
        self.n_iter_ = n_iter
        self.n_features_in_ = shape[-1]
        self.reconstruction_err_ = math.sqrt(hist["rec_loss"][-1] * a2)

    @classmethod
    def from_components(cls, components, gram_weight: float = 0.0, **kwargs) -> "SemiNMF":
        """An estimator with a given dictionary ``(k, d)`` (for :meth:`transform` on new activations)."""
        comps = _check_tensor(components, "components", (2,))
        est = cls(comps.shape[0], gram_weight=gram_weight, **kwargs)
        est.components_ = comps.clone()
        est.n_features_in_ = comps.shape[1]
        est.codes_ = None
        est.history_ = None
        return est

    def transform(self, A) -> torch.Tensor:
        """Codes ``U ≥ 0`` of new activations with the dictionary fixed (same procedure that produced ``codes_``)."""
        self._check_fitted()
        A = self._prepare(A)
        if A.shape[-1] != self.n_features_in_:
            raise ValueError(f"A: expected {self.n_features_in_} features (last dim), got {A.shape[-1]}")
        if self.gram_weight > 0 and A.ndim != 3:
            raise ValueError(f"A: gram_weight > 0 needs A of shape (images, N, d); got {tuple(A.shape)}")
        shape = tuple(A.shape)
        X = A.reshape(-1, shape[-1])
        a2 = float(X.square().sum(dtype=torch.float64))
        W = self.components_.to(X).T
        G, g2 = self._grams(X, shape) if self.gram_weight > 0 else (None, None)
        U = self._encode(X, W, shape, max(a2, 1e-300), G, g2)
        return U.reshape(*shape[:-1], self.n_concepts)

    def fit_transform(self, A, y=None) -> torch.Tensor:
        """``fit(A)`` then return ``codes_``."""
        return self.fit(A).codes_

    def inverse_transform(self, U) -> torch.Tensor:
        """Reconstruction ``Â = U Wᵀ`` from codes ``(..., k)``."""
        self._check_fitted()
        U = _check_tensor(U, "U", (2, 3))
        if U.shape[-1] != self.n_concepts:
            raise ValueError(f"U: expected {self.n_concepts} concepts (last dim), got {U.shape[-1]}")
        return U @ self.components_.to(U)

    def reconstruct(self, A) -> torch.Tensor:
        """``Â = transform(A) Wᵀ``."""
        return self.inverse_transform(self.transform(A))


def _takes_index(fn) -> bool:
    import inspect

    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        return False
    return len(params) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


class ClassifierSupervisedSemiNMF(SemiNMF):
    """Classifier-supervised concepts (FACE-like baseline): Semi-NMF refined on ``L_rec + λ·KL(σ(g(A)) ‖ σ(g(Â)))``.

    ``fit(A, suffix)`` takes activations ``(images, N, d)`` and a callable ``suffix`` mapping a chunk
    of patch activations to logits ``(chunk, classes)`` — ``suffix(patches)`` or, when it accepts a
    second argument, ``suffix(patches, index)`` with ``index`` the slice of the chunk's images in ``A``
    (the remaining blocks and the head, see :func:`hf_tdiag.probes.concept_fidelity.suffix_runner`). After the plain Semi-NMF MU phase,
    ``supervised_iter`` Adam steps (U projected back to ≥ 0) back-propagate through the suffix.
    ``lr`` is relative to the mean magnitude of each factor. ``history_`` adds ``kl`` per step;
    ``start_components_`` is the plain Semi-NMF dictionary the supervised steps started from.
    """

    def __init__(self, n_concepts: int, kl_weight: float = 1.0, supervised_iter: int = 100, lr: float = 0.01,
                 batch_size: int = 64, **kwargs):
        kwargs.setdefault("gram_weight", 0.0)
        super().__init__(n_concepts, **kwargs)
        if not math.isfinite(float(kl_weight)) or kl_weight < 0:
            raise ValueError(f"kl_weight: expected a finite number >= 0, got {kl_weight!r}")
        if isinstance(supervised_iter, bool) or not isinstance(supervised_iter, int) or supervised_iter < 0:
            raise ValueError(f"supervised_iter: expected an int >= 0, got {supervised_iter!r}")
        if not lr > 0:
            raise ValueError(f"lr: expected a positive number, got {lr!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        self.kl_weight = float(kl_weight)
        self.supervised_iter = supervised_iter
        self.lr = float(lr)
        self.batch_size = batch_size

    def fit(self, A, suffix: Callable[[torch.Tensor], torch.Tensor] | None = None, y=None):
        """Fit on activations ``(images, N, d)`` supervised by ``suffix(patches) -> logits``."""
        if not callable(suffix):
            raise TypeError(f"suffix: expected a callable mapping (images, N, d) activations to logits, got {type(suffix).__name__}")
        A = _check_tensor(A, "A", (3,))
        plain = SemiNMF(self.n_concepts, gram_weight=0.0, max_iter=self.max_iter, refine_iter=0, tol=self.tol,
                        init=self.init, encode_tol=self.encode_tol, device=self.device, dtype=self.dtype,
                        random_state=self.random_state, verbose=self.verbose).fit(A)
        A = self._prepare(A)
        shape = tuple(A.shape)
        X = A.reshape(-1, shape[-1])
        a2 = float(X.square().sum(dtype=torch.float64))
        hist = {k: list(v) for k, v in plain.history_.items()}
        hist["kl"] = [float("nan")] * len(hist["phase"])
        B = shape[0]
        with torch.no_grad():
            target = torch.cat([self._logits(suffix, A[i : i + self.batch_size], slice(i, i + self.batch_size)) for i in range(0, B, self.batch_size)])
        if target.ndim != 2 or target.shape[0] != B:
            raise ValueError(f"suffix: expected logits of shape ({B}, classes), got {tuple(target.shape)}")
        logp = torch.log_softmax(target.double(), -1)
        self.start_components_ = plain.components_.clone()
        U = plain.codes_.reshape(-1, self.n_concepts).to(X).clone().requires_grad_(True)
        W = plain.components_.T.to(X).clone().requires_grad_(True)
        opt = torch.optim.Adam(
            [
                {"params": [U], "lr": self.lr * max(float(U.detach().abs().mean()), 1e-12)},
                {"params": [W], "lr": self.lr * max(float(W.detach().abs().mean()), 1e-12)},
            ]
        )
        for _ in tqdm(range(self.supervised_iter), desc="supervised", disable=not self.verbose):
            opt.zero_grad(set_to_none=True)
            gU = torch.zeros_like(U)
            gW = torch.zeros_like(W)
            rec_sum, kl_sum = 0.0, 0.0
            U3 = U.view(*shape[:-1], self.n_concepts)
            for i in range(0, B, self.batch_size):
                Ub = U3[i : i + self.batch_size]
                H = Ub @ W.T
                rec = (H - A[i : i + self.batch_size]).square().sum() / a2
                lq = torch.log_softmax(self._logits(suffix, H, slice(i, i + self.batch_size)).double(), -1)
                lp = logp[i : i + self.batch_size]
                kl = (lp.exp() * (lp - lq)).sum()
                loss = rec + (self.kl_weight / B) * kl.to(rec.dtype)
                g1, g2_ = torch.autograd.grad(loss, [U, W])
                gU += g1
                gW += g2_
                rec_sum += float(rec.detach())
                kl_sum += float(kl.detach())
            U.grad, W.grad = gU, gW
            opt.step()
            with torch.no_grad():
                U.clamp_(min=0)
            hist["phase"].append("supervised")
            hist["rec_loss"].append(rec_sum)
            hist["gram_loss"].append(float("nan"))
            hist["kl"].append(kl_sum / B)
            hist["objective"].append(rec_sum + self.kl_weight * kl_sum / B)
        U, W = U.detach(), W.detach()
        G, g2 = self._grams(X, shape)
        rec, gl = self._losses(X, U, W, shape, a2, G, g2)
        hist["phase"].append("final")
        hist["rec_loss"].append(rec)
        hist["gram_loss"].append(gl)
        hist["kl"].append(float("nan"))
        hist["objective"].append(float("nan"))
        self._finish(X, U, W, shape, hist, plain.n_iter_, a2)
        return self

    @staticmethod
    def _logits(suffix, patches, index: slice):
        out = suffix(patches, index) if _takes_index(suffix) else suffix(patches)
        if hasattr(out, "logits"):
            out = out.logits
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"suffix: expected it to return a logits tensor, got {type(out).__name__}")
        return out
