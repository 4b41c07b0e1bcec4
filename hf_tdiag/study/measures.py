"""The study's measures of one trained model: which ones, with which settings, and computing them all.

The math lives in :mod:`hf_tdiag.measures` (complexity, sharpness) and the tensors come
from :mod:`hf_tdiag.probes` (weights, SRR); this module only wires them for an image
classifier and its training examples.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._caller_state import module_modes, restore_modes

__all__ = ["MEASURES", "MeasureSettings", "compute_measures", "jiang_weight_matrices"]

# measure name -> what it is; the order is the table's order. Names and definitions are Jiang et al.'s (2020).
MEASURES: dict[str, str] = {
    "srr_mean": "SRR, mean over layers (training data)",
    "srr_last": "SRR at the last layer (training data)",
    "l2": "‖w‖²₂: squared Frobenius norms of the weight matrices, each parameter once",
    "log_prod_of_spec": "log Π_i ‖W_i‖²₂ over the linear maps the forward applies",
    "sum_of_spec": "d·(Π_i ‖W_i‖²₂)^{1/d} over the same d maps",
    "inverse_margin": "1/γ², γ = 10th-percentile output margin (training data)",
    "sharpness_mag": "1/α′², PGD in |u_i| ≤ α′(|w_i| + ε) drops training accuracy by 0.1",
    "pacbayes_flatness": "1/σ′², u ~ N(0, σ′²I) drops mean training accuracy by 0.1",
    "pacbayes_flatness_mag": "1/σ′², u_i ~ N(0, σ′²w_i² + ε²) drops mean training accuracy by 0.1",
}


@dataclass
class MeasureSettings:
    """How the measures are computed on each trained model (all on the training data)."""

    max_examples: int = 512  # training examples for SRR and the margin
    flatness_examples: int = 128  # the first of them, for the flatness searches (cost: draws x steps forwards)
    batch_size: int = 256
    srr_eps: float = 0.1
    srr_lambda: float = 1.0
    margin_quantile: float = 0.1
    flatness_target: float = 0.1  # the accuracy drop the flatness searches aim at (Jiang et al.)
    flatness_tolerance: float = 0.01
    flatness_depth: int = 15  # bisection steps at most
    flatness_upper: float = 2.0  # search interval [0, upper] for alpha' and sigma'
    magnitude_eps: float = 1e-3
    sharpness_steps: int = 10  # PGD steps per alpha
    pac_draws: int = 64  # noise draws per sigma: the seed moves 1/sigma'^2 by < 10% (CV over 8 seeds, measured)
    seed: int = 0


def _finite_or_none(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


class _Collector:
    """``values`` and ``errors`` of the measures: a measure that raises or is not finite is ``None`` with a reason."""

    def __init__(self):
        self.values: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.details: dict[str, dict] = {}

    def attempt(self, name: str, fn: Callable[[], Any]) -> None:
        try:
            value = fn()
            if isinstance(value, dict):  # a search result: the measure is its "flatness", the rest are details
                self.details[name] = {k: v for k, v in value.items() if k != "flatness"}
                value = value["flatness"]
            self.values[name] = _finite_or_none(value)
            if self.values[name] is None:
                self.errors[name] = "not finite"
        except (ValueError, RuntimeError) as err:
            self.values[name] = None
            self.errors[name] = f"{type(err).__name__}: {err}"


def _srr_columns(out: _Collector, model, x, settings: MeasureSettings, progress: bool) -> None:
    """``srr_mean`` / ``srr_last`` and the per-layer SRR curve (kept for plots, not ranked)."""
    from ..diagnostics.srr import layer_srr

    try:
        report = layer_srr(
            model,
            x,
            batch_size=settings.batch_size,
            eps=settings.srr_eps,
            lam=settings.srr_lambda,
            include_mid=False,
            progress=progress,
        )
        per_layer = [float(v) for v in report.per_layer("srr")]  # block outputs Z^1..Z^L
    except (ValueError, RuntimeError) as err:
        out.values["srr_mean"] = out.values["srr_last"] = None
        out.errors["srr_mean"] = out.errors["srr_last"] = f"{type(err).__name__}: {err}"
        return
    out.values["srr_mean"] = _finite_or_none(sum(per_layer) / len(per_layer))
    out.values["srr_last"] = _finite_or_none(per_layer[-1])
    out.values["_srr_per_layer"] = per_layer


def jiang_weight_matrices(model) -> tuple[dict, dict]:
    """(the linear maps for the spectral measures, the weight parameters for ``l2``) of a model.

    Maps: every weight matrix the forward applies (for CRATE per block Uᵀ, the output
    matrix — W, or U/−U/Uᵀ for the tied variants — and the ISTA dictionary D, plus the
    patch projection and the classifier), from :func:`hf_tdiag.probes.weights.weight_matrices`.
    ``l2`` takes the trainable ones among them, each parameter tensor once (w is a
    parameter vector: a tied output matrix is not a second copy of U).
    """
    from ..probes import weights as wprobe

    maps = wprobe.weight_matrices(model)
    param_ids = {id(p) for p in model.parameters() if p.requires_grad}
    seen, params = set(), {}
    for name, w in maps.items():
        if id(w) in param_ids and id(w) not in seen:
            seen.add(id(w))
            params[name] = w
    return maps, params


def _weight_columns(out: _Collector, model) -> None:
    """The norm-based measures of the weights."""
    from ..measures import complexity

    maps, params = jiang_weight_matrices(model)
    out.attempt("l2", lambda: complexity.l2(params))
    out.attempt("log_prod_of_spec", lambda: complexity.log_prod_of_spec(maps))
    out.attempt("sum_of_spec", lambda: complexity.sum_of_spec(maps))


def _flatness_columns(out: _Collector, model, params, batches, settings: MeasureSettings, progress: bool) -> None:
    """Jiang et al.'s flatness measures: perturbation scales at which the training accuracy drops by the target."""
    from ..measures import sharpness as sharp

    def logits_fn(x):
        return model(pixel_values=x).logits.float()

    search = dict(
        target=settings.flatness_target,
        tolerance=settings.flatness_tolerance,
        depth=settings.flatness_depth,
        progress=progress,
    )
    out.attempt(
        "sharpness_mag",
        lambda: sharp.sharpness_mag(
            logits_fn,
            params,
            batches,
            eps=settings.magnitude_eps,
            alpha_max=settings.flatness_upper,
            steps=settings.sharpness_steps,
            **search,
        ),
    )
    out.attempt(
        "pacbayes_flatness",
        lambda: sharp.pacbayes_flatness(
            logits_fn,
            params,
            batches,
            draws=settings.pac_draws,
            sigma_max=settings.flatness_upper,
            seed=settings.seed,
            **search,
        ),
    )
    out.attempt(
        "pacbayes_flatness_mag",
        lambda: sharp.pacbayes_flatness_mag(
            logits_fn,
            params,
            batches,
            eps=settings.magnitude_eps,
            draws=settings.pac_draws,
            sigma_max=settings.flatness_upper,
            seed=settings.seed,
            **search,
        ),
    )


def _check_examples(pixel_values, labels):
    import torch

    if not isinstance(pixel_values, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError("pixel_values, labels: expected torch.Tensors")
    if pixel_values.shape[0] != labels.shape[0]:
        raise ValueError(f"labels: expected {pixel_values.shape[0]} labels for the images, got {labels.shape[0]}")


def compute_measures(
    model,
    pixel_values,
    labels,
    settings: MeasureSettings | None = None,
    progress: bool = False,
    details: dict | None = None,
) -> tuple[dict[str, float | None], dict[str, str]]:
    """All measures of :data:`MEASURES` for a trained image classifier on (a subset of) its training data.

    Returns ``(values, errors)``: a measure that is undefined for this model (e.g. the
    inverse margin when ≥10% of the examples are misclassified) is ``None`` in
    ``values`` and its reason is in ``errors``. ``values["_srr_per_layer"]`` is the
    per-layer SRR curve (for plots; not a ranked measure). A dict passed as ``details``
    receives each search's outcome (α′ or σ′, whether the accuracy target was met,
    the unperturbed accuracy, the number of evaluations).
    """
    import torch

    from ..measures import complexity
    from ..probes import weights as wprobe

    settings = settings or MeasureSettings()
    _check_examples(pixel_values, labels)
    n = min(settings.max_examples, pixel_values.shape[0])
    device = next(model.parameters()).device
    x, y = pixel_values[:n].to(device), labels[:n].to(device)
    saved_modes = module_modes(model)
    model.eval()
    out = _Collector()
    try:
        _srr_columns(out, model, x, settings, progress)
        params = list(wprobe.trainable_parameters(model).values())
        _weight_columns(out, model)
        with torch.no_grad():
            logits = torch.cat(
                [model(pixel_values=x[i : i + settings.batch_size]).logits for i in range(0, n, settings.batch_size)]
            )
        out.attempt("inverse_margin", lambda: complexity.inverse_margin(logits, y, quantile=settings.margin_quantile))
        m = min(n, settings.flatness_examples)
        xm, ym = x[:m], y[:m]  # the first flatness_examples, also when m is not a multiple of the batch size
        flat = [
            (xm[i : i + settings.batch_size], ym[i : i + settings.batch_size]) for i in range(0, m, settings.batch_size)
        ]
        _flatness_columns(out, model, params, flat, settings, progress)
    finally:
        restore_modes(saved_modes)
    if details is not None:
        details.update(out.details)
    return out.values, out.errors
