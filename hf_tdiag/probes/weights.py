"""Weights of a model as the norm-based measures need them, and the path-norm forward pass.

- ``trainable_parameters(model)``: every trainable parameter (the vector ``w``
  of the ℓ2 norm and of the sharpness / PAC-Bayes perturbations).
- ``weight_matrices(model)``: the linear maps the forward pass applies —
  every trainable parameter that is a matrix (``nn.Linear`` weights, CRATE's
  ISTA dictionary, conv kernels read as ``(out, -1)``), excluding embedding
  tables, LayerNorm/bias vectors, CLS tokens and position embeddings (they are
  not linear maps). For CRATE the attention **output matrix** of each block is
  listed as well when it is not a parameter of its own (variants ``crate-c``,
  ``crate-n``, ``crate-t`` reuse ``U``, ``crate-fix`` a fixed buffer), so every
  variant contributes the same three maps per block (``U^T``, output matrix,
  ``D``) to the spectral-norm sum and product.
- ``path_norm(model, example_inputs)``: Jiang et al.'s recipe applied verbatim:
  a float64 copy of the model with every parameter squared, evaluated on an
  all-ones input of one example, outputs summed. For a ReLU MLP this is
  Σ_paths Π_edges w² (biases count as edges from a constant unit). For a
  transformer it is *not* a sum over paths — LayerNorm, softmax and the sign
  of CRATE-N's ``−U`` do not commute with squaring — but it is the same
  well-defined functional of the squared weights for every model, which is
  what the correlation study compares.

No math beyond reshaping and the forward pass happens here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["trainable_parameters", "weight_matrices", "path_norm"]

_EMBEDDING_TYPES = (nn.Embedding, nn.EmbeddingBag)
_CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def _check_model(model) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    return model


def trainable_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter with ``requires_grad``, by qualified name."""
    model = _check_model(model)
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if not params:
        raise ValueError(f"model: {type(model).__name__} has no trainable parameters")
    return params


def _crate_output_matrices(model: nn.Module) -> dict[str, torch.Tensor]:
    """CRATE output matrices that are not already listed as a parameter of their own (tied or fixed variants)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "crate":
        return {}
    from .describe import describe

    param_ids = {id(p) for p in model.parameters()}
    names = {id(m): n for n, m in model.named_modules()}
    out = {}
    for layer in describe(model).layers:
        w = layer.output_weight()
        if w is None:
            continue
        if id(w) in param_ids and w is not layer.query.weight:
            continue  # a separate learned matrix (variant "crate"): already listed as a parameter
        out[f"{names[id(layer.attn_output)]}.output_matrix"] = w
    return out


def weight_matrices(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weight matrices the forward pass applies, by qualified name (see the module docstring for the rule)."""
    model = _check_model(model)
    owners = {}
    for mod_name, module in model.named_modules():
        for p_name, _ in module.named_parameters(recurse=False):
            owners[f"{mod_name}.{p_name}" if mod_name else p_name] = module
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        owner = owners.get(name)
        if isinstance(owner, _EMBEDDING_TYPES):
            continue
        if p.ndim == 2 or (isinstance(owner, _CONV_TYPES) and name.endswith("weight")):
            out[name] = p
    out.update(_crate_output_matrices(model))
    if not out:
        raise ValueError(f"model: {type(model).__name__} has no trainable weight matrices")
    return out


def _ones_like_inputs(example_inputs: Any, name: str = "example_inputs") -> Any:
    if isinstance(example_inputs, torch.Tensor):
        if not example_inputs.is_floating_point():
            raise TypeError(
                f"{name}: path-norm needs a floating input to replace by ones, got dtype {example_inputs.dtype}"
            )
        if example_inputs.ndim < 1:
            raise ValueError(f"{name}: expected a batched tensor (batch first), got a scalar")
        return torch.ones((1, *example_inputs.shape[1:]), dtype=torch.float64, device=example_inputs.device)
    if isinstance(example_inputs, Mapping):
        floats = {k: v for k, v in example_inputs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
        if not floats:
            raise ValueError(
                f"{name}: expected at least one floating tensor among the inputs, got keys {sorted(example_inputs)}"
            )
        return {k: _ones_like_inputs(v, f"{name}[{k!r}]") for k, v in floats.items()}
    raise TypeError(f"{name}: expected a tensor or a mapping of keyword inputs, got {type(example_inputs).__name__}")


def _first_output(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    if isinstance(output, Mapping):
        for v in output.values():
            if isinstance(v, torch.Tensor):
                return v
    raise TypeError(f"model: could not find an output tensor in {type(output).__name__}")


@torch.no_grad()
def path_norm(model: nn.Module, example_inputs: Any) -> float:
    """Σ f_{w²}(1): sum of the outputs of the squared-weight model (float64, eval mode) on one all-ones input.

    ``example_inputs`` is a batch the model accepts (a tensor, or a dict of keyword
    inputs such as ``{"pixel_values": x}``); only its shape is used. Labels and
    other non-floating inputs are dropped.
    """
    model = _check_model(model)
    ones = _ones_like_inputs(example_inputs)
    squared = copy.deepcopy(model).to(torch.float64).eval()
    for p in squared.parameters():
        p.pow_(2)
    out = squared(**ones) if isinstance(ones, dict) else squared(ones)
    out = _first_output(out)
    value = float(out.sum())
    if not torch.isfinite(torch.tensor(value)):
        raise ValueError(f"model: the squared-weight forward pass overflowed (path-norm = {value})")
    return value
