"""Concept fidelity on decoder LLMs (GPT-2 and the Llama family: Llama, Mistral, Qwen2, …): the texts path.

The split of the model at layer ℓ, as for the encoders (:mod:`hf_tdiag.probes.concept_model`), with what a causal
language model reads out:

* **concept tokens**: the non-special tokens of the texts (a Llama tokenizer's ``<s>`` kept aside), every text cut
  to the same token count by :func:`hf_tdiag.probes.concept_text.encode_texts` (no padding);
* **layer-ℓ states** ``Z^ℓ``: the output of block ℓ before the final norm (for ``ℓ = L`` this is *not*
  Transformers' ``hidden_states[L]``, which has ``ln_f`` / ``model.norm`` applied);
* **readout**: the final norm of the **last** token, ``norm(z^L_T)`` — what the LM head reads to predict the next
  token; through causal attention every concept token reaches it;
* **head**: the LM head ``h(z) = W_c z`` (``W_c`` = ``lm_head.weight``, vocabulary × d; the tied input embedding
  when the model ties them), so the KL compares next-token distributions; a decoder without an LM head gets a
  linear head fitted on the readout like a BERT encoder without classifier;
* **suffix blocks** run exactly as inside the model: each block gets the keyword arguments the model itself passes
  it for a text of that length (causal / sliding-window mask, rotary ``position_embeddings``, position ids),
  captured once per length by a forward pre-hook.

Constants of the bound: the **estimated** ones only (power-iteration Jacobian norms of each suffix block and of the
readout at the data, realised ratios, ``α`` at the data with each block's own norm: RMSNorm divides by
``√(mean z² + ε)``, LayerNorm by ``√(var z + ε)``; ``Σ_h ‖W_V,g(h)‖‖W_O,h‖`` over query heads, a grouped-query
K/V head counted for every query head that reads it). This module reads what they need (:func:`value_output_heads`,
:func:`attention_norm_reading`); the formulas are :mod:`hf_tdiag.measures.concepts.alpha`. The **certified** constants are derived for LayerNorm,
full (non-causal) softmax attention and two-matrix MLPs (``docs/concept_bound.md``); RMSNorm, rotary positions,
causal masks and gated MLPs are not covered by that derivation, so decoder reports carry no ``bound_certified``
and say why (``bound_certified_note``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..measures.concepts.alpha import Norm
from .decoders import model_getter
from .offload import readable
from .token_states import model_device

CERTIFIED_NOTE = (
    "not available for decoders: the certified constants are derived for LayerNorm, full softmax attention and "
    "two-matrix MLPs; RMSNorm, rotary positions, causal masks and gated MLPs are outside that derivation"
)

_DROP = ("hidden_states", "past_key_values", "past_key_value", "layer_past", "use_cache", "output_attentions")


@dataclass
class DecoderConceptModel:
    """Mixin data of a decoder's :class:`~hf_tdiag.probes.concept_model.ConceptModel` (see module doc)."""

    final_norm: nn.Module | None = None
    kwargs_cache: dict = field(default_factory=dict)  # T -> {layer index: block kwargs}


def _layer_index(block: nn.Module) -> int:
    attn = getattr(block, "self_attn", None) or getattr(block, "attn", None)
    idx = getattr(attn, "layer_idx", None)
    if not isinstance(idx, int):
        raise ValueError(f"model: decoder block {type(block).__name__} has no attention layer_idx")
    return idx


@torch.no_grad()
def capture_block_kwargs(base_model: nn.Module, blocks: nn.ModuleList, num_tokens: int) -> dict:
    """``{layer index: kwargs}`` the model passes each block for one unpadded text of ``num_tokens`` tokens."""
    seen: dict[int, dict] = {}

    def hook(module, args, kwargs):
        seen[_layer_index(module)] = {k: v for k, v in kwargs.items() if k not in _DROP}

    hooks = [b.register_forward_pre_hook(hook, with_kwargs=True) for b in blocks]
    device = model_device(base_model)  # an offloaded model: its hooks' execution device
    try:
        base_model(input_ids=torch.zeros(1, num_tokens, dtype=torch.long, device=device), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return seen


def _like(value, hidden: torch.Tensor):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(hidden.dtype)
    if isinstance(value, tuple):
        return tuple(_like(v, hidden) for v in value)
    return value


def decoder_block_forward(cm, block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Block ``block`` on ``hidden`` (B, T, d) with the model's own mask / rotary arguments for length T."""
    T = hidden.shape[1]
    if T not in cm.kwargs_cache:
        cm.kwargs_cache[T] = capture_block_kwargs(cm.arch.base_model, cm.blocks, T)
    kwargs = {k: _like(v, hidden) for k, v in cm.kwargs_cache[T][_layer_index(block)].items()}
    out = block(hidden, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def final_norm(model: nn.Module, arch) -> nn.Module:
    """The decoder's final norm (``Description.final_norm``: GPT-2's ``ln_f``, the Llama family's ``norm``)."""
    if arch.final_norm is not None:
        return arch.final_norm
    raise ValueError(f"model: {type(model).__name__} has no final norm (ln_f / norm) after its decoder blocks")


def norm_eps(norm: nn.Module) -> float:
    """A LayerNorm's ``eps`` or an RMSNorm's ``variance_epsilon`` / ``eps``."""
    for name in ("eps", "variance_epsilon"):
        value = getattr(norm, name, None)
        if isinstance(value, (int, float)):
            return float(value)
    raise ValueError(f"model: norm {type(norm).__name__} has no eps")


def value_output_heads(model: nn.Module, layout, layer: int) -> list:
    """``[(W_V,g(h), W_O,h)]`` over the query heads h of block ``layer`` (g(h) its shared K/V head), detached."""
    get = model_getter(model)
    heads = []
    for h in range(layout.num_heads):
        head = layout.head(layer, h, get)
        heads.append((head.W_V.detach(), head.W_O.detach()))
    return heads


@torch.no_grad()
def attention_norm_reading(cm, layer: int, Z: torch.Tensor) -> tuple:
    """``(Norm, centred, X)`` of block ``layer + 1``'s pre-attention norm: its parameters, whether it centres tokens
    (LayerNorm; RMSNorm does not) and its output ``X`` on the data states ``Z``."""
    norm = cm.arch.layers[layer].attention_norm
    with readable(cm.model, norm):  # an offloaded block's norm
        weight = getattr(norm, "weight", None)
        params = Norm(None if weight is None else weight.detach().to(torch.float64, copy=True), None, norm_eps(norm))
        return params, isinstance(norm, nn.LayerNorm), norm(Z)


__all__ = [
    "CERTIFIED_NOTE",
    "DecoderConceptModel",
    "attention_norm_reading",
    "capture_block_kwargs",
    "decoder_block_forward",
    "final_norm",
    "norm_eps",
    "value_output_heads",
]
