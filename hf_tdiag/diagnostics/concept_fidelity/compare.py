"""Plain, Gram-aligned and classifier-supervised concepts at one layer, side by side (:func:`compare_concepts`):
each fitted on the same activations and scored with :func:`~hf_tdiag.diagnostics.concept_fidelity.layer.fidelity_at_layer`."""

from __future__ import annotations

import time

from ..._caller_state import module_modes, restore_modes
from ...measures.concepts import ClassifierSupervisedSemiNMF, SemiNMF, match_concepts
from ...probes.concept_model import ConceptModel, check_layer, layer_activations, suffix_runner
from ..settings import ConceptFidelitySettings
from .estimator import ACCEPTED, as_estimator, is_fitted
from .fidelity import DEFAULT_N_CONCEPTS
from .inputs import prepare_inputs
from .layer import fidelity_at_layer


def supervised_concepts(
    model,
    inputs,
    layer: int,
    n_concepts: int,
    *,
    kl_weight: float = 1.0,
    batch_size: int = 64,
    cm: ConceptModel | None = None,
    **kwargs,
):
    """Fit classifier-supervised concepts at layer ℓ (``L_rec + λ·KL`` through the suffix; FACE-like baseline)."""
    if cm is None:
        cm, inputs, _ = prepare_inputs(model, inputs, batch_size=batch_size)
    layer = check_layer(cm, layer)
    acts = layer_activations(model, inputs, layer, batch_size=batch_size, cm=cm)
    est = ClassifierSupervisedSemiNMF(n_concepts, kl_weight=kl_weight, batch_size=batch_size, **kwargs)
    suffix = suffix_runner(model, layer, acts.frame, cm, positions=acts.positions)
    was_training = module_modes(model)  # every submodule's flag
    model.eval()
    try:
        est.fit(acts.patches, suffix)
    finally:
        restore_modes(was_training)
    return est


def _agreement(estimators) -> dict:
    """Hungarian-matched cosine of each dictionary to the supervised one, and the cosine of their refinement moves."""
    ref = estimators["supervised"].components_
    # every fit shares the deterministic start and MU phase, so the refinements can be compared as moves
    # away from the plain Semi-NMF dictionary: cosine of vec(W_fit − W_MU) and vec(W_sup − W_MU)
    base = estimators["supervised"].start_components_
    agreement = {}
    for label, est in estimators.items():
        if label == "supervised" or getattr(est, "components_", None) is None:
            continue  # the reference itself, or a given estimator without a dictionary
        m = match_concepts(est.components_, ref)
        agreement[label] = {
            "mean_cosine": m["mean_cosine"],
            "cosine": [float(c) for c in m["cosine"]],
            "pairs": [[int(a), int(b)] for a, b in zip(m["rows"], m["cols"])],
        }
        d_fit = (est.components_ - base.to(est.components_)).flatten().double()
        d_sup = (ref - base.to(ref)).flatten().double()
        denom = float(d_fit.norm() * d_sup.norm())
        agreement[label]["update_cosine"] = float(d_fit @ d_sup) / denom if denom > 0 else None
    return agreement


def _table_row(label, rep, agreement):
    return {
        "method": label,
        "gram_weight": rep["gram_weight"],
        "kl": rep["kl"],
        "top1_agreement": rep["top1_agreement"],
        "delta_rec_rel": rep["delta_rec_rel"],
        "delta_gram": rep["delta_gram"],
        "bound_certified": rep.get("bound_certified"),
        "bound_estimated": rep.get("bound_estimated"),
        "frac_kl_below_bound_estimated": rep.get("frac_kl_below_bound_estimated"),
        "fit_seconds": rep["fit_seconds"],
        "cosine_to_supervised": agreement.get(label, {}).get("mean_cosine", 1.0 if label == "supervised" else None),
        "update_cosine_to_supervised": agreement.get(label, {}).get("update_cosine"),
    }


def _count_and_given(concepts) -> tuple:
    """``(k, given estimator or None)``: an int is k; an estimator is scored as the run ``"given"`` and its
    ``n_concepts`` is k for the other fits."""
    if isinstance(concepts, int) and not isinstance(concepts, bool):
        return as_estimator(concepts).n_concepts, None
    est = as_estimator(concepts)
    k = getattr(est, "n_concepts", None)
    if not isinstance(k, int) or isinstance(k, bool):
        raise TypeError(f"concepts: expected {ACCEPTED} with an int n_concepts, got {type(est).__name__}")
    return k, est


def _fit(est, acts):
    """``est`` fitted on the layer's activations (``fit``, else ``fit_transform``)."""
    if callable(getattr(est, "fit", None)):
        est.fit(acts.patches)
    else:
        est.fit_transform(acts.patches)
    return est


def _timed(fit) -> tuple:
    t0 = time.perf_counter()
    est = fit()
    return est, time.perf_counter() - t0


def _fits(model, inputs, layer, k, cm, acts, given, options) -> tuple:
    """``({label: fitted estimator}, {label: seconds})``: one Semi-NMF per μ, the given estimator, the supervised fit."""
    estimators, times = {}, {}
    max_iter, progress = options["max_iter"], options["progress"]
    for mu in options["gram_weights"]:
        label = "plain" if float(mu) == 0 else f"gram(mu={float(mu):g})"
        semi = SemiNMF(
            k, gram_weight=float(mu), max_iter=max_iter, refine_iter=options["refine_iter"], verbose=progress
        )
        estimators[label], times[label] = _timed(lambda semi=semi: semi.fit(acts.patches))
    if given is not None:
        estimators["given"], times["given"] = (given, 0.0) if is_fitted(given) else _timed(lambda: _fit(given, acts))
    if options["supervised"]:
        estimators["supervised"], times["supervised"] = _timed(
            lambda: supervised_concepts(
                model,
                inputs,
                layer,
                k,
                kl_weight=options["kl_weight"],
                batch_size=options["batch_size"],
                cm=cm,
                supervised_iter=options["supervised_iter"],
                max_iter=max_iter,
                verbose=progress,
            )
        )
    return estimators, times


def _runs(cm, acts, layer, estimators, times, scoring) -> dict:
    """Each estimator's :func:`fidelity_at_layer` report, with its fit time and loss history."""
    runs = {}
    for label, est in estimators.items():
        rep = fidelity_at_layer(cm, acts, layer, est, **scoring)
        rep["fit_seconds"] = times[label]
        history = getattr(est, "history_", None)
        rep["history"] = {k: list(v) for k, v in history.items()} if history else None
        runs[label] = rep
    return runs


def compare_concepts(
    model,
    inputs,
    layer: int,
    concepts=DEFAULT_N_CONCEPTS,
    *,
    gram_weights=(0.0, 1.0),
    supervised: bool = True,
    kl_weight: float = 10.0,
    max_iter: int = 200,
    refine_iter: int = 100,
    supervised_iter: int = 100,
    bounds: bool = ConceptFidelitySettings.bounds,
    power_iters: int = ConceptFidelitySettings.power_iters,
    max_images_for_constants: int = ConceptFidelitySettings.max_images_for_constants,
    batch_size: int = ConceptFidelitySettings.batch_size,
    progress: bool = True,
    **input_options,
) -> dict:
    """Plain / Gram-aligned (each μ in ``gram_weights``) / classifier-supervised concepts at layer ℓ, side by side.

    ``concepts``: the number of concepts k of every fit (an int), or a concept estimator
    (:mod:`~hf_tdiag.diagnostics.concept_fidelity.estimator`; fitted here if it is not) scored beside them as the run
    ``"given"``, its ``n_concepts`` the k of the other fits.

    Returns ``runs`` (label -> :func:`concept_fidelity` report, plus fit time and loss history),
    ``agreement`` (Hungarian-matched cosine similarity of each dictionary to the supervised one, and
    ``update_cosine``: cosine between the refinement moves ``W − W_MU`` of the fit and of the supervised fit,
    all fits sharing the same plain Semi-NMF start ``W_MU``),
    ``table`` (one row per run) and ``estimators`` (label -> fitted estimator). ``input_options`` (tokenizer,
    max_tokens, labels, head, n_clusters) are those of :func:`concept_fidelity`.
    """
    if not gram_weights and not supervised:
        raise ValueError("gram_weights: expected at least one μ (or supervised=True)")
    k, given = _count_and_given(concepts)
    cm, inputs, head_info = prepare_inputs(model, inputs, batch_size=batch_size, **input_options)
    layer = check_layer(cm, layer)
    acts = layer_activations(model, inputs, layer, batch_size=batch_size, cm=cm)
    options = dict(gram_weights=gram_weights, supervised=supervised, kl_weight=kl_weight, max_iter=max_iter)
    options.update(refine_iter=refine_iter, supervised_iter=supervised_iter, batch_size=batch_size, progress=progress)
    estimators, times = _fits(model, inputs, layer, k, cm, acts, given, options)
    scoring = dict(bounds=bounds, power_iters=power_iters, max_images_for_constants=max_images_for_constants)
    scoring.update(batch_size=batch_size, progress=progress)
    runs = _runs(cm, acts, layer, estimators, times, scoring)
    agreement = _agreement(estimators) if supervised else {}
    return {
        "layer": layer,
        "n_concepts": k,
        "kl_weight": kl_weight if supervised else None,
        "runs": runs,
        "agreement": agreement,
        "table": [_table_row(label, rep, agreement) for label, rep in runs.items()],
        "estimators": estimators,
        "grid": cm.grid,
        "head": head_info,
    }


def mu_sweep_rows(runs) -> list[dict]:
    """The Gram-weight sweep of :func:`compare_concepts`' ``runs`` (every run but the supervised one): μ,
    δ_gram, the KL and δ_rec/‖A‖, one dict per run, as :func:`hf_tdiag.viz.concept_fidelity.plot_mu_sweep` draws them."""
    keys = ("gram_weight", "delta_gram", "kl", "delta_rec_rel")
    return [{key: run[key] for key in keys} for label, run in runs.items() if label != "supervised"]


__all__ = ["compare_concepts", "mu_sweep_rows", "supervised_concepts"]
