"""One layer's concept-fidelity report from activations already taken at layer ℓ (:func:`fidelity_at_layer`): the
reconstruction ``Â``, the suffix run on ``A`` and on ``Â``, the errors, the empirical KL and (``bounds``) the bound."""

from __future__ import annotations

import torch

from ..._caller_state import module_modes, restore_modes
from ..._progress import tqdm
from ...measures.concepts import fidelity_errors, kl_divergence
from ...probes.concept_model import ConceptModel, LayerActivations, suffix_runner
from ..settings import ConceptFidelitySettings
from .bound import add_bounds, to_list
from .estimator import as_estimator, reconstruction
from .report import ConceptFidelityReport

__all__ = ["fidelity_at_layer"]


def _suffix_logits(cm, acts, layer, A, A_hat, batch_size, progress):
    """Logits of the suffix on ``A`` and on ``Â``; checks that ``A`` reproduces the model's own logits."""
    runner = suffix_runner(cm.model, layer, acts.frame, cm, positions=acts.positions)
    logits_a, logits_h = [], []
    with torch.no_grad():
        for i in tqdm(range(0, A.shape[0], batch_size), desc="suffix", disable=not progress, leave=False):
            idx = slice(i, i + batch_size)
            logits_a.append(runner(A[idx], idx))
            logits_h.append(runner(A_hat[idx], idx))
        logits_a, logits_h = torch.cat(logits_a), torch.cat(logits_h)
        reference = acts.logits if acts.logits is not None else cm.head(acts.features)
    tol = 1e-3 * max(1.0, float(reference.abs().max()))
    if float((logits_a - reference).abs().max()) > tol:
        raise ValueError(
            f"model: re-running blocks {layer + 1}..{cm.num_layers} and the head does not reproduce the logits of "
            f"{type(cm.model).__name__}; its forward is not a layout this probe supports"
        )
    return logits_a, logits_h


def _base_report(cm, layer, A, est, errs, kl, agree):
    report = {
        "model_type": getattr(cm.model.config, "model_type", None),
        "family": cm.family,
        "modality": cm.modality,
        "layer": layer,
        "num_layers": cm.num_layers,
        "n_suffix_blocks": cm.num_layers - layer,
        "n_images": int(A.shape[0]),
        "n_tokens": int(A.shape[1]),
        "hidden_size": int(A.shape[2]),
        "n_concepts": getattr(est, "n_concepts", None),
        "gram_weight": getattr(est, "gram_weight", None),
        "per_image": {k: to_list(v) for k, v in errs.items()},
    }
    per = report["per_image"]
    per["kl"], per["top1_agree"] = to_list(kl), to_list(agree)
    per["lemma_holds"] = to_list((errs["gram_error"] <= errs["lemma_rhs"] * (1 + 1e-9)).double())
    for key in ("delta_rec", "delta_rec_rel", "delta_gram", "gram_norm", "gram_error"):
        report[key] = float(errs[key].mean())
    report["kl"], report["kl_max"] = float(kl.mean()), float(kl.max())
    report["top1_agreement"] = float(agree.mean())
    report["lemma_holds"] = sum(per["lemma_holds"]) / len(kl)
    return report


def fidelity_at_layer(
    cm: ConceptModel,
    acts: LayerActivations,
    layer: int,
    concepts,
    *,
    bounds: bool = ConceptFidelitySettings.bounds,
    power_iters: int = ConceptFidelitySettings.power_iters,
    max_images_for_constants: int = ConceptFidelitySettings.max_images_for_constants,
    batch_size: int = ConceptFidelitySettings.batch_size,
    return_tensors: bool = False,
    progress: bool = True,
) -> ConceptFidelityReport:
    """The report of :func:`~hf_tdiag.diagnostics.concept_fidelity.concept_fidelity` for activations already taken at layer
    ℓ; ``concepts`` an int or an estimator (:mod:`~hf_tdiag.diagnostics.concept_fidelity.estimator`)."""
    A = acts.patches
    est = as_estimator(concepts)
    codes, A_hat = reconstruction(est, A)
    A_hat = A_hat.to(A)
    was_training = module_modes(cm.model)  # every submodule's flag
    cm.model.eval()
    try:
        logits_a, logits_h = _suffix_logits(cm, acts, layer, A, A_hat, batch_size, progress)
        errs = fidelity_errors(A, A_hat)
        kl = kl_divergence(logits_a, logits_h)
        agree = (logits_a.argmax(-1) == logits_h.argmax(-1)).double()
        report = _base_report(cm, layer, A, est, errs, kl, agree)
        report["num_classes"] = int(logits_a.shape[-1])  # C of the bound's vacuity rule (log C; report summary)
        if bounds:
            add_bounds(report, cm, acts, layer, A_hat, errs, kl, power_iters, max_images_for_constants, progress)
    finally:
        restore_modes(was_training)
    tensors = None
    if return_tensors:
        tensors = {"A": A, "A_hat": A_hat, "codes": codes, "logits": logits_a, "logits_hat": logits_h, "concepts": est}
    return ConceptFidelityReport(report, tensors=tensors)
