"""What a number means beside its value: the sample count and interval of an estimate from samples, and the labels
of results that cannot be read as measurements (``vacuous`` bounds, ``degenerate`` proxies) with their reason.

One rule each, used by the report classes' ``summary()``, the HTML report, the Space and the evaluate modules:

* an accuracy-like share ``k/n`` carries the Wilson score interval (95%) of the true share;
* a mean over ``n`` samples carries the normal-approximation interval ``mean ± 1.96 s/√n`` (``s`` with ``n − 1``);
* a KL bound is **vacuous** when it is above ``log C`` (``C`` classes, or the vocabulary of a language model): the
  KL from any prediction ``p`` to the uniform guess ``u`` is ``KL(p‖u) = log C − H(p) ≤ log C``, so a bound at
  least ``log C`` also admits a reconstruction whose predictions say nothing about the input;
* a Schatten proxy is **degenerate** when ``p_opt = 0`` for every matrix (``SchattenReport.degenerate``):
  ``B_Schatten = Σ_W √(rank(W)·N) + √L`` then counts ranks and shapes and ignores every singular value.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: two-sided 95% intervals


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a share ``successes / n`` (``successes`` may be a count or ``share * n``)."""
    if n <= 0:
        raise ValueError(f"n: expected a positive number of samples, got {n}")
    p = float(successes) / n
    if not 0.0 <= p <= 1.0 + 1e-12:
        raise ValueError(f"successes: expected a count between 0 and n = {n}, got {successes}")
    p = min(p, 1.0)
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(mean: float, std: float, n: int, *, ddof: int = 0, z: float = Z95) -> tuple[float, float] | None:
    """``mean ± z s/√n`` with ``s`` the sample standard deviation (``std`` computed with ``ddof``); None for n < 2."""
    if n < 2 or not (math.isfinite(mean) and math.isfinite(std)):
        return None
    s = std * math.sqrt((n - ddof) / (n - 1))
    half = z * s / math.sqrt(n)
    return mean - half, mean + half


def kl_bound_vacuous(bound: float | None, num_classes: int | None) -> bool | None:
    """True when the KL bound exceeds ``log(num_classes)``; None when either is unknown (or C < 2)."""
    if bound is None or num_classes is None or num_classes < 2 or not isinstance(bound, (int, float)):
        return None
    return not bound <= math.log(num_classes)  # an infinite or NaN bound is vacuous too


def kl_vacuous_reason(bound: float, num_classes: int) -> str:
    """One line: why a KL bound of ``bound`` over ``num_classes`` classes says nothing."""
    return (
        f"vacuous: the bound {bound:.3g} is above log C = {math.log(num_classes):.3g} ({num_classes} classes), the "
        "largest KL from any prediction to the uniform guess, so it does not rule out losing every prediction"
    )


#: the KL bounds of a concept-fidelity report that :func:`concept_bound_flags` labels
CONCEPT_BOUNDS = ("bound_certified", "bound_certified_chain", "bound_estimated")


def concept_bound_flags(report, num_classes: int | None) -> dict[str, str]:
    """``{bound name: reason}`` for each KL bound of a concept-fidelity report (one layer's mapping) that is
    vacuous over ``num_classes`` classes; empty when none is (or ``num_classes`` is unknown)."""
    out = {}
    for key in CONCEPT_BOUNDS:
        bound = report.get(key)
        if kl_bound_vacuous(bound, num_classes):
            out[key] = kl_vacuous_reason(float(bound), int(num_classes))
    return out


def concept_intervals(report) -> dict[str, list[float]]:
    """95% intervals of a concept-fidelity report's mean KL (over its inputs) and top-1 agreement (Wilson)."""
    out = {}
    kl = list((report.get("per_image") or {}).get("kl") or [])
    if len(kl) >= 2:
        mean = sum(kl) / len(kl)
        std = math.sqrt(sum((v - mean) ** 2 for v in kl) / (len(kl) - 1))
        out["kl"] = list(mean_interval(mean, std, len(kl), ddof=1))
    n = report.get("n_images")
    if n and report.get("top1_agreement") is not None:
        out["top1_agreement"] = list(wilson_interval(round(float(report["top1_agreement"]) * n), int(n)))
    return out


def degenerate_reason(num_matrices: int) -> str:
    """One line: why a Schatten proxy with p_opt = 0 for every matrix is a rank count."""
    return (
        f"degenerate: p_opt = 0 for all {num_matrices} matrices, so B_Schatten = Σ_W √(rank(W)·N) + √L counts ranks and "
        "shapes and ignores the singular values"
    )


def count_text(n: int, units: str) -> str:
    """``"n = 64 images"``: a sample count with what was counted."""
    return f"n = {n:,} {units}"


__all__ = [
    "CONCEPT_BOUNDS",
    "Z95",
    "concept_bound_flags",
    "concept_intervals",
    "count_text",
    "degenerate_reason",
    "kl_bound_vacuous",
    "kl_vacuous_reason",
    "mean_interval",
    "wilson_interval",
]
