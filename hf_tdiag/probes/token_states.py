"""Per-layer token states of one batch, read with forward hooks during one forward pass.

For every block ℓ: the block input ``Z^ℓ`` (B, N, d); for CRATE also
``Z^{ℓ+½} = Z^ℓ + MSSA(LN₁(Z^ℓ))``. With ``apply_layernorm=True`` each state
is passed through the block's own pre-attention LayerNorm (the official CRATE
measurement did this; post-norm blocks such as BERT's have none, and their
block inputs are left as they are). Optionally the forward pass's own head
projections of the measured ``Z^ℓ`` are returned too (when the state measured
is exactly what the ``query``/``key``/``value`` linear saw), so a measure can
skip recomputing them.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import List, Optional

import torch
from torch import nn

from .architecture import Architecture, describe
from .subspaces import check_source, layer_projection

_NON_INPUT_KEYS = ("labels", "label", "label_ids")


@dataclass
class TokenStates:
    """Token states of one batch; lists are indexed by layer."""

    block_inputs: List[torch.Tensor]  # Z^ℓ (or LN(Z^ℓ)), (B, N, d)
    mid_states: Optional[List[torch.Tensor]]  # CRATE: Z^{ℓ+½} (or LN₁(Z^{ℓ+½})); None otherwise
    projections: Optional[List[Optional[torch.Tensor]]]  # (B, K, N, p) projections of block_inputs[ℓ], or None
    token_mask: Optional[torch.Tensor]  # (B, N) bool from the batch's attention_mask, or None
    layernorm_applied: bool  # True when block states were passed through a pre-attention LayerNorm


def model_device(model: nn.Module) -> torch.device:
    """Device of the model's first parameter (CPU for a parameterless module)."""
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def model_dtype(model: nn.Module) -> torch.dtype:
    """Floating dtype of the model's first floating parameter (float32 if none)."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32


def forward_kwargs(model: nn.Module, batch) -> dict:
    """Turn a batch (a tensor of the main input, a mapping, or a (inputs, labels) pair) into forward kwargs."""
    if isinstance(batch, (list, tuple)) and batch and not isinstance(batch[0], (int, float)):
        batch = batch[0]  # (inputs, labels) pairs from a TensorDataset / torchvision-style loader
    if isinstance(batch, torch.Tensor):
        kwargs = {getattr(model, "main_input_name", "pixel_values"): batch}
    elif isinstance(batch, Mapping):
        kwargs = {k: v for k, v in batch.items() if k not in _NON_INPUT_KEYS}
    else:
        raise TypeError(
            f"inputs: expected a tensor of model inputs, a dict batch or (inputs, labels) pairs, got {type(batch).__name__}"
        )
    params = inspect.signature(model.forward).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    if not kwargs:
        raise ValueError(f"inputs: the batch has none of the inputs {type(model).__name__}.forward accepts")
    device, dtype = model_device(model), model_dtype(model)
    out = {}
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            value = value.to(device=device, dtype=dtype if value.is_floating_point() else value.dtype, non_blocking=True)
        out[key] = value
    return out


def _first_tensor(args, kwargs) -> torch.Tensor:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    for key in ("hidden_states", "x", "hidden_state"):
        if isinstance(kwargs.get(key), torch.Tensor):
            return kwargs[key]
    raise ValueError("model: could not read a block's input hidden states in its forward pre-hook")


def token_states(
    model: nn.Module,
    batch,
    *,
    apply_layernorm: bool = False,
    mid: bool = True,
    projection_source: str | None = None,
    arch: Architecture | None = None,
    grad: bool = False,
) -> TokenStates:
    """Run ``model`` on ``batch`` once and return every block's token states (see module docstring).

    ``projection_source`` (``query``/``key``/``value``): also return the forward pass's own projections
    of the measured block states onto that source's subspaces, where they coincide (else ``None`` per layer).
    ``grad=False`` runs under ``torch.no_grad()``.
    """
    arch = arch or describe(model)
    if projection_source is not None:
        check_source(projection_source)
    L = arch.num_layers
    inputs: list = [None] * L
    normed: list = [None] * L
    mids: list = [None] * L
    proj: list = [None] * L  # (input, output) of the source linear
    want_mid = mid and arch.family == "crate"
    norms = [h.attention_norm if apply_layernorm else None for h in arch.layers]
    hooks = []

    def pre_hook(i):
        def fn(module, args, kwargs):
            inputs[i] = _first_tensor(args, kwargs)

        return fn

    def norm_hook(i):
        def fn(module, args, output):
            normed[i] = output

        return fn

    def mid_hook(i):
        def fn(module, args, output):
            mids[i] = output[1]

        return fn

    def proj_hook(i):
        def fn(module, args, output):
            proj[i] = (args[0], output)

        return fn

    linears = [layer_projection(arch, i, projection_source) for i in range(L)] if projection_source else []
    shared = len({id(m) for m in linears}) != len(linears)  # weight-tied layers: reuse is ambiguous
    try:
        for i, handles in enumerate(arch.layers):
            hooks.append(handles.block.register_forward_pre_hook(pre_hook(i), with_kwargs=True))
            if norms[i] is not None:
                hooks.append(norms[i].register_forward_hook(norm_hook(i)))
            if want_mid:
                hooks.append(handles.block.register_forward_hook(mid_hook(i)))
            if linears and not shared:
                hooks.append(linears[i].register_forward_hook(proj_hook(i)))
        kwargs = forward_kwargs(arch.base_model, batch)
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            arch.base_model(**kwargs)
            missing = [i for i in range(L) if inputs[i] is None or (norms[i] is not None and normed[i] is None)]
            if missing:
                raise ValueError(f"model: the forward pass did not run blocks {missing}; cannot read their token states")
            states = [normed[i] if norms[i] is not None else inputs[i] for i in range(L)]
            mid_states = None
            if want_mid:
                mid_states = [norms[i](mids[i]) if norms[i] is not None else mids[i] for i in range(L)]
    finally:
        for h in hooks:
            h.remove()

    projections = None
    if linears:
        projections = []
        for i in range(L):
            got = proj[i]
            if got is None or shared or got[0] is not states[i]:
                projections.append(None)
                continue
            out = got[1]
            if linears[i].bias is not None:
                out = out - linears[i].bias
            p = arch.layers[i].head_dim
            projections.append(out.unflatten(-1, (out.shape[-1] // p, p)).movedim(-2, -3))

    mask = kwargs.get("attention_mask")
    token_mask = None
    if isinstance(mask, torch.Tensor) and mask.ndim == 2 and mask.shape == states[0].shape[:2]:
        token_mask = mask.bool()
    return TokenStates(
        block_inputs=states,
        mid_states=mid_states,
        projections=projections,
        token_mask=token_mask,
        layernorm_applied=any(n is not None for n in norms),
    )
