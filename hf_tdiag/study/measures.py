"""The study's measures of one trained model: which ones, with which settings, and computing them all.

The math lives in :mod:`hf_tdiag.measures` (complexity, sharpness) and the tensors come
from :mod:`hf_tdiag.probes` (weights, SRR); this module only wires them for an image
classifier and its training examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["MEASURES", "MeasureSettings", "compute_measures"]

# measure name -> what it is; the order is the table's order
MEASURES: dict[str, str] = {
    "srr_mean": "SRR, mean over layers (training data)",
    "srr_last": "SRR at the last layer (training data)",
    "l2_norm": "ℓ2 norm of all parameters",
    "path_norm": "path-norm: squared-weight forward of an all-ones input",
    "sum_spectral": "Σ spectral norms of the weight matrices",
    "log_prod_spectral": "log Π spectral norms of the weight matrices",
    "inverse_margin": "1/γ², γ = 10th-percentile output margin (training data)",
    "sharpness": "worst-case loss increase in a relative ρ-box (projected ascent)",
    "pac_bayes_flatness": "1/σ², σ = largest Gaussian weight noise keeping the loss increase ≤ threshold",
}


@dataclass
class MeasureSettings:
    """How the measures are computed on each trained model (all on the training data)."""

    max_examples: int = 512  # training examples used for SRR and the margin
    batch_size: int = 128
    srr_eps: float = 0.1
    srr_lambda: float = 1.0
    sharpness_rho: float = 0.01
    sharpness_steps: int = 5
    sharpness_batches: int = 2
    pac_threshold: float = 0.1
    pac_samples: int = 3
    pac_iters: int = 10
    margin_quantile: float = 0.1
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

    def attempt(self, name: str, fn: Callable[[], Any]) -> None:
        try:
            self.values[name] = _finite_or_none(fn())
            if self.values[name] is None:
                self.errors[name] = "not finite"
        except (ValueError, RuntimeError) as err:
            self.values[name] = None
            self.errors[name] = f"{type(err).__name__}: {err}"


def _srr_columns(out: _Collector, model, x, settings: MeasureSettings, progress: bool) -> None:
    """``srr_mean`` / ``srr_last`` and the per-layer SRR curve (kept for plots, not ranked)."""
    from ..probes.srr import layer_srr

    try:
        report = layer_srr(
            model, x, batch_size=settings.batch_size, eps=settings.srr_eps, lam=settings.srr_lambda,
            include_mid=False, progress=progress,
        )
        per_layer = [float(v) for v in report.per_layer("srr")]  # block outputs Z^1..Z^L
    except (ValueError, RuntimeError) as err:
        out.values["srr_mean"] = out.values["srr_last"] = None
        out.errors["srr_mean"] = out.errors["srr_last"] = f"{type(err).__name__}: {err}"
        return
    out.values["srr_mean"] = _finite_or_none(sum(per_layer) / len(per_layer))
    out.values["srr_last"] = _finite_or_none(per_layer[-1])
    out.values["_srr_per_layer"] = per_layer


def _weight_columns(out: _Collector, model, x, params) -> None:
    """The norm-based measures of the weights."""
    from ..measures import complexity
    from ..probes import weights as wprobe

    mats = wprobe.weight_matrices(model)
    out.attempt("l2_norm", lambda: complexity.l2_norm(params))
    out.attempt("path_norm", lambda: wprobe.path_norm(model, {"pixel_values": x[:1]}))
    out.attempt("sum_spectral", lambda: complexity.sum_spectral_norm(mats))
    out.attempt("log_prod_spectral", lambda: complexity.log_prod_spectral_norm(mats))


def _flatness_columns(out: _Collector, model, params, batches, settings: MeasureSettings, progress: bool) -> None:
    """Sharpness and PAC-Bayes flatness of the cross-entropy on the first training batches."""
    from torch.nn import functional as F

    from ..measures import sharpness as sharp

    def loss_fn(batch):
        return F.cross_entropy(model(pixel_values=batch[0]).logits.float(), batch[1])

    sb = batches[: settings.sharpness_batches]
    out.attempt(
        "sharpness",
        lambda: sharp.sharpness(loss_fn, params, sb, rho=settings.sharpness_rho, steps=settings.sharpness_steps, progress=progress),
    )
    out.attempt(
        "pac_bayes_flatness",
        lambda: sharp.pac_bayes_flatness(
            loss_fn, params, sb, threshold=settings.pac_threshold, samples=settings.pac_samples,
            iters=settings.pac_iters, seed=settings.seed, progress=progress,
        )["flatness"],
    )


def _check_examples(pixel_values, labels):
    import torch

    if not isinstance(pixel_values, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError("pixel_values, labels: expected torch.Tensors")
    if pixel_values.shape[0] != labels.shape[0]:
        raise ValueError(f"labels: expected {pixel_values.shape[0]} labels for the images, got {labels.shape[0]}")


def compute_measures(
    model, pixel_values, labels, settings: MeasureSettings | None = None, progress: bool = False
) -> tuple[dict[str, float | None], dict[str, str]]:
    """All measures of :data:`MEASURES` for a trained image classifier on (a subset of) its training data.

    Returns ``(values, errors)``: a measure that is undefined for this model (e.g. the
    inverse margin when ≥10% of the examples are misclassified) is ``None`` in
    ``values`` and its reason is in ``errors``.
    """
    import torch

    from ..measures import complexity
    from ..probes import weights as wprobe

    settings = settings or MeasureSettings()
    _check_examples(pixel_values, labels)
    n = min(settings.max_examples, pixel_values.shape[0])
    device = next(model.parameters()).device
    x, y = pixel_values[:n].to(device), labels[:n].to(device)
    batches = [(x[i : i + settings.batch_size], y[i : i + settings.batch_size]) for i in range(0, n, settings.batch_size)]
    was_training = model.training
    model.eval()
    out = _Collector()
    try:
        _srr_columns(out, model, x, settings, progress)
        params = list(wprobe.trainable_parameters(model).values())
        _weight_columns(out, model, x, params)
        with torch.no_grad():
            logits = torch.cat([model(pixel_values=bx).logits for bx, _ in batches])
        out.attempt("inverse_margin", lambda: complexity.inverse_margin(logits, y, quantile=settings.margin_quantile))
        _flatness_columns(out, model, params, batches, settings, progress)
    finally:
        model.train(was_training)
    per_layer = out.values.pop("_srr_per_layer", None)
    if per_layer is not None:
        out.values["_srr_per_layer"] = per_layer  # kept for plots; not a ranked measure (last key, as before)
    return out.values, out.errors
