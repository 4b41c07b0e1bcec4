"""Concept fidelity of a transformer classifier at layer ℓ (CRATE, ViT-like image classifiers, BERT-like encoders).

Definitions used throughout (docs/guide/concepts.md; the bound's derivation in ``docs/concept_bound.md``):

* **layer-ℓ activations** ``A``: the output of block ℓ, ``hidden_states[ℓ]`` (``ℓ = 0`` the embedding output,
  ``ℓ = L`` the last block), **concept tokens only** — shape ``(inputs, N, d)``: an image's patch tokens (CLS and
  DeiT's distillation token kept aside, never replaced) or a text's non-special tokens (``[CLS]``/``[SEP]`` kept;
  texts cut to a common token count by :func:`hf_tdiag.probes.concept_text.encode_texts`).
* **suffix** ``g_{>ℓ}``: blocks ℓ+1..L, the readout (CRATE/ViT: pooling + final LayerNorm; BERT: the pooler
  ``tanh(W_p z_CLS + b_p)``), then the linear head ``h(z) = W_c z + b`` (the model's classifier, or for an
  encoder without one a head fitted on the pooled outputs, :func:`~hf_tdiag.probes.concept_text.fit_linear_head`).
  The empirical KL compares ``σ(g(A))`` with ``σ(g(Â))``, ``Â`` replacing the concept tokens.
* **the bound** ``KL ≤ ½ (‖W_c‖_op L_readout)² L_block^{2 L_suf} (√N δ_rec + α‖G‖_F δ_gram)²`` is reported twice,
  never mixed: ``bound_certified`` with the upper-bound constants of
  :func:`~hf_tdiag.probes.concept_constants.certified_constants` (plus ``bound_certified_chain``, the tighter
  ``½(‖W_c‖ Δ)²`` it relaxes, ``Δ`` the certified move of the head's input), and ``bound_estimated`` with the local estimates of
  :func:`~hf_tdiag.probes.concept_constants.estimate_constants`.
"""

from __future__ import annotations

import copy

import torch

from .._caller_state import keeps_modes, module_modes, restore_modes
from .._model_limits import check_finite_weights, check_token_count
from .._progress import tqdm
from ..inputs import check_texts
from ..measures.concepts import SemiNMF, fidelity_errors, kl_bound, kl_bound_chain, kl_divergence
from ..probes.concept_constants import certified_constants, estimate_constants
from ..probes.concept_decoder import CERTIFIED_NOTE
from ..probes.concept_model import (
    ConceptModel,
    LayerActivations,
    check_layer,
    concept_model_parts,
    layer_activations,
    pixel_values,
    suffix_runner,
)
from ..probes.concept_text import encode_texts, fit_linear_head, pseudo_labels
from .concept_report import ConceptFidelityReport
from .entry import diagnostic_entry
from .settings import ConceptSettings

__all__ = [
    "ConceptFidelityReport",
    "concept_fidelity",
    "concept_fidelity_sweep",
    "concept_model_parts",
    "layer_activations",
    "suffix_runner",
    "prepare_inputs",
    "ConceptModel",
    "LayerActivations",
    "DEFAULT_N_CONCEPTS",
]

#: the number of concepts k every entry point (Python API, evaluate module, CLI, recipe) uses by default
DEFAULT_N_CONCEPTS = ConceptSettings.n_concepts


def prepare_inputs(
    model,
    inputs,
    *,
    tokenizer=None,
    max_tokens: int | None = None,
    labels=None,
    head=None,
    n_clusters: int = 4,
    batch_size: int = 64,
):
    """``(ConceptModel, model inputs, head info)``: texts encoded to a common token count, and for an encoder
    without classifier a linear head fitted on its pooled outputs (``labels``, else k-means pseudo-labels)."""
    cm = concept_model_parts(model, head=head)
    check_finite_weights(model)  # a NaN/inf weight named before any forward pass
    if cm.modality == "image":
        return cm, pixel_values(inputs), None
    if isinstance(inputs, (list, tuple)) and inputs:  # a text model's list is a list of texts
        check_texts(inputs)  # the first non-string or empty entry named
        if tokenizer is None:
            raise ValueError("tokenizer: texts given as strings need the model's tokenizer (tokenizer=)")
        inputs = encode_texts(tokenizer, list(inputs), max_tokens=max_tokens)
    ids = inputs.get("input_ids") if hasattr(inputs, "get") else None
    if isinstance(ids, torch.Tensor) and ids.ndim == 2:
        check_token_count(
            model,
            ids.shape[1],
            "texts (every text cut to the same token count, special tokens included)",
            "pass max_tokens (--max-tokens) of at most {limit} minus the special tokens",
        )
    if cm.head is not None:
        return cm, inputs, {"fitted": False}
    feats = layer_activations(model, inputs, cm.num_layers, batch_size=batch_size, cm=cm).features
    source = "labels" if labels is not None else f"k-means ({n_clusters} clusters of the pooled outputs)"
    y = labels if labels is not None else pseudo_labels(feats, n_clusters)
    cm.head = fit_linear_head(feats, y)
    with torch.no_grad():
        pred = cm.head(feats).argmax(-1).cpu()
    target = torch.tensor([cm.head.classes.index(v) for v in (y.tolist() if isinstance(y, torch.Tensor) else list(y))])
    info = {
        "fitted": True,
        "labels": source,
        "classes": [str(c) for c in cm.head.classes],
        "train_accuracy": float((pred == target).double().mean()),
    }
    return cm, inputs, info


def _concepts_reconstruction(concepts, A: torch.Tensor):
    """(estimator, codes or None, Â) for the concepts spec (see :func:`concept_fidelity`)."""
    if isinstance(concepts, SemiNMF):
        if getattr(concepts, "components_", None) is None:
            codes = concepts.fit(A).codes_
        else:
            codes = concepts.transform(A)
        return concepts, codes, concepts.inverse_transform(codes)
    if isinstance(concepts, int) and not isinstance(concepts, bool):
        est = SemiNMF(concepts).fit(A)
        return est, est.codes_, est.inverse_transform(est.codes_)
    if isinstance(concepts, torch.Tensor):
        est = SemiNMF.from_components(concepts)
        codes = est.transform(A)
        return est, codes, est.inverse_transform(codes)
    if callable(getattr(concepts, "reconstruct", None)):
        A_hat = concepts.reconstruct(A)
        if not isinstance(A_hat, torch.Tensor) or A_hat.shape != A.shape:
            raise ValueError(f"concepts: reconstruct(A) must return a tensor of shape {tuple(A.shape)}")
        return concepts, None, A_hat
    raise TypeError(
        "concepts: expected a SemiNMF (fitted or not), a number of concepts (int), a dictionary tensor (k, d) "
        f"or an object with reconstruct(A), got {type(concepts).__name__}"
    )


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


def _to_list(t):
    return [float(v) for v in t]


def _per_input(t, n):
    return _to_list(torch.as_tensor(t, dtype=torch.float64).expand(n))


def _bound_report(report, cm, acts, layer, A_hat, errs, kl, power_iters, max_images, progress):
    """Adds ``bound_certified``, ``bound_certified_chain``, ``bound_estimated`` (per input and mean), their terms,
    the fractions of inputs with KL below each, and both sets of constants (decoders: the estimated ones only,
    ``bound_certified_note`` says why)."""
    n, n_tokens, n_suf = len(kl), report["n_tokens"], cm.num_layers - layer
    est = estimate_constants(cm, acts, A_hat, layer, power_iters=power_iters, max_images=max_images, progress=progress)
    seed_e = kl_bound(
        est["w_c_op"],
        est["l_block"],
        n_suf,
        n_tokens,
        errs["delta_rec"],
        est["alpha"],
        errs["gram_norm"],
        errs["delta_gram"],
        l_readout=est["l_readout"],
    )
    values = [
        ("bound_estimated", seed_e["bound"]),
        ("bound_estimated_rec_term", seed_e["rec_term"]),
        ("bound_estimated_gram_term", seed_e["gram_term"]),
    ]
    kinds = ["estimated"]
    if cm.certified:
        cert = certified_constants(cm, acts, layer, A_hat)
        seed_c = kl_bound(
            cert["w_c_op"],
            cert["l_block"],
            n_suf,
            n_tokens,
            errs["delta_rec"],
            cert["alpha"],
            errs["gram_norm"],
            errs["delta_gram"],
            l_readout=cert["l_readout"],
        )
        chain = kl_bound_chain(cert["w_c_op"], cert["head_input_deviation"])
        values += [
            ("bound_certified", seed_c["bound"]),
            ("bound_certified_chain", chain),
            ("bound_certified_rec_term", seed_c["rec_term"]),
            ("bound_certified_gram_term", seed_c["gram_term"]),
        ]
        kinds.insert(0, "certified")
        report["constants_certified"] = _certified_summary(cert, n)
    else:
        report["bound_certified_note"] = CERTIFIED_NOTE
    per = report["per_image"]
    for name, value in values:
        per[name] = _per_input(value, n)
        report[name] = sum(per[name]) / n
    for kind in kinds:
        below = (kl <= torch.as_tensor(per[f"bound_{kind}"], dtype=torch.float64)).double()
        per[f"kl_below_bound_{kind}"] = _to_list(below)
        report[f"frac_kl_below_bound_{kind}"] = float(below.mean())
    report["constants_estimated"] = _estimated_summary(est, n, power_iters)


def _certified_summary(cert, n):
    return {
        "w_c_op": cert["w_c_op"],
        "l_block": float(cert["l_block"].max()),
        "l_readout": float(cert["l_readout"].max()),
        "alpha": float(cert["alpha"].max()),
        "suffix_gain": float(cert["suffix_gain"].max()),
        "l_block_per_block": [float(c) for c in cert["l_blocks"].amax(0)] if cert["l_blocks"].numel() else [],
        "per_image": {
            "l_block": _to_list(cert["l_block"]),
            "l_readout": _to_list(cert["l_readout"]),
            "alpha": _to_list(cert["alpha"]),
            "suffix_gain": _to_list(cert["suffix_gain"]),
            "l_blocks": cert["l_blocks"].tolist(),
            "head_input_deviation": _to_list(cert["head_input_deviation"]),
        },
        "head_input_deviation": float(cert["head_input_deviation"].max()),
        "method": "upper bounds on the domain the reconstruction provably stays in (each token within its "
        "certified distance of the data's; docs/concept_bound.md); per image; summaries are maxima",
    }


def _estimated_summary(est, n, power_iters):
    return {
        "w_c_op": est["w_c_op"],
        "l_block": est["l_block"],
        "l_readout": est["l_readout"],
        "alpha": float(est["alpha"].max()),
        "per_image": {"alpha": _to_list(est["alpha"])},
        "l_block_jacobian": est["l_block_jacobian"],
        "l_block_realized": est["l_block_realized"],
        "l_readout_jacobian": est["l_readout_jacobian"],
        "method": f"local estimates (lower than the certified constants): Jacobian spectral norms by power iteration "
        f"({power_iters} steps, float64, first {est['images_for_jacobians']} inputs) and realised ratios "
        f"||f(Z_hat)-f(Z)||/||Z_hat-Z|| on all inputs; alpha at the median token scale",
    }


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
        "per_image": {k: _to_list(v) for k, v in errs.items()},
    }
    per = report["per_image"]
    per["kl"], per["top1_agree"] = _to_list(kl), _to_list(agree)
    per["lemma_holds"] = _to_list((errs["gram_error"] <= errs["lemma_rhs"] * (1 + 1e-9)).double())
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
    bounds: bool = ConceptSettings.bounds,
    power_iters: int = ConceptSettings.power_iters,
    max_images_for_constants: int = ConceptSettings.max_images_for_constants,
    batch_size: int = ConceptSettings.batch_size,
    return_tensors: bool = False,
    progress: bool = True,
) -> ConceptFidelityReport:
    """The report of :func:`concept_fidelity` for activations already taken at layer ℓ."""
    A = acts.patches
    est, codes, A_hat = _concepts_reconstruction(concepts, A)
    A_hat = A_hat.to(A)
    model = cm.model
    was_training = module_modes(model)  # every submodule's flag
    model.eval()
    try:
        logits_a, logits_h = _suffix_logits(cm, acts, layer, A, A_hat, batch_size, progress)
        errs = fidelity_errors(A, A_hat)
        kl = kl_divergence(logits_a, logits_h)
        agree = (logits_a.argmax(-1) == logits_h.argmax(-1)).double()
        report = _base_report(cm, layer, A, est, errs, kl, agree)
        if bounds:
            _bound_report(report, cm, acts, layer, A_hat, errs, kl, power_iters, max_images_for_constants, progress)
    finally:
        restore_modes(was_training)
    tensors = None
    if return_tensors:
        tensors = {"A": A, "A_hat": A_hat, "codes": codes, "logits": logits_a, "logits_hat": logits_h, "concepts": est}
    return ConceptFidelityReport(report, tensors=tensors)


@keeps_modes  # the probes reset every submodule to the top module's flag
@diagnostic_entry(ConceptSettings)
def concept_fidelity(
    model,
    inputs,
    layer: int | None = None,
    concepts=None,
    *,
    settings: ConceptSettings,
    layers=None,
    tokenizer=None,
    labels=None,
    head=None,
    return_tensors: bool = False,
    progress: bool = True,
) -> ConceptFidelityReport:
    """Fidelity report of concepts at layer ℓ (or, with ``layers="all"`` or a list, the layer sweep).

    ``inputs``: pixel values ``(images, C, H, W)`` (or a dict/BatchFeature with ``pixel_values``) for image
    classifiers; for BERT-like encoders a list of strings (with ``tokenizer``; cut to ``max_tokens`` or the shortest
    text's token count) or the output of :func:`~hf_tdiag.probes.concept_text.encode_texts`. ``labels`` (texts,
    encoder without classifier): the labels the linear head is fitted on (default: k-means pseudo-labels,
    ``n_clusters``); ``head``: a ``nn.Linear`` to use instead. ``concepts``: a fitted
    :class:`~hf_tdiag.measures.concepts.SemiNMF` (codes via ``transform``), an unfitted one (fitted here), an int
    (plain Semi-NMF with that many concepts), a dictionary tensor ``(k, d)`` or any object with
    ``reconstruct(A) -> Â``. Returns a :class:`~hf_tdiag.diagnostics.concept_report.ConceptFidelityReport`
    (``return_tensors``: with the tensors behind the numbers as ``report.tensors``) of per-input lists and means: ``delta_rec`` (absolute and relative),
    ``delta_gram``, ``gram_norm``, the lemma check, the empirical ``kl``, ``top1_agreement``; with ``bounds``
    ``bound_certified``, ``bound_certified_chain``, ``bound_estimated``, their
    terms, ``frac_kl_below_bound_certified``/``_estimated`` and ``constants_certified``/``constants_estimated``.
    ``concepts=None``: ``settings.n_concepts`` plain Semi-NMF concepts. ``settings``: a
    :class:`~hf_tdiag.diagnostics.settings.ConceptSettings` holding these keywords (a keyword given with a value other
    than its default overrides it).

    Examples:
        >>> import torch, hf_tdiag
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification
        >>> _ = torch.manual_seed(0)
        >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
        >>> images = torch.randn(4, 1, 8, 8)
        >>> report = hf_tdiag.concept_fidelity(model, images, layer=2, concepts=2, power_iters=2, progress=False)
        >>> s = report.summary()
        >>> sorted(s)[:3], s["top1_agreement"]
        (['bound_certified', 'bound_estimated', 'delta_rec_rel'], 1.0)
        >>> s["kl"] <= s["bound_estimated"] <= s["bound_certified"], round(s["delta_rec_rel"], 3), f"{s['kl']:.1e}"
        (True, 0.646, '1.5e-06')
    """
    s = settings
    concepts = s.n_concepts if concepts is None else concepts
    bounds, max_tokens, n_clusters, power_iters = s.bounds, s.max_tokens, s.n_clusters, s.power_iters
    max_images_for_constants, batch_size = s.max_images_for_constants, s.batch_size
    cm, inputs, head_info = prepare_inputs(
        model,
        inputs,
        tokenizer=tokenizer,
        max_tokens=max_tokens,
        labels=labels,
        head=head,
        n_clusters=n_clusters,
        batch_size=batch_size,
    )
    options = {
        "bounds": bounds,
        "power_iters": power_iters,
        "max_images_for_constants": max_images_for_constants,
        "batch_size": batch_size,
        "return_tensors": return_tensors,
        "progress": progress,
    }
    if layers is not None:
        if layer is not None:
            raise ValueError(f"layer: give layer= or layers=, not both (got layer={layer}, layers={layers!r})")
        return _sweep(cm, inputs, layers, concepts, head_info, options)
    if layer is None:
        raise ValueError(f"layer: required (an int in [0, {cm.num_layers}]) unless layers= is given")
    layer = check_layer(cm, layer)
    acts = layer_activations(model, inputs, layer, batch_size=batch_size, cm=cm)
    report = fidelity_at_layer(cm, acts, layer, concepts, **options)
    if head_info is not None:
        report["head"] = head_info
    return report


def _sweep_layers(cm: ConceptModel, layers) -> list[int]:
    if isinstance(layers, str):
        if layers != "all":
            raise ValueError(f"layers: expected 'all' or a list of ints, got {layers!r}")
        return list(range(cm.num_layers + 1))
    layers = list(layers)
    if not layers:
        raise ValueError("layers: expected 'all' or a non-empty list of ints")
    return [check_layer(cm, layer) for layer in layers]


def _fresh_concepts(concepts):
    """A per-layer copy of the concepts spec: an int or an unfitted SemiNMF (a dictionary belongs to one layer)."""
    if isinstance(concepts, int) and not isinstance(concepts, bool):
        return concepts
    if isinstance(concepts, SemiNMF) and getattr(concepts, "components_", None) is None:
        return copy.deepcopy(concepts)
    raise TypeError(
        f"concepts: a layer sweep fits concepts per layer; expected an int or an unfitted SemiNMF, "
        f"got {type(concepts).__name__}"
    )


_SWEEP_KEYS = (
    "delta_rec",
    "delta_rec_rel",
    "delta_gram",
    "kl",
    "kl_max",
    "top1_agreement",
    "bound_certified",
    "bound_certified_chain",
    "bound_estimated",
    "frac_kl_below_bound_certified",
    "frac_kl_below_bound_estimated",
)


def _sweep(cm, inputs, layers, concepts, head_info, options) -> ConceptFidelityReport:
    layers = _sweep_layers(cm, layers)
    _fresh_concepts(concepts)
    per_layer = {}
    for layer in tqdm(layers, desc="layers", disable=not options["progress"]):
        acts = layer_activations(cm.model, inputs, layer, batch_size=options["batch_size"], cm=cm)
        per_layer[layer] = fidelity_at_layer(cm, acts, layer, _fresh_concepts(concepts), **options)
    table = [{"layer": layer, **{k: rep[k] for k in _SWEEP_KEYS if k in rep}} for layer, rep in per_layer.items()]
    out = {
        "layers": layers,
        "num_layers": cm.num_layers,
        "family": cm.family,
        "modality": cm.modality,
        "model_type": getattr(cm.model.config, "model_type", None),
        "per_layer": per_layer,
        "table": table,
    }
    if head_info is not None:
        out["head"] = head_info
    return ConceptFidelityReport(out)


def concept_fidelity_sweep(model, inputs, concepts=DEFAULT_N_CONCEPTS, layers="all", **kwargs):
    """``concept_fidelity(model, inputs, concepts=concepts, layers=layers, **kwargs)``: fit and report every layer."""
    return concept_fidelity(model, inputs, None, concepts, layers=layers, **kwargs)
