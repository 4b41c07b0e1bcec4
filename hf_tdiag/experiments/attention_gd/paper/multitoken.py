"""Figs 10 and 13: multi-token selection with the concave head ``h(u) = vᵀu − λ‖u‖²`` on orthonormal tokens.

With orthonormal tokens ``‖Xᵀs‖² = ‖s‖²``, so GD (labels +1, logistic loss) drives the softmax towards the
maximiser of ``Σ_t s_t γ_t − λ Σ_t s_t²`` over the simplex: water-filling, ``s_t = max(0, (γ_t − μ)/(2λ))``.
Its support size (:func:`waterfill_support`) is the number of tokens GD should select — one at ``λ = 0``,
more as ``λ`` grows. Fig. 10 (λ): random orthonormal tokens and unit ``v`` (the authors' λ setting).
Fig. 13 (τ): scores planted so that τ tokens lead (in [0.8, 1]) and the rest trail (in [−1, 0]); the
selection then stays within the τ leaders for the λ values used. Reported per setting: the selected-set
sizes (``s ≥ 1e-3``), the water-filling prediction, and the correlation of GD's ``W`` with the SVM
equivalence ``W_fin + R·W_dir`` (``W_fin`` alone when nothing is masked).
"""

from __future__ import annotations

import torch

from ....measures.attention_svm import gen_svm_finite_part, matrix_correlation
from ..data import make_orthonormal_data, stack_data
from ..gen_svm import gen_svm_excluded, gen_svm_fit
from ..heads import LambdaHead
from ..train import train_attention_batch

__all__ = ["waterfill_support", "run_multitoken_lambda", "run_multitoken_tau"]


def waterfill_support(scores: torch.Tensor, lam: float) -> torch.Tensor:
    """Support size of ``argmax_{s ∈ simplex} Σ s_t γ_t − λ Σ s_t²`` per row of ``scores (…, T)`` (1 at λ = 0)."""
    g = scores.sort(-1, descending=True).values
    if lam == 0:
        return torch.ones(g.shape[:-1], dtype=torch.long)
    k = torch.arange(1, g.shape[-1] + 1, dtype=g.dtype)
    mu = (g.cumsum(-1) - 2 * lam) / k  # threshold if the top k tokens are the support
    return (g > mu).sum(-1)  # water-filling: the top k with γ_(k) > μ_k form the support


def _fit_correlation(data, W: torch.Tensor, low: float, high: float):
    """``(reason or None, correlation with the SVM equivalence, selected sizes)`` for one run."""
    logp = torch.log_softmax(torch.einsum("ntd,de,ne->nt", data.X, W, data.z), -1)
    probs = logp.exp()
    sizes = (probs >= high).sum(-1)
    reason = gen_svm_excluded(probs, low=low, high=high)
    if reason == "ambiguous":
        return reason, None, sizes
    if reason == "finite":  # nothing masked: GD converges to a finite W, predicted by W_fin alone
        W_fin = gen_svm_finite_part(data.X, data.z, probs >= high, logp)
        return None, matrix_correlation(W, W_fin) if float(W_fin.norm()) > 0 else None, sizes
    fit = gen_svm_fit(data.X, data.z, W, threshold=high)
    return None, fit.correlation, sizes


def _train_and_score(data, lam: float, cfg: dict, progress: bool, seed: int) -> dict:
    """Train ``runs`` instances with the λ head and summarise sizes, predictions and correlations."""
    gd = train_attention_batch(
        data,
        param="W",
        steps=cfg["steps"],
        lr=cfg["lr"],
        init=cfg["init"],
        seed=seed,
        head=LambdaHead(data.v, lam),
        record_every=cfg["steps"],
        progress=progress,
    )
    sizes, preds, corrs, dropped = [], [], [], 0
    for r in range(data.X.shape[0]):
        single = data.run(r)
        reason, corr, size = _fit_correlation(single, gd.W[r], cfg["low"], cfg["high"])
        sizes += size.tolist()
        preds += waterfill_support(single.scores, lam).tolist()
        if reason is not None or corr is None:
            dropped += 1
        else:
            corrs.append(corr)
    t = torch.tensor
    return {
        "lam": lam,
        "mean_selected": float(t(sizes, dtype=torch.float64).mean()),
        "max_selected": max(sizes),
        "predicted_mean_selected": float(t(preds, dtype=torch.float64).mean()),
        "agreement_with_prediction": float((t(sizes) == t(preds)).double().mean()),
        "correlation_mean": float(t(corrs, dtype=torch.float64).mean()) if corrs else None,
        "correlation_min": min(corrs) if corrs else None,
        "kept": len(corrs),
        "dropped": dropped,
    }


def run_multitoken_lambda(cfg: dict, progress: bool = False) -> dict:
    """Fig. 10: selected-set size and SVM-equivalence correlation vs λ."""
    data = stack_data(make_orthonormal_data(cfg["n"], cfg["T"], cfg["d"], seed=r) for r in range(cfg["runs"]))
    return {
        "settings": dict(cfg),
        "rows": [_train_and_score(data, lam, cfg, progress, seed=i) for i, lam in enumerate(cfg["lam"])],
    }


def _planted_scores(n: int, T: int, tau: int, top, rest, g) -> torch.Tensor:
    scores = torch.empty(n, T, dtype=torch.float64)
    scores[:, :tau] = top[0] + (top[1] - top[0]) * torch.rand(n, tau, generator=g, dtype=torch.float64)
    scores[:, tau:] = rest[0] + (rest[1] - rest[0]) * torch.rand(n, T - tau, generator=g, dtype=torch.float64)
    perm = torch.stack([torch.randperm(T, generator=g) for _ in range(n)])
    return torch.gather(scores, 1, perm)


def run_multitoken_tau(cfg: dict, progress: bool = False) -> dict:
    """Fig. 13: selected-set sizes against τ (planted leaders) and λ; they should stay ≤ τ."""
    rows = []
    for tau in cfg["tau"]:
        g = torch.Generator().manual_seed(tau)
        data = stack_data(
            make_orthonormal_data(
                cfg["n"],
                cfg["T"],
                cfg["d"],
                _planted_scores(cfg["n"], cfg["T"], tau, cfg["top"], cfg["rest"], g),
                seed=r,
            )
            for r in range(cfg["runs"])
        )
        for lam in cfg["lam"]:
            row = _train_and_score(data, lam, cfg, progress, seed=tau)
            row["tau"] = tau
            row["within_tau"] = row["max_selected"] <= tau
            rows.append(row)
    return {"settings": dict(cfg), "rows": rows}
