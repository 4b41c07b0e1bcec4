"""What ``concepts=`` accepts: the number of concepts k (an int) or a concept estimator, and how each gives ``Â``.

**The estimator protocol** (scikit-learn's decomposition interface, on tensors): an object with

* ``transform(A) -> codes`` and ``inverse_transform(codes) -> Â``, ``A`` the layer's concept-token activations
  ``(inputs, N, d)`` and ``Â`` of the same shape;
* ``fit_transform(A) -> codes`` (or ``fit(A)`` then ``transform``), used when it is not fitted yet.

It counts as fitted by scikit-learn's rule: ``__sklearn_is_fitted__()`` where defined, else any public attribute
ending in ``_`` that is not None (``components_`` of a fitted :class:`~hf_tdiag.measures.concepts.SemiNMF`). The
report records its ``n_concepts`` and ``gram_weight`` attributes where it has them. hf_tdiag's
:class:`~hf_tdiag.measures.concepts.SemiNMF` (fitted, unfitted, or ``SemiNMF.from_components(W)`` for a dictionary
``W`` of shape ``(k, d)``), :class:`~hf_tdiag.measures.concepts.ClassifierSupervisedSemiNMF` (fitted) and
:class:`~hf_tdiag.measures.concepts.Reconstruction` (a fixed map ``A -> Â``) follow it.

An int ``k`` is ``SemiNMF(k)``, fitted on the layer's activations. ``concepts=`` and the setting ``n_concepts`` answer
one question: with both given as keywords the call is refused (:func:`check_one_count`); ``concepts=`` given with a
settings object wins over the object's ``n_concepts`` (the report's ``n_concepts`` is the k used).
"""

from __future__ import annotations

import copy

import torch

from ..._validation import positive_int
from ...measures.concepts import SemiNMF

__all__ = ["ACCEPTED", "as_estimator", "check_one_count", "is_fitted", "per_layer", "reconstruction"]

#: the two accepted forms, in words (the TypeError of a bad ``concepts=``)
ACCEPTED = "the number of concepts (an int) or a concept estimator with fit/transform/inverse_transform (a SemiNMF)"


def _is_estimator(obj) -> bool:
    return callable(getattr(obj, "transform", None)) and callable(getattr(obj, "inverse_transform", None))


def as_estimator(concepts):
    """``concepts`` as an estimator: an int k is a fresh ``SemiNMF(k)``; an estimator passes; anything else is a
    one-line TypeError naming ``concepts`` and the two accepted forms."""
    if isinstance(concepts, int) and not isinstance(concepts, bool):
        return SemiNMF(positive_int(concepts, "concepts"))
    if _is_estimator(concepts):
        return concepts
    hint = "; a dictionary tensor (k, d) is SemiNMF.from_components(W)" if isinstance(concepts, torch.Tensor) else ""
    raise TypeError(f"concepts: expected {ACCEPTED}{hint}, got {type(concepts).__name__}")


def is_fitted(estimator) -> bool:
    """scikit-learn's rule: ``__sklearn_is_fitted__()`` where defined, else a public ``<name>_`` attribute not None."""
    if callable(getattr(estimator, "__sklearn_is_fitted__", None)):
        return bool(estimator.__sklearn_is_fitted__())
    return any(k.endswith("_") and not k.startswith("_") and v is not None for k, v in vars(estimator).items())


def reconstruction(estimator, A: torch.Tensor) -> tuple:
    """``(codes, Â)`` of the activations ``A``: encoded by a fitted estimator, fitted on ``A`` first otherwise."""
    if is_fitted(estimator):
        codes = estimator.transform(A)
    elif callable(getattr(estimator, "fit_transform", None)):
        codes = estimator.fit_transform(A)
    else:
        codes = estimator.fit(A).transform(A)
    A_hat = estimator.inverse_transform(codes)
    if not isinstance(A_hat, torch.Tensor) or A_hat.shape != A.shape:
        got = tuple(A_hat.shape) if isinstance(A_hat, torch.Tensor) else type(A_hat).__name__
        raise ValueError(
            f"concepts: inverse_transform(codes) must return a tensor of shape {tuple(A.shape)}, got {got}"
        )
    return codes, A_hat


def per_layer(concepts):
    """A fresh copy of ``concepts`` for each layer of a sweep: an int, or an unfitted estimator (a fitted one holds
    one layer's dictionary and is refused)."""
    if isinstance(concepts, int) and not isinstance(concepts, bool):
        return concepts
    est = as_estimator(concepts)
    if is_fitted(est):
        raise TypeError(
            f"concepts: a layer sweep fits concepts per layer; expected an int or an unfitted estimator, "
            f"got a fitted {type(est).__name__}"
        )
    return copy.deepcopy(est)


def check_one_count(concepts, keywords: dict) -> None:
    """``concepts=`` and the keyword ``n_concepts=`` both given: a TypeError naming both (they answer one question)."""
    if concepts is not None and "n_concepts" in keywords:
        shown = repr(concepts) if isinstance(concepts, int) else f"a {type(concepts).__name__}"
        raise TypeError(
            f"concepts: give concepts= (an int k or an estimator) or n_concepts=, not both "
            f"(got concepts={shown} and n_concepts={keywords['n_concepts']!r})"
        )
