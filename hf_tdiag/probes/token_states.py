"""Per-block token states of one batch, read with forward hooks during one forward pass.

Blocks are numbered ℓ = 1…L as in the papers (code: ``layer[ℓ−1]``). For every
block: its input ``Z^{ℓ−1}`` (``block_inputs[ℓ−1]``; ``block_inputs[0]`` is the
embedding output ``Z^0``), for CRATE its mid state
``Z^{ℓ−½} = Z^{ℓ−1} + MSSA(LN₁(Z^{ℓ−1}))``, and its output ``Z^ℓ``
(``block_outputs[ℓ−1]``, what Transformers returns as ``hidden_states[ℓ]``).
With ``apply_layernorm=True`` each of block ℓ's states is passed through block
ℓ's own pre-attention LayerNorm (the official CRATE measurement measures the
normalised input; post-norm blocks such as BERT's have none and are left as
they are). With ``projection_source`` the forward pass's own head projections
are returned too: ``source_outputs[ℓ−1]`` is what block ℓ's
query/key/value (CRATE: ``qkv``) linear computed, bias removed, and
``projections[ℓ−1]`` the same tensor where its input is exactly the measured
``block_inputs[ℓ−1]`` (so a measure can skip recomputing ``U_kᵀZ``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from .._validation import check_block_outputs, check_model_inputs
from .describe import Description, describe
from .offload import execution_device, readable, runnable
from .subspaces import check_source, layer_projection

_NON_INPUT_KEYS = ("labels", "label", "label_ids")


@dataclass
class TokenStates:
    """Token states of one batch; lists are indexed by block, ``[ℓ−1]`` for block ℓ; tensors (B, N, d)."""

    block_inputs: list[torch.Tensor]  # Z^{ℓ−1} (or LN₁^ℓ(Z^{ℓ−1})); block_inputs[0] = Z^0, the embeddings
    mid_states: list[torch.Tensor] | None  # CRATE: Z^{ℓ−½} (or LN₁^ℓ(Z^{ℓ−½})); None otherwise
    block_outputs: list[torch.Tensor]  # Z^ℓ (or LN₁^ℓ(Z^ℓ)) = hidden_states[ℓ]
    projections: list[torch.Tensor | None] | None  # (B, K, N, p) projections of block_inputs[ℓ−1], or None
    token_mask: torch.Tensor | None  # (B, N) bool from the batch's attention_mask, or None
    layernorm_applied: bool  # True when block states were passed through a pre-attention LayerNorm
    source_outputs: list[torch.Tensor | None] | None = None  # (B, K, N, p) the source linear's own output
    causal: bool = False  # decoders: token t's state depends on tokens <= t only (see :func:`visible_tokens`)

    def visible_tokens(self) -> torch.Tensor | None:
        """``(B, N, N)`` bool: query token k attends to token t (t ≤ k for a causal model, both real tokens);
        None for an encoder without padding."""
        return visible_tokens(self.token_mask, self.causal, self.block_inputs[0].shape[1])


def visible_tokens(token_mask: torch.Tensor | None, causal: bool, num_tokens: int) -> torch.Tensor | None:
    """The attention visibility ``(B, N, N)`` (or ``(1, N, N)`` without a mask) of a causal and/or padded batch:
    ``visible[b, k, t]`` iff token t is real (``token_mask``) and, for a causal model, ``t ≤ k``; None when neither applies."""
    if token_mask is None and not causal:
        return None
    n = num_tokens
    vis = torch.ones(1, n, n, dtype=torch.bool) if token_mask is None else token_mask[:, None, :].expand(-1, n, -1)
    if causal:
        vis = vis & torch.ones(n, n, dtype=torch.bool, device=vis.device).tril()
    return vis


def model_device(model: nn.Module) -> torch.device:
    """Device of the model's first parameter (CPU for a parameterless module; an Accelerate-offloaded model whose first
    parameter rests on ``meta``: its hooks' execution device)."""
    for param in model.parameters():
        if param.device.type == "meta":
            return execution_device(model) or param.device
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
            if key == "pixel_values" and not value.is_floating_point():
                raise TypeError(
                    f"inputs: pixel_values must be floating point (run the model's image processor), got {value.dtype}"
                )
            check_model_inputs({key: value})  # NaN/inf or overflowing values, named with their position
            value = value.to(
                device=device, dtype=dtype if value.is_floating_point() else value.dtype, non_blocking=True
            )
        out[key] = value
    return out


def _first_tensor(args, kwargs) -> torch.Tensor:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    for key in ("hidden_states", "x", "hidden_state"):
        if isinstance(kwargs.get(key), torch.Tensor):
            return kwargs[key]
    raise ValueError("model: could not read a block's input hidden states in its forward pre-hook")


def _block_output(output) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


def _heads(out: torch.Tensor, linear: nn.Linear, head_dim: int) -> torch.Tensor:
    """A source linear's output (B, N, K·p) without its bias, as (B, K, N, p)."""
    if linear.bias is not None:
        out = out - linear.bias
    return out.unflatten(-1, (out.shape[-1] // head_dim, head_dim)).movedim(-2, -3)


def _register(arch, captured, norms, want_mid, linears):
    """Forward hooks filling ``captured`` (block inputs, outputs, mids, LN outputs, source linear I/O)."""

    def pre_hook(i):
        def fn(module, args, kwargs):
            captured["input"][i] = _first_tensor(args, kwargs)

        return fn

    def post_hook(i):
        def fn(module, args, output):
            captured["output"][i] = _block_output(output)
            if want_mid:
                captured["mid"][i] = output[1]

        return fn

    def store(key, i, io=False):
        def fn(module, args, output):
            captured[key][i] = (args[0], output) if io else output

        return fn

    hooks = []
    for i, handles in enumerate(arch.layers):
        hooks.append(handles.block.register_forward_pre_hook(pre_hook(i), with_kwargs=True))
        hooks.append(handles.block.register_forward_hook(post_hook(i)))
        if norms[i] is not None:
            hooks.append(norms[i].register_forward_hook(store("normed", i)))
        if linears:
            hooks.append(linears[i].register_forward_hook(store("source", i, io=True)))
    return hooks


def _source_linears(arch: Description, projection_source: str | None) -> list[nn.Linear]:
    """Each block's ``projection_source`` linear, whose forward a hook reads; none without a source, or when layers
    share one (weight-tied: whose projection a hook saw is ambiguous)."""
    if projection_source is None:
        return []
    check_source(projection_source)
    linears = [layer_projection(arch, i, projection_source) for i in range(arch.num_layers)]
    return linears if len({id(m) for m in linears}) == len(linears) else []


def _check_captured(captured: dict, norms: list, kwargs: dict) -> None:
    """The captured block states are finite, and every block (and its LayerNorm, when applied) ran."""
    check_block_outputs([captured["input"][0], *captured["output"]], kwargs, start=0)
    missing = [
        i + 1
        for i in range(len(norms))
        if captured["output"][i] is None or (norms[i] is not None and captured["normed"][i] is None)
    ]
    if missing:
        raise ValueError(f"model: the forward pass did not run blocks {missing}; cannot read their token states")


def _block_states(model: nn.Module, captured: dict, norms: list, want_mid: bool):
    """``(inputs, outputs, mids)`` of every block, each through the block's LayerNorm when one is applied (the
    inputs' normalised form is the one its forward computed; mids None unless ``want_mid``)."""
    L = len(norms)
    norm = [(lambda z, n=n: n(z)) if n is not None else (lambda z: z) for n in norms]
    inputs = [captured["normed"][i] if norms[i] is not None else captured["input"][i] for i in range(L)]
    with runnable(model, *[n for n in norms if n is not None]):  # offloaded blocks: their norms' weights
        outputs = [norm[i](captured["output"][i]) for i in range(L)]
        mid_states = [norm[i](captured["mid"][i]) for i in range(L)] if want_mid else None
    return inputs, outputs, mid_states


def _projections(model: nn.Module, arch: Description, captured: dict, linears: list, inputs: list):
    """``(source_outputs, projections)``: each source linear's output as heads, bias removed, and the same where its
    input is exactly the measured block input (else None)."""
    L = arch.num_layers
    source_outputs, projections = [None] * L, [None] * L
    for i, got in enumerate(captured["source"]):
        if got is not None:
            with readable(model, linears[i]):  # an offloaded linear's bias
                source_outputs[i] = _heads(got[1], linears[i], arch.layers[i].head_dim)
            projections[i] = source_outputs[i] if got[0] is inputs[i] else None
    return source_outputs, projections


def _token_mask(kwargs: dict, inputs: list) -> torch.Tensor | None:
    """The batch's (B, N) attention mask as bool, when it is one per token of the block states."""
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.ndim == 2 and mask.shape == inputs[0].shape[:2]:
        return mask.bool()
    return None


def token_states(
    model: nn.Module,
    batch,
    *,
    apply_layernorm: bool = False,
    mid: bool = True,
    projection_source: str | None = None,
    arch: Description | None = None,
    grad: bool = False,
) -> TokenStates:
    """Run ``model`` on ``batch`` once and return every block's token states (see module docstring).

    ``projection_source`` (``query``/``key``/``value``): also return the forward pass's own projections
    (``source_outputs``, and ``projections`` where they are projections of the measured block inputs).
    ``grad=False`` runs under ``torch.no_grad()``.
    """
    arch = arch or describe(model)
    linears = _source_linears(arch, projection_source)
    captured = {key: [None] * arch.num_layers for key in ("input", "output", "mid", "normed", "source")}
    want_mid = mid and arch.family == "crate"
    norms = [h.attention_norm if apply_layernorm else None for h in arch.layers]
    hooks = _register(arch, captured, norms, want_mid, linears)
    try:
        kwargs = forward_kwargs(arch.base_model, batch)
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            arch.base_model(**kwargs)
            _check_captured(captured, norms, kwargs)
            inputs, outputs, mid_states = _block_states(model, captured, norms, want_mid)
    finally:
        for h in hooks:
            h.remove()
    source_outputs = projections = None
    if projection_source:
        source_outputs, projections = _projections(model, arch, captured, linears, inputs)
    return TokenStates(
        block_inputs=inputs,
        mid_states=mid_states,
        block_outputs=outputs,
        projections=projections,
        token_mask=_token_mask(kwargs, inputs),
        layernorm_applied=any(n is not None for n in norms),
        source_outputs=source_outputs,
        causal=arch.causal,
    )
