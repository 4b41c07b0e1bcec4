"""The Semi-NMF concept estimator ``A ≈ U Wᵀ`` (U ≥ 0), optionally Gram-aligned, scikit-learn style."""

from __future__ import annotations

import math

import torch

from ..._progress import tqdm
from ..._validation import check_tensor, non_negative_float, non_negative_int, positive_int
from .init import INITS, initial_codes
from .joint import grams, losses, quick_losses, refine
from .nnls import nnls_codes
from .updates import mu_pass, solve_dictionary


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
        positive_int(n_concepts, "n_concepts")
        non_negative_float(gram_weight, "gram_weight")
        non_negative_int(max_iter, "max_iter")
        non_negative_int(refine_iter, "refine_iter")
        if init not in INITS:
            raise ValueError(f"init: expected one of {INITS}, got {init!r}")
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
        A = check_tensor(A, name, ndim=(2, 3), allow_numpy=True)
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

    def _encode(self, X, W, shape, a2, G, g2, record=None, U0=None):
        """NNLS codes for the dictionary W, then (μ > 0, per-image data) the code-only refinement."""
        U = nnls_codes(X, W, U0=U0, tol=self.encode_tol)
        if self.gram_weight > 0 and len(shape) == 3 and self.refine_iter > 0:
            U, _ = refine(
                X,
                U,
                W,
                shape,
                a2,
                G,
                g2,
                self.refine_iter,
                self.gram_weight,
                update_dictionary=False,
                record=record,
                desc="encode",
                verbose=self.verbose,
            )
        return U

    def _mu_phase(self, X, U, UtA, UtU, a2, hist):
        """``max_iter`` alternations of the exact dictionary step and the MU code step (U updated in place).

        Returns ``(UᵀA, UᵀU, iterations run)``; appends each iteration's L_rec to ``hist`` (phase "mu").
        """
        prev = float("inf")
        n_iter = 0
        chunk = max(256, (1 << 20) // max(1, X.shape[1]))  # ~4 MB of float32 activations per chunk
        for it in tqdm(range(self.max_iter), desc="Semi-NMF", disable=not self.verbose):
            W = solve_dictionary(UtA, UtU, X.dtype)
            UtA, UtU, dot = mu_pass(X, U, W, chunk)
            # ‖A − UWᵀ‖² = ‖A‖² − 2⟨AW, U⟩ + ⟨UᵀU, WᵀW⟩ without forming Â (float64 sums)
            obj = a2 - 2 * dot + float((UtU.double() * (W.T @ W).double()).sum())
            hist["phase"].append("mu")
            hist["rec_loss"].append(max(obj, 0.0) / a2)
            hist["gram_loss"].append(float("nan"))
            hist["objective"].append(max(obj, 0.0) / a2)
            n_iter = it + 1
            if self.tol > 0 and prev - obj <= self.tol * a2:
                break
            prev = obj
        return UtA, UtU, n_iter

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
        G, g2 = grams(X, shape)
        hist = {"phase": [], "rec_loss": [], "gram_loss": [], "objective": []}

        def record(phase, rec, gl, J=None):
            if J is None:  # J = L_rec + μ·L_gram; μ = 0 (always so for row data, whose L_gram is NaN) leaves L_rec
                J = rec + self.gram_weight * gl if self.gram_weight > 0 else rec
            hist["phase"].append(phase)
            hist["rec_loss"].append(rec)
            hist["gram_loss"].append(gl)
            hist["objective"].append(J)

        U = initial_codes(X, self.n_concepts, self.init, self.random_state).clone()
        UtA, UtU = U.T @ X, U.T @ U
        W = solve_dictionary(UtA, UtU, X.dtype)
        record("init", *quick_losses(X, U, W, shape, a2, G, g2, UtA=UtA))
        UtA, UtU, n_iter = self._mu_phase(X, U, UtA, UtU, a2, hist)
        W = solve_dictionary(UtA, UtU, X.dtype)
        record("mu-end", *quick_losses(X, U, W, shape, a2, G, g2, UtA=UtA))
        if self.gram_weight > 0 and self.refine_iter > 0:
            U, W = refine(
                X,
                U,
                W,
                shape,
                a2,
                G,
                g2,
                self.refine_iter,
                self.gram_weight,
                update_dictionary=True,
                record=record,
                verbose=self.verbose,
            )
        # codes_ come from exactly the procedure transform() runs on the stored dictionary (NNLS from the
        # cold start — faster than from the MU codes, whose tiny non-zeros coordinate descent must undo —
        # then for μ > 0 the code-only refinement)
        W = W.T.contiguous().T
        U = self._encode(X, W, shape, a2, G, g2)
        record("final", *losses(X, U, W, shape, a2, G, g2))  # exact (no cancellation) for the result
        self._finish(U, W, shape, hist, n_iter, a2)
        return self

    def _finish(self, U, W, shape, hist, n_iter, a2):
        self.components_ = W.T.contiguous()
        self.codes_ = U.reshape(*shape[:-1], self.n_concepts)
        self.history_ = hist
        self.n_iter_ = n_iter
        self.n_features_in_ = shape[-1]
        self.reconstruction_err_ = math.sqrt(hist["rec_loss"][-1] * a2)

    @classmethod
    def from_components(cls, components, gram_weight: float = 0.0, **kwargs) -> SemiNMF:
        """An estimator with a given dictionary ``(k, d)`` (for :meth:`transform` on new activations)."""
        comps = check_tensor(components, "components", ndim=(2,), allow_numpy=True)
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
        G, g2 = grams(X, shape) if self.gram_weight > 0 else (None, None)
        U = self._encode(X, W, shape, max(a2, 1e-300), G, g2)
        return U.reshape(*shape[:-1], self.n_concepts)

    def fit_transform(self, A, y=None) -> torch.Tensor:
        """``fit(A)`` then return ``codes_``."""
        return self.fit(A).codes_

    def inverse_transform(self, U) -> torch.Tensor:
        """Reconstruction ``Â = U Wᵀ`` from codes ``(..., k)``."""
        self._check_fitted()
        U = check_tensor(U, "U", ndim=(2, 3), allow_numpy=True)
        if U.shape[-1] != self.n_concepts:
            raise ValueError(f"U: expected {self.n_concepts} concepts (last dim), got {U.shape[-1]}")
        return U @ self.components_.to(U)

    def reconstruct(self, A) -> torch.Tensor:
        """``Â = transform(A) Wᵀ``."""
        return self.inverse_transform(self.transform(A))
