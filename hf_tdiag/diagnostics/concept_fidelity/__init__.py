"""Concept fidelity: how faithfully a few concepts at layer ℓ explain a classifier's prediction, with its KL bound.

One job per module: :mod:`.fidelity` (:func:`concept_fidelity`, the public entry), :mod:`.estimator` (what
``concepts=`` accepts: an int k or a concept estimator), :mod:`.inputs` (the model split and its inputs encoded,
a head fitted where needed), :mod:`.layer` (one layer's report from its activations), :mod:`.sweep` (the layer
sweep), :mod:`.constants` (the bound's certified and estimated constants, wiring the probes' readings into the
formulas of :mod:`hf_tdiag.measures.concepts`), :mod:`.bound` (the bound's numbers in the report), :mod:`.compare`
(plain, Gram-aligned and supervised concepts side by side), :mod:`.report` (:class:`ConceptFidelityReport`).
"""

from .compare import compare_concepts, supervised_concepts
from .fidelity import DEFAULT_N_CONCEPTS, concept_fidelity, concept_fidelity_sweep
from .inputs import prepare_inputs
from .layer import fidelity_at_layer
from .report import ConceptFidelityReport

__all__ = [
    "ConceptFidelityReport",
    "DEFAULT_N_CONCEPTS",
    "compare_concepts",
    "concept_fidelity",
    "concept_fidelity_sweep",
    "fidelity_at_layer",
    "prepare_inputs",
    "supervised_concepts",
]
