"""How much the seed moves the Monte-Carlo flatness measures: their coefficient of variation over seeds.

``pacbayes_flatness`` and ``pacbayes_flatness_mag`` average the accuracy over random
weight-noise draws; the seed picks the draws, so 1/σ′² is itself random. The
study's default number of draws is chosen so that the seed moves it by < 10%
(CV over 8 seeds); this module measures that. ``sharpness_mag`` draws no random
numbers (PGD from u = 0): its CV is 0 by construction.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .._caller_state import module_modes, restore_modes
from .._validation import integer
from .measures import MeasureSettings

__all__ = ["seed_stability"]


def _cv(values: Sequence[float]) -> dict:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"values": list(values), "mean": mean, "std": std, "cv": std / mean if mean else None}


def seed_stability(
    model,
    pixel_values,
    labels,
    settings: MeasureSettings | None = None,
    seeds: int = 8,
    draws: Sequence[int] = (10,),
    progress: bool = False,
) -> dict:
    """``{measure: {draws: {"values", "mean", "std" (sample), "cv"}}}`` of the PAC-Bayes flatness measures over
    ``seeds`` seeds (0 … seeds−1), for each number of noise draws in ``draws``."""
    from ..measures import sharpness as sharp
    from ..probes import weights as wprobe

    settings = settings or MeasureSettings()
    integer(seeds, "seeds", low=2)
    n = min(settings.max_examples, settings.flatness_examples, pixel_values.shape[0])
    x, y = pixel_values[:n], labels[:n]
    batches = [
        (x[i : i + settings.batch_size], y[i : i + settings.batch_size]) for i in range(0, n, settings.batch_size)
    ]
    params = list(wprobe.trainable_parameters(model).values())
    saved_modes = module_modes(model)
    model.eval()

    def logits_fn(inputs):
        return model(pixel_values=inputs).logits.float()

    search = dict(
        target=settings.flatness_target,
        tolerance=settings.flatness_tolerance,
        depth=settings.flatness_depth,
        sigma_max=settings.flatness_upper,
        progress=progress,
    )
    runs = {
        "pacbayes_flatness": lambda d, s: sharp.pacbayes_flatness(
            logits_fn, params, batches, draws=d, seed=s, **search
        ),
        "pacbayes_flatness_mag": lambda d, s: sharp.pacbayes_flatness_mag(
            logits_fn, params, batches, eps=settings.magnitude_eps, draws=d, seed=s, **search
        ),
    }
    out: dict = {}
    try:
        for name, fn in runs.items():
            out[name] = {int(d): _cv([fn(int(d), s)["flatness"] for s in range(seeds)]) for d in draws}
    finally:
        restore_modes(saved_modes)
    return out
