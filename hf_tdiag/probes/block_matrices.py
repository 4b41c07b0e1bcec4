"""Per-layer, per-head weight matrices of encoders (ViT-like, BERT-like) and CRATE, for spectral analysis.

The blocks and their modules come from :func:`hf_tdiag.probes.describe.describe` (one role vocabulary, one
role table; the accepted names are listed in :mod:`hf_tdiag.probes.families.encoders`). CRATE: Q = K = V = the
shared projection ``attention.qkv`` split by head, the output matrix is ``attention.output_matrix()`` (every
variant), and the ISTA dictionary ``ista.weight`` takes the place of the first FFN matrix with no second one.
CRATE-α: Q = K = V = ``attention.qkv`` by head, W_O = ``attention.out_proj``; its overcomplete dictionary ``D``
(role ``sparse_dictionary``) takes the place of the first FFN matrix (as the weight ``Dᵀ`` (r·d, d) of
``x ↦ Dᵀx``) and its decoder ``D₁`` (role ``sparse_decoder``) that of the second (``D₁`` (d, r·d) of ``a ↦ D₁a``).
Decoders are read through their :class:`~hf_tdiag.probes.decoders.DecoderLayout` instead (``describe(model).decoder``).

A block with layer scales (``z + γ ⊙ f(z)``: DINOv2, BEiT; :meth:`~hf_tdiag.probes.describe.BlockHandles.layer_scale`)
applies ``diag(γ₁) W_O`` and ``diag(γ₂) W_out``: those products are what is returned for ``attn_output`` and
``ffn_out`` (new tensors). Everything else is a detached view of the model's parameters in PyTorch ``(out, in)``
layout (no copies, no dtype or device change); per-head splits are reshapes only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .describe import BlockHandles, Description, describe
from .families.encoders import expected_text

__all__ = ["EncoderWeights", "LayerWeights", "encoder_weights"]


@dataclass
class LayerWeights:
    """One encoder layer's matrices, PyTorch ``(out, in)`` layout.

    ``query/key/value``: ``(H·d_h, N)``; ``attn_output``: ``(N, H·d_h)``;
    ``ffn_in``: ``(I, N)`` (CRATE: the ISTA dictionary ``D``, ``(N, N)``; CRATE-α: ``Dᵀ``, ``(r·N, N)``);
    ``ffn_out``: ``(N, I)`` (CRATE-α: ``D₁``), or ``None`` where the block has no second FFN matrix (CRATE).
    ``names`` maps each role to the module path it was read from.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_output: torch.Tensor
    ffn_in: torch.Tensor
    ffn_out: torch.Tensor | None
    names: dict[str, str] = field(default_factory=dict)


@dataclass
class EncoderWeights:
    """The encoder's layers plus the shapes the bound needs.

    ``family`` is ``"bert-like"`` (BERT/RoBERTa/ELECTRA/DistilBERT/ViT/DeiT layout), ``"crate"`` or the white-box
    family's name (``"crate-mae"``, ``"crate-alpha"``); ``ffn_in_type`` names the role of ``ffn_in`` in reports
    (``"m_in"``, ``"ista"`` for CRATE's square dictionary, ``"ista_d"`` for CRATE-α's ``D``), ``ffn_out_type`` that of
    ``ffn_out`` (``"m_out"``, ``"ista_d1"`` for CRATE-α's ``D₁``).
    """

    family: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    ffn_in_type: str
    layers: list[LayerWeights]
    layer_paths: list[str]
    ffn_out_type: str = "m_out"

    def heads(self, layer: int, role: str) -> torch.Tensor:
        """Per-head rows ``(H, d_h, N)``: W_Q,h / W_K,h / W_V,h (role query/key/value) or the rows of (W_O)ᵀ (role attn_output)."""
        lw = self.layers[layer]
        if role in ("query", "key", "value"):
            w = getattr(lw, role)
        elif role == "attn_output":
            w = lw.attn_output.mT
        else:
            raise ValueError(f"role: expected one of 'query', 'key', 'value', 'attn_output', got {role!r}")
        return w.reshape(self.num_heads, self.head_dim, self.hidden_size)


def _w(linear: nn.Module) -> torch.Tensor:
    return linear.weight.detach()


def _scaled(h: BlockHandles, branch: str, weight: torch.Tensor, names: dict, role: str) -> torch.Tensor:
    """``diag(γ) W``: the last matrix of a residual branch with its layer scale γ folded in (``W`` where none)."""
    gamma = h.layer_scale(branch)
    if gamma is None:
        return weight
    own = next(n for n, p in h.block.named_parameters() if p is gamma)
    names[role] = f"{h.path}.{own} ⊙ {names[role]}"
    return gamma.detach()[:, None] * weight


def _sparse_layer(h: BlockHandles, names: dict) -> LayerWeights:
    """CRATE-α's block: ``Dᵀ`` as ``ffn_in`` (the weight of ``x ↦ Dᵀx``), ``D₁`` as ``ffn_out``."""
    D, D1 = h.sparse_coding_weights()
    names.update(
        attn_output=h.paths["attn_output"],
        ffn_in=f"{h.paths['sparse_dictionary']}.D",
        ffn_out=f"{h.paths['sparse_decoder']}.D1",
    )
    return LayerWeights(
        query=_w(h.query),
        key=_w(h.key),
        value=_w(h.value),
        attn_output=h.output_weight().detach(),
        ffn_in=D.detach().mT,
        ffn_out=D1.detach(),
        names=names,
    )


def _layer(desc: Description, h: BlockHandles) -> LayerWeights:
    """One block's matrices; CRATE's ISTA dictionary stands in for ``ffn_in``, CRATE-α's ``D``/``D₁`` for both."""
    ista = h.ista is not None
    sparse = h.sparse_dictionary is not None
    if sparse:
        needed = ("attn_output", "sparse_dictionary", "sparse_decoder")
    else:
        needed = ("attn_output", "ista") if ista else ("attn_output", "ffn_in", "ffn_out")
    missing = [role for role in needed if h.module(role) is None]
    if missing:
        raise ValueError(
            f"model: unsupported architecture {desc.model_type!r}: block {h.index + 1} at {h.path!r} has no "
            f"{'/'.join(missing)} module (accepted names: {expected_text()})"
        )
    names = {role: h.paths[role] for role in ("query", "key", "value")}
    if sparse:
        return _sparse_layer(h, names)
    if ista:
        computed = hasattr(h.attn_output, "output_matrix")  # CRATE: the variant's matrix, not a parameter
        names.update(attn_output=h.paths["attn_output"] + (".output_matrix()" if computed else ""))
        names.update(ffn_in=f"{h.paths['ista']}.weight")
    else:
        names.update({role: h.paths[role] for role in ("attn_output", "ffn_in", "ffn_out")})
    return LayerWeights(
        query=_w(h.query),
        key=_w(h.key),
        value=_w(h.value),
        attn_output=_scaled(h, "attention", h.output_weight().detach(), names, "attn_output"),
        ffn_in=_w(h.ista if ista else h.ffn_in),
        ffn_out=None if ista else _scaled(h, "ffn", _w(h.ffn_out), names, "ffn_out"),
        names=names,
    )


def _check_shapes(layers: list[LayerWeights], num_heads: int) -> tuple[int, int, int]:
    """``(N, H·d_h, I)`` shared by every layer, or a ValueError naming the layer and matrix that differ."""
    q = layers[0].query
    n, inner = q.shape[1], q.shape[0]
    if inner % num_heads:
        raise ValueError(f"model: projection width {inner} is not divisible by the number of heads {num_heads}")
    inter = layers[0].ffn_in.shape[0]
    for i, lw in enumerate(layers):
        expect = {"query": (inner, n), "key": (inner, n), "value": (inner, n), "attn_output": (n, inner)}
        expect["ffn_in"] = (inter, n)
        if lw.ffn_out is not None:
            expect["ffn_out"] = (n, inter)
        for role, shape in expect.items():
            got = tuple(getattr(lw, role).shape)
            if got != shape:
                raise ValueError(
                    f"model: layer {i} {role} ({lw.names.get(role, role)}) has shape {got}, expected {shape} "
                    "(all layers must share hidden size, head layout and FFN width)"
                )
    return n, inner, inter


def encoder_weights(model: nn.Module | Description) -> EncoderWeights:
    """The Q, K, V, O and FFN (CRATE: ISTA) weights of every block of an encoder (see module docstring)."""
    desc = model if isinstance(model, Description) else describe(model)
    if desc.decoder is not None:
        raise ValueError(
            f"model: {desc.model_type!r} is a decoder; its weights are read through describe(model).decoder"
        )
    layers = [_layer(desc, h) for h in desc.layers]
    num_heads = desc.layers[-1].num_heads
    n, inner, inter = _check_shapes(layers, num_heads)
    crate = desc.layers[0].ista is not None
    sparse = desc.layers[0].sparse_dictionary is not None
    family = (
        "crate" if crate and desc.family == "crate" else "bert-like" if desc.family in ("vit", "bert") else desc.family
    )
    return EncoderWeights(
        family=family,
        model_type=desc.model_type,
        num_layers=len(layers),
        hidden_size=n,
        num_heads=num_heads,
        head_dim=inner // num_heads,
        intermediate_size=inter,
        ffn_in_type="ista" if crate else "ista_d" if sparse else "m_in",
        layers=layers,
        layer_paths=[h.path for h in desc.layers],
        ffn_out_type="ista_d1" if sparse else "m_out",
    )
