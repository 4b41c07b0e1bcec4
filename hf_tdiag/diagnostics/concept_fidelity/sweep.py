"""The layer sweep of concept fidelity: concepts fitted and scored at every requested layer, with one table row each."""

from __future__ import annotations

from ..._progress import tqdm
from ...probes.concept_model import ConceptModel, check_layer, layer_activations
from .estimator import per_layer
from .layer import fidelity_at_layer
from .report import ConceptFidelityReport

__all__ = ["SWEEP_KEYS", "sweep_layers", "layer_sweep"]

#: the numbers of each layer a sweep's table holds
SWEEP_KEYS = (
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


def sweep_layers(cm: ConceptModel, layers) -> list[int]:
    """``"all"`` (0..L) or a non-empty list of block numbers, each checked."""
    if isinstance(layers, str):
        if layers != "all":
            raise ValueError(f"layers: expected 'all' or a list of ints, got {layers!r}")
        return list(range(cm.num_layers + 1))
    layers = list(layers)
    if not layers:
        raise ValueError("layers: expected 'all' or a non-empty list of ints")
    return [check_layer(cm, layer) for layer in layers]


def layer_sweep(cm: ConceptModel, inputs, layers, concepts, head_info, options: dict) -> ConceptFidelityReport:
    """One :func:`fidelity_at_layer` report per layer (fresh concepts at each), and the sweep's table."""
    layers = sweep_layers(cm, layers)
    per_layer(concepts)  # refused before any forward pass
    reports = {}
    for layer in tqdm(layers, desc="layers", disable=not options["progress"]):
        acts = layer_activations(cm.model, inputs, layer, batch_size=options["batch_size"], cm=cm)
        reports[layer] = fidelity_at_layer(cm, acts, layer, per_layer(concepts), **options)
    table = [{"layer": layer, **{k: rep[k] for k in SWEEP_KEYS if k in rep}} for layer, rep in reports.items()]
    out = {
        "layers": layers,
        "num_layers": cm.num_layers,
        "family": cm.family,
        "modality": cm.modality,
        "model_type": getattr(cm.model.config, "model_type", None),
        "per_layer": reports,
        "table": table,
    }
    if head_info is not None:
        out["head"] = head_info
    return ConceptFidelityReport(out)
