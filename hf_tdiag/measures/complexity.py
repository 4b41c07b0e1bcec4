"""Norm- and margin-based complexity measures (Jiang et al. 2020), and the search helpers sharpness uses.

Pure math on tensors someone else extracted: a list of parameter tensors, a
list of weight matrices, or logits with labels. Every value is float64.

Jiang et al.'s definitions, under their names (W_1 … W_d the network's weight
matrices, w all of them as one vector):

- ``l2``: ‖w‖²₂ = Σ_i ‖W_i‖²_F.
- ``log_prod_of_spec``: log Π_i ‖W_i‖²₂.
- ``sum_of_spec``: d·(Π_i ‖W_i‖²₂)^{1/d} (in log space, so it never overflows).

Other forms kept for their own use: ``l2_norm`` (‖w‖₂ of whatever tensors are
given), ``spectral_norms`` / ``sum_spectral_norm`` / ``log_prod_spectral_norm``
(Σ_i ‖W_i‖₂ and log Π_i ‖W_i‖₂).
- ``output_margins`` / ``inverse_margin``: 1/γ² with γ the 10th percentile of
  the output margins f(x)_y − max_{j≠y} f(x)_j.
- ``bisect_largest``, ``project_box``: the bisection and projected-ascent
  primitives of PAC-Bayes flatness and sharpness.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from .._validation import check_tensor, finite_float, positive_int, real

__all__ = [
    "l2",
    "log_prod_of_spec",
    "sum_of_spec",
    "l2_norm",
    "spectral_norms",
    "sum_spectral_norm",
    "log_prod_spectral_norm",
    "output_margins",
    "inverse_margin",
    "bisect_largest",
    "project_box",
]


def _tensor_list(tensors, name: str) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        raise TypeError(f"{name}: expected a sequence (or dict) of tensors, got a single tensor; wrap it in a list")
    if isinstance(tensors, dict):
        items = list(tensors.items())
    elif isinstance(tensors, Iterable):
        items = list(enumerate(tensors))
    else:
        raise TypeError(f"{name}: expected a sequence (or dict) of tensors, got {type(tensors).__name__}")
    if not items:
        raise ValueError(f"{name}: expected at least one tensor, got none")
    for key, t in items:
        check_tensor(t, f"{name}[{key!r}]")
    return [t for _, t in items]


def l2_norm(tensors) -> float:
    """‖w‖₂ = √(Σ_i ‖W_i‖²_F) over all given tensors."""
    ts = _tensor_list(tensors, "tensors")
    total = sum(t.detach().to(torch.float64).pow(2).sum() for t in ts)
    return float(torch.sqrt(total))


def spectral_norms(matrices) -> torch.Tensor:
    """σ_max(W_i) per matrix (tensors with more than 2 dims are read as ``(shape[0], -1)``)."""
    ms = _tensor_list(matrices, "matrices")
    out = []
    for i, m in enumerate(ms):
        if m.ndim < 2:
            raise ValueError(f"matrices[{i}]: expected a matrix (2 or more dims), got shape {tuple(m.shape)}")
        w = m.detach().to(torch.float64).reshape(m.shape[0], -1)
        out.append(torch.linalg.matrix_norm(w, ord=2).cpu())
    return torch.stack(out)


def sum_spectral_norm(matrices) -> float:
    """Σ_i ‖W_i‖₂."""
    return float(spectral_norms(matrices).sum())


def log_prod_spectral_norm(matrices) -> float:
    """log Π_i ‖W_i‖₂ = Σ_i log ‖W_i‖₂ (−inf never: a zero matrix is an error)."""
    norms = spectral_norms(matrices)
    if bool((norms <= 0).any()):
        raise ValueError(
            "matrices: a matrix with zero spectral norm makes the product of spectral norms zero (log undefined)"
        )
    return float(torch.log(norms).sum())


def l2(matrices) -> float:
    """Jiang et al.'s ``l2``: ‖w‖²₂ = Σ_i ‖W_i‖²_F over the weight matrices."""
    ms = _tensor_list(matrices, "matrices")
    return float(sum(m.detach().to(torch.float64).pow(2).sum() for m in ms))


def log_prod_of_spec(matrices) -> float:
    """Jiang et al.'s ``log_prod_of_spec``: log Π_i ‖W_i‖²₂ = 2 Σ_i log ‖W_i‖₂."""
    return 2.0 * log_prod_spectral_norm(matrices)


def sum_of_spec(matrices) -> float:
    """Jiang et al.'s ``sum_of_spec``: d·(Π_i ‖W_i‖²₂)^{1/d} = d·exp(log_prod_of_spec / d), d = number of matrices."""
    d = len(_tensor_list(matrices, "matrices"))
    return d * math.exp(log_prod_of_spec(matrices) / d)


def output_margins(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """γ_i = f(x_i)_{y_i} − max_{j≠y_i} f(x_i)_j, one per example (float64)."""
    check_tensor(logits, "logits")
    if logits.ndim != 2 or logits.shape[1] < 2:
        raise ValueError(f"logits: expected shape (n, num_classes) with num_classes >= 2, got {tuple(logits.shape)}")
    if not isinstance(labels, torch.Tensor) or labels.dtype not in (
        torch.int64,
        torch.int32,
        torch.int16,
        torch.uint8,
        torch.int8,
    ):
        raise TypeError(
            f"labels: expected an integer torch.Tensor, got {getattr(labels, 'dtype', type(labels).__name__)}"
        )
    if labels.shape != logits.shape[:1]:
        raise ValueError(f"labels: expected shape ({logits.shape[0]},) to match logits, got {tuple(labels.shape)}")
    labels = labels.to(device=logits.device, dtype=torch.int64)
    if bool(((labels < 0) | (labels >= logits.shape[1])).any()):
        raise ValueError(f"labels: expected class indices in [0, {logits.shape[1]}), got values outside")
    z = logits.detach().to(torch.float64)
    true = z.gather(1, labels[:, None]).squeeze(1)
    other = z.scatter(1, labels[:, None], float("-inf")).amax(dim=1)
    return true - other


def inverse_margin(logits: torch.Tensor, labels: torch.Tensor, quantile: float = 0.1) -> float:
    """1/γ², γ = the ``quantile`` (10th percentile) of the output margins f(x)_y − max_{j≠y} f(x)_j."""
    quantile = real(quantile, "quantile", low=0, high=1)
    margins = output_margins(logits, labels)
    gamma = float(torch.quantile(margins, float(quantile)))
    if gamma <= 0:
        raise ValueError(
            f"logits: the {quantile:.0%} percentile output margin is {gamma:.4g} <= 0 (the model misclassifies at least "
            f"{quantile:.0%} of the examples), so the inverse margin 1/gamma^2 is undefined"
        )
    return 1.0 / gamma**2


def bisect_largest(
    predicate: Callable[[float], bool], lo: float, hi: float, iters: int = 12, geometric: bool = True
) -> float:
    """Largest x in [lo, hi] with ``predicate(x)`` true, by bisection (on log x if ``geometric``).

    Assumes the predicate is monotone (true below a threshold, false above). Returns
    ``hi`` if ``predicate(hi)`` holds and ``lo`` if even ``predicate(lo)`` fails.
    """
    lo, hi = finite_float(lo, "lo"), finite_float(hi, "hi")
    if not lo < hi:
        raise ValueError(f"lo, hi: expected lo < hi, got lo={lo!r}, hi={hi!r}")
    if geometric and lo <= 0:
        raise ValueError(f"lo: expected lo > 0 for a geometric bisection, got {lo!r}")
    positive_int(iters, "iters")
    if predicate(hi):
        return float(hi)
    if not predicate(lo):
        return float(lo)
    a, b = float(lo), float(hi)  # predicate(a) true, predicate(b) false
    for _ in range(iters):
        mid = math.sqrt(a * b) if geometric else 0.5 * (a + b)
        if predicate(mid):
            a = mid
        else:
            b = mid
    return a


def project_box(delta: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """Projection onto the box {δ : |δ_i| ≤ b_i}: clamp(δ, −b, b)."""
    if not isinstance(delta, torch.Tensor) or not isinstance(bound, torch.Tensor):
        raise TypeError("delta, bound: expected torch.Tensors")
    if delta.shape != bound.shape:
        raise ValueError(f"bound: expected shape {tuple(delta.shape)} to match delta, got {tuple(bound.shape)}")
    if bool((bound < 0).any()):
        raise ValueError("bound: expected non-negative half-widths")
    return torch.maximum(torch.minimum(delta, bound), -bound)
