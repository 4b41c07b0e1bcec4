"""Classifier-supervised concepts (FACE-like baseline): Semi-NMF refined on ``L_rec + λ·KL`` through the suffix."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from ..._progress import tqdm
from ..._validation import check_tensor, non_negative_float, non_negative_int, positive_float, positive_int
from .joint import grams, losses
from .semi_nmf import SemiNMF


def _takes_index(fn) -> bool:
    """Whether ``fn`` accepts a second positional argument (the chunk's image index)."""
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
    except (TypeError, ValueError):
        return False
    return len(params) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


def _logits(suffix, patches, index: slice):
    """``suffix(patches[, index])`` as a logits tensor (a ``.logits`` attribute is unwrapped)."""
    out = suffix(patches, index) if _takes_index(suffix) else suffix(patches)
    if hasattr(out, "logits"):
        out = out.logits
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"suffix: expected it to return a logits tensor, got {type(out).__name__}")
    return out


class ClassifierSupervisedSemiNMF(SemiNMF):
    """Classifier-supervised concepts (FACE-like baseline): Semi-NMF refined on ``L_rec + λ·KL(σ(g(A)) ‖ σ(g(Â)))``.

    ``fit(A, suffix)`` takes activations ``(images, N, d)`` and a callable ``suffix`` mapping a chunk
    of patch activations to logits ``(chunk, classes)`` — ``suffix(patches)`` or, when it accepts a
    second argument, ``suffix(patches, index)`` with ``index`` the slice of the chunk's images in ``A``
    (the remaining blocks and the head, see :func:`hf_tdiag.probes.concept_model.suffix_runner`). After the plain Semi-NMF MU phase,
    ``supervised_iter`` Adam steps (U projected back to ≥ 0) back-propagate through the suffix.
    ``lr`` is relative to the mean magnitude of each factor. ``history_`` adds ``kl`` per step;
    ``start_components_`` is the plain Semi-NMF dictionary the supervised steps started from.
    """

    def __init__(
        self,
        n_concepts: int,
        kl_weight: float = 1.0,
        supervised_iter: int = 100,
        lr: float = 0.01,
        batch_size: int = 64,
        **kwargs,
    ):
        kwargs.setdefault("gram_weight", 0.0)
        super().__init__(n_concepts, **kwargs)
        non_negative_float(kl_weight, "kl_weight")
        non_negative_int(supervised_iter, "supervised_iter")
        positive_float(lr, "lr")
        positive_int(batch_size, "batch_size")
        self.kl_weight = float(kl_weight)
        self.supervised_iter = supervised_iter
        self.lr = float(lr)
        self.batch_size = batch_size

    def fit(self, A, suffix: Callable[[torch.Tensor], torch.Tensor] | None = None, y=None):
        """Fit on activations ``(images, N, d)`` supervised by ``suffix(patches) -> logits``."""
        if not callable(suffix):
            raise TypeError(
                f"suffix: expected a callable mapping (images, N, d) activations to logits, got {type(suffix).__name__}"
            )
        A = check_tensor(A, "A", ndim=(3,), allow_numpy=True)
        plain = SemiNMF(
            self.n_concepts,
            gram_weight=0.0,
            max_iter=self.max_iter,
            refine_iter=0,
            tol=self.tol,
            init=self.init,
            encode_tol=self.encode_tol,
            device=self.device,
            dtype=self.dtype,
            random_state=self.random_state,
            verbose=self.verbose,
        ).fit(A)
        A = self._prepare(A)
        shape = tuple(A.shape)
        X = A.reshape(-1, shape[-1])
        a2 = float(X.square().sum(dtype=torch.float64))
        hist = {k: list(v) for k, v in plain.history_.items()}
        hist["kl"] = [float("nan")] * len(hist["phase"])
        logp = self._target_log_probs(A, suffix)
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
            rec_sum, kl_sum = self._adam_step(opt, U, W, A, logp, suffix, a2)
            hist["phase"].append("supervised")
            hist["rec_loss"].append(rec_sum)
            hist["gram_loss"].append(float("nan"))
            hist["kl"].append(kl_sum / shape[0])
            hist["objective"].append(rec_sum + self.kl_weight * kl_sum / shape[0])
        U, W = U.detach(), W.detach()
        G, g2 = grams(X, shape)
        rec, gl = losses(X, U, W, shape, a2, G, g2)
        for key, value in (
            ("phase", "final"),
            ("rec_loss", rec),
            ("gram_loss", gl),
            ("kl", float("nan")),
            ("objective", float("nan")),
        ):
            hist[key].append(value)
        self._finish(U, W, shape, hist, plain.n_iter_, a2)
        return self

    def _target_log_probs(self, A, suffix):
        """``log σ(g(A))`` of the unreplaced activations (float64), checked to be ``(images, classes)``."""
        B = A.shape[0]
        with torch.no_grad():
            target = torch.cat(
                [
                    _logits(suffix, A[i : i + self.batch_size], slice(i, i + self.batch_size))
                    for i in range(0, B, self.batch_size)
                ]
            )
        if target.ndim != 2 or target.shape[0] != B:
            raise ValueError(f"suffix: expected logits of shape ({B}, classes), got {tuple(target.shape)}")
        return torch.log_softmax(target.double(), -1)

    def _adam_step(self, opt, U, W, A, logp, suffix, a2):
        """One Adam step on ``L_rec + (λ/B) Σ_i KL_i`` accumulated over image chunks, then U ← max(U, 0).

        Returns (L_rec summed over chunks, Σ_i KL_i).
        """
        B = A.shape[0]
        opt.zero_grad(set_to_none=True)
        gU = torch.zeros_like(U)
        gW = torch.zeros_like(W)
        rec_sum, kl_sum = 0.0, 0.0
        U3 = U.view(*A.shape[:-1], self.n_concepts)
        for i in range(0, B, self.batch_size):
            idx = slice(i, i + self.batch_size)
            H = U3[idx] @ W.T
            rec = (H - A[idx]).square().sum() / a2
            lq = torch.log_softmax(_logits(suffix, H, idx).double(), -1)
            lp = logp[idx]
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
        return rec_sum, kl_sum
