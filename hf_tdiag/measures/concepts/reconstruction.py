"""A concept estimator from a fixed map ``A -> Â``: its codes are the reconstruction itself (nothing to fit)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..._validation import check_tensor


class Reconstruction:
    """``transform(A) = fn(A)``, ``inverse_transform(U) = U``: any reconstruction as a fitted estimator.

    For scoring a reconstruction that no dictionary produced (the exact one, a perturbed one, another method's) with
    ``concept_fidelity(..., concepts=Reconstruction(fn))``. ``fn`` must return a tensor of ``A``'s shape.

    Examples:
        >>> import torch
        >>> from hf_tdiag.measures.concepts import Reconstruction
        >>> A = torch.ones(2, 3, 4)
        >>> est = Reconstruction(lambda A: 0.5 * A)
        >>> float(est.inverse_transform(est.transform(A)).sum()), est.__sklearn_is_fitted__()
        (12.0, True)
    """

    n_concepts = None
    gram_weight = None

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        if not callable(fn):
            raise TypeError(f"fn: expected a callable A -> A_hat, got {type(fn).__name__}")
        self.fn = fn

    def __sklearn_is_fitted__(self) -> bool:
        return True

    def fit(self, A, y=None) -> Reconstruction:
        """Nothing to fit."""
        return self

    def transform(self, A) -> torch.Tensor:
        """``fn(A)``, checked to be a tensor of ``A``'s shape."""
        A = check_tensor(A, "A", ndim=(2, 3), allow_numpy=True)
        A_hat = self.fn(A)
        if not isinstance(A_hat, torch.Tensor) or A_hat.shape != A.shape:
            got = tuple(A_hat.shape) if isinstance(A_hat, torch.Tensor) else type(A_hat).__name__
            raise ValueError(f"fn: expected fn(A) to return a tensor of shape {tuple(A.shape)}, got {got}")
        return A_hat

    def inverse_transform(self, U) -> torch.Tensor:
        """The codes are the reconstruction: ``U`` itself."""
        return U
