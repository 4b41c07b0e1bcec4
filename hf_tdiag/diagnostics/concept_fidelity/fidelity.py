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
  :func:`~hf_tdiag.diagnostics.concept_fidelity.constants.certified_constants` (plus ``bound_certified_chain``, the tighter
  ``½(‖W_c‖ Δ)²`` it relaxes, ``Δ`` the certified move of the head's input), and ``bound_estimated`` with the local estimates of
  :func:`~hf_tdiag.diagnostics.concept_fidelity.constants.estimate_constants`.
"""

from __future__ import annotations

import functools

from ..._caller_state import keeps_modes
from ...probes.concept_model import check_layer, concept_model_parts, layer_activations
from ..entry import diagnostic_entry
from ..settings import ConceptFidelitySettings
from .estimator import check_one_count
from .inputs import prepare_inputs
from .layer import fidelity_at_layer
from .report import ConceptFidelityReport
from .sweep import layer_sweep, sweep_layers

__all__ = ["DEFAULT_N_CONCEPTS", "concept_fidelity", "concept_fidelity_sweep"]

#: the number of concepts k every entry point (Python API, evaluate module, CLI, recipe) uses by default
DEFAULT_N_CONCEPTS = ConceptFidelitySettings.n_concepts


def _one_count(entry):
    """``concepts=`` (4th argument) and the keyword ``n_concepts=`` together are refused (:func:`check_one_count`)."""

    @functools.wraps(entry)
    def checked(*args, **kwargs):
        check_one_count(args[3] if len(args) > 3 else kwargs.get("concepts"), kwargs)
        return entry(*args, **kwargs)

    return checked


def _options(s: ConceptFidelitySettings, return_tensors: bool, progress: bool) -> dict:
    """The keywords of :func:`fidelity_at_layer` from the settings."""
    return {
        "bounds": s.bounds,
        "power_iters": s.power_iters,
        "max_images_for_constants": s.max_images_for_constants,
        "batch_size": s.batch_size,
        "return_tensors": return_tensors,
        "progress": progress,
    }


@keeps_modes  # the probes reset every submodule to the top module's flag
@_one_count
@diagnostic_entry(ConceptFidelitySettings)
def concept_fidelity(
    model,
    inputs,
    layer: int | None = None,
    concepts=None,
    *,
    settings: ConceptFidelitySettings,
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
    ``n_clusters``); ``head``: a ``nn.Linear`` to use instead.

    ``concepts``: the number of concepts k (an int: a plain Semi-NMF fitted here) or a concept estimator — an object
    with ``transform``/``inverse_transform`` (and ``fit_transform`` or ``fit``, used when it is not fitted yet), such
    as a fitted or unfitted :class:`~hf_tdiag.measures.concepts.SemiNMF`, ``SemiNMF.from_components(W)`` for a
    dictionary ``W`` (k, d), or :class:`~hf_tdiag.measures.concepts.Reconstruction` for a fixed map ``A -> Â``
    (:mod:`~hf_tdiag.diagnostics.concept_fidelity.estimator`). ``concepts=None``: ``settings.n_concepts`` plain Semi-NMF
    concepts; ``concepts=`` with the keyword ``n_concepts=`` is refused, with a settings object it wins (the report's
    ``n_concepts`` is the k used).

    Returns a :class:`~hf_tdiag.diagnostics.concept_fidelity.ConceptFidelityReport` (``return_tensors``: with the tensors
    behind the numbers as ``report.tensors``) of per-input lists and means: ``delta_rec`` (absolute and relative),
    ``delta_gram``, ``gram_norm``, the lemma check, the empirical ``kl``, ``top1_agreement``; with ``bounds``
    ``bound_certified``, ``bound_certified_chain``, ``bound_estimated``, their
    terms, ``frac_kl_below_bound_certified``/``_estimated`` and ``constants_certified``/``constants_estimated``.
    ``settings``: a :class:`~hf_tdiag.diagnostics.settings.ConceptFidelitySettings` holding these keywords (a keyword given
    replaces the object's value).

    Examples:
        >>> import torch, hf_tdiag
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification
        >>> _ = torch.manual_seed(0)
        >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
        >>> images = torch.randn(4, 1, 8, 8)
        >>> report = hf_tdiag.concept_fidelity(model, images, layer=2, concepts=2, power_iters=2, progress=False)
        >>> s = report.summary()
        >>> sorted(k for k in s if not k.endswith("_vacuous"))[:3], s["top1_agreement"], s["n_images"]
        (['bound_certified', 'bound_estimated', 'delta_rec_rel'], 1.0, 4)
        >>> [k for k, v in s.items() if v is True]  # bounds above log C = log 10 (vacuous_reasons() says why)
        ['bound_certified_vacuous', 'bound_certified_chain_vacuous', 'bound_estimated_vacuous']
        >>> s["kl"] <= s["bound_estimated"] <= s["bound_certified"], round(s["delta_rec_rel"], 3), f"{s['kl']:.1e}"
        (True, 0.646, '1.5e-06')
    """
    s = settings
    concepts = s.n_concepts if concepts is None else concepts
    parts = concept_model_parts(model, head=head)  # the layers are checked before any input is encoded or run
    if layers is None and layer is not None:
        check_layer(parts, layer)
    elif layers is not None and layer is None:
        sweep_layers(parts, layers)
    cm, inputs, head_info = prepare_inputs(
        model,
        inputs,
        tokenizer=tokenizer,
        max_tokens=s.max_tokens,
        labels=labels,
        head=head,
        n_clusters=s.n_clusters,
        batch_size=s.batch_size,
    )
    options = _options(s, return_tensors, progress)
    if layers is not None:
        if layer is not None:
            raise ValueError(f"layer: give layer= or layers=, not both (got layer={layer}, layers={layers!r})")
        return layer_sweep(cm, inputs, layers, concepts, head_info, options)
    if layer is None:
        raise ValueError(f"layer: required (an int in [0, {cm.num_layers}]) unless layers= is given")
    layer = check_layer(cm, layer)
    acts = layer_activations(model, inputs, layer, batch_size=s.batch_size, cm=cm)
    report = fidelity_at_layer(cm, acts, layer, concepts, **options)
    if head_info is not None:
        report["head"] = head_info
    return report


def concept_fidelity_sweep(model, inputs, concepts=DEFAULT_N_CONCEPTS, layers="all", **kwargs):
    """``concept_fidelity(model, inputs, concepts=concepts, layers=layers, **kwargs)``: fit and report every layer."""
    return concept_fidelity(model, inputs, None, concepts, layers=layers, **kwargs)
