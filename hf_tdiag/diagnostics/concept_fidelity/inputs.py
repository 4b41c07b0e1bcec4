"""A model and its inputs made ready for concept fidelity: the model split at its blocks, texts encoded to a common
token count, and for an encoder without a classifier a linear head fitted on its pooled outputs."""

from __future__ import annotations

import torch

from ..._model_limits import check_batch_ids, check_finite_weights
from ...inputs import check_texts
from ...probes.concept_model import concept_model_parts, layer_activations, pixel_values
from ...probes.concept_text import encode_texts, fit_linear_head, pseudo_labels

__all__ = ["prepare_inputs"]


def _encoded_texts(model, inputs, tokenizer, max_tokens):
    """A list of strings encoded to a common token count (other inputs as given), checked against the model's limit."""
    if isinstance(inputs, (list, tuple)) and inputs:  # a text model's list is a list of texts
        check_texts(inputs)  # the first non-string or empty entry named
        if tokenizer is None:
            raise ValueError("tokenizer: texts given as strings need the model's tokenizer (tokenizer=)")
        inputs = encode_texts(tokenizer, list(inputs), max_tokens=max_tokens)
    check_batch_ids(
        model,
        inputs,
        hint="pass max_tokens (--max-tokens) of at most {limit} minus the special tokens",
        count_name="texts (every text cut to the same token count, special tokens included)",
    )
    return inputs


def _fitted_head(cm, model, inputs, labels, n_clusters, batch_size) -> dict:
    """Fit ``cm.head`` on the pooled outputs (``labels``, else k-means pseudo-labels); what was fitted, on what."""
    feats = layer_activations(model, inputs, cm.num_layers, batch_size=batch_size, cm=cm).features
    source = "labels" if labels is not None else f"k-means ({n_clusters} clusters of the pooled outputs)"
    y = labels if labels is not None else pseudo_labels(feats, n_clusters)
    cm.head = fit_linear_head(feats, y)
    with torch.no_grad():
        pred = cm.head(feats).argmax(-1).cpu()
    target = torch.tensor([cm.head.classes.index(v) for v in (y.tolist() if isinstance(y, torch.Tensor) else list(y))])
    return {
        "fitted": True,
        "labels": source,
        "classes": [str(c) for c in cm.head.classes],
        "train_accuracy": float((pred == target).double().mean()),
    }


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
    inputs = _encoded_texts(model, inputs, tokenizer, max_tokens)
    if cm.head is not None:
        return cm, inputs, {"fitted": False}
    return cm, inputs, _fitted_head(cm, model, inputs, labels, n_clusters, batch_size)
