"""What the concept bound's constants read from a model: each suffix block's pieces and states, its outputs on ``Ẑ``,
float64 copies for Jacobians.

* :func:`block_pieces` — a block's two norms (parameters, and their inputs/outputs on the data states ``Z``, read
  with forward hooks), its attention weights in ``nn.Linear`` layout and its residual branch (an MLP, CRATE's ISTA
  dictionary or CRATE-α's sparse coding); weights copied in float64 (an offloaded block's read from its store), a
  layer scale ``γ`` folded into its branch's last matrix (``diag(γ) W_O``, ``diag(γ) W_out``);
* :func:`attention_pieces` — the attention input and value/output heads of block ℓ+1, for ``α``;
* :func:`readout_pieces`, :func:`head_weight` — the readout's norm or pooler weight, the head's ``W_c``;
* :func:`suffix_outputs` — the suffix blocks run on ``Ẑ`` (the realised ratios' numerators);
* :func:`float64_block`, :func:`float64_readout` — float64 copies to differentiate.

No constant is computed here: the formulas are :mod:`hf_tdiag.measures.concepts` (``certified``, ``chain``,
``alpha``), composed by :mod:`hf_tdiag.diagnostics.concept_fidelity.constants`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..measures.concepts.alpha import Norm
from .concept_model import ConceptModel, LayerActivations
from .offload import plain_copy, readable, runnable

__all__ = [
    "BlockPieces",
    "block_pieces",
    "attention_pieces",
    "readout_pieces",
    "head_weight",
    "suffix_outputs",
    "float64_block",
    "float64_readout",
]


def _f64(t: torch.Tensor | None) -> torch.Tensor | None:
    """A float64 copy (its own storage: an offloaded weight goes back to meta after reading)."""
    return None if t is None else t.detach().to(torch.float64, copy=True)


def _branch_output(h, branch: str, weight: torch.Tensor) -> torch.Tensor:
    """The last matrix of a residual branch in float64 with the block's layer scale folded in: ``diag(γ) W``."""
    gamma = h.layer_scale(branch)
    return _f64(weight) if gamma is None else _f64(gamma)[:, None] * _f64(weight)


def _norm(module) -> Norm:
    return Norm(_f64(getattr(module, "weight", None)), _f64(getattr(module, "bias", None)), module.eps)


def _block_norms(h) -> tuple:
    """The block's two LayerNorms in forward order (pre-norm: before/after; post-norm: attention/output)."""
    if h.attention_norm is None:
        return h.attention_post_norm, h.ffn_post_norm
    return h.attention_norm, h.ffn_norm


@torch.no_grad()
def _norm_states(cm: ConceptModel, h, Z: torch.Tensor) -> list:
    """``[(input, output)]`` of the block's two LayerNorms when the block runs on the data states ``Z``."""
    seen = []
    hooks = [
        m.register_forward_hook(lambda mod, inp, out: seen.append((inp[0].detach(), out.detach())))
        for m in _block_norms(h)
    ]
    try:
        with runnable(cm.model, h.block):
            cm.block_forward(h.block, Z)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def _attention_weights(h) -> dict:
    W_o = h.output_weight()
    if W_o is None:
        raise ValueError(f"model: block {h.index + 1} has no attention output projection")
    return {
        "W_q": _f64(h.query.weight),
        "W_k": _f64(h.key.weight),
        "W_v": _f64(h.value.weight),
        "W_o": _branch_output(h, "attention", W_o),
        "b_q": _f64(h.query.bias),
        "b_k": _f64(h.key.bias),
        "num_heads": h.num_heads,
        "scaling": h.head_dim**-0.5,
    }


@dataclass
class BlockPieces:
    """One block as the certified chain reads it (``docs/concept_bound.md`` §6)."""

    post_norm: bool  # BERT: Z½ = LN₁(Z + Attn Z), Z⁺ = LN₂(Z½ + MLP Z½); else pre-norm
    ln1: Norm
    ln2: Norm
    ln1_in: torch.Tensor  # the norms' inputs and outputs on the data states
    ln1_out: torch.Tensor
    ln2_in: torch.Tensor
    attention: dict  # W_q, W_k, W_v, W_o, b_q, b_k, num_heads, scaling (nn.Linear layout, float64)
    branch: str  # "mlp" | "ista" (no residual around it) | "sparse"
    branch_weights: tuple  # mlp: (W_in, W_out); ista: (D,); sparse: (D, D1)
    step_size: float | None  # ISTA / sparse coding η
    activation: str | None  # the MLP's hidden_act


def _branch(cm: ConceptModel, h, post_norm: bool) -> tuple:
    """``(kind, weights, step size, activation)`` of the block's second sub-layer."""
    if not post_norm and h.ista is not None:
        return "ista", (_f64(h.ista.weight),), h.ista.step_size, None
    sparse = None if post_norm else h.sparse_coding_weights()
    if sparse is not None:
        return "sparse", tuple(_f64(w) for w in sparse), h.sparse_dictionary.step_size, None
    return "mlp", (_f64(h.ffn_in.weight), _branch_output(h, "ffn", h.ffn_out.weight)), None, cm.model.config.hidden_act


def block_pieces(cm: ConceptModel, index: int, Z: torch.Tensor) -> BlockPieces:
    """Block ``index`` (0-based) read on its data input states ``Z`` (inputs, T, d)."""
    h = cm.arch.layers[index]
    (y1, x1), (y2, _) = _norm_states(cm, h, Z)
    post_norm = cm.family == "bert"
    with readable(cm.model, h.block):  # an offloaded block's weights, read after its forward pass above
        ln1, ln2 = (_norm(m) for m in _block_norms(h))
        branch, weights, step, act = _branch(cm, h, post_norm)
        return BlockPieces(post_norm, ln1, ln2, y1, x1, y2, _attention_weights(h), branch, weights, step, act)


@dataclass
class AttentionPieces:
    """Block ℓ+1's attention as ``α`` reads it: its norm and input on the data (pre-norm), its heads."""

    norm: Norm | None  # None: post-norm, the attention reads Z itself
    attention_input: torch.Tensor | None  # LN₁(Z) on the data (pre-norm)
    heads: list  # [(W_V^k, W_O^k)] float64
    head_dim: int


def _value_output_heads(h) -> list:
    p = h.head_dim
    Wv, Wo = _f64(h.value.weight), _branch_output(h, "attention", h.output_weight())
    return [(Wv[k * p : (k + 1) * p], Wo[:, k * p : (k + 1) * p]) for k in range(h.num_heads)]


@torch.no_grad()
def attention_pieces(cm: ConceptModel, layer: int, Z: torch.Tensor) -> AttentionPieces:
    """Block ``layer + 1`` (the first suffix block; ``layer < num_layers``) on its data input states ``Z``."""
    h = cm.arch.layers[layer]
    norm = h.attention_norm
    X = None if norm is None else _norm_states(cm, h, Z)[0][1]  # the forward pass before the block's weights are read
    with readable(cm.model, h.block):  # an offloaded block's weights
        return AttentionPieces(None if norm is None else _norm(norm), X, _value_output_heads(h), h.head_dim)


@dataclass
class ReadoutPieces:
    """The readout between the last block and the head: BERT's pooler weight, or pooling and a LayerNorm."""

    pooler_weight: torch.Tensor | None  # BERT: W_p of tanh(W_p z_CLS + b_p)
    norm: Norm | None  # CRATE/ViT: the final LayerNorm
    pooling: str


def readout_pieces(cm: ConceptModel) -> ReadoutPieces:
    """The readout's weights (an offloaded readout's read from its offload store)."""
    with readable(cm.model, *cm.readout_modules):
        if cm.family == "bert":
            return ReadoutPieces(_f64(cm.readout_modules[0].dense.weight), None, cm.pooling)
        return ReadoutPieces(None, _norm(cm.readout_modules[0]), cm.pooling)


def head_weight(cm: ConceptModel) -> torch.Tensor:
    """``W_c`` of the head (an offloaded head's weight read from its offload store)."""
    with readable(cm.model, cm.head):
        return _f64(cm.head.weight)


@torch.no_grad()
def suffix_outputs(cm: ConceptModel, acts: LayerActivations, A_hat: torch.Tensor, layer: int) -> list:
    """``Ẑ^ℓ, Ẑ^{ℓ+1}, …, Ẑ^L``: the layer-ℓ states with the concept tokens replaced by ``Â``, then each suffix block's
    output on the previous one."""
    z_hat = acts.frame.index_copy(1, acts.positions, A_hat.to(acts.frame))
    out = [z_hat]
    for block in list(cm.blocks)[layer:]:
        with runnable(cm.model, block):
            z_hat = cm.block_forward(block, z_hat)
        out.append(z_hat)
    return out


def float64_block(cm: ConceptModel, module):
    """A float64 copy of ``module`` (a part of ``cm.model``; without Accelerate hooks, offloaded weights made real)."""
    return plain_copy(cm.model, module).to(torch.float64).eval()


def float64_readout(cm: ConceptModel):
    """The readout (pooling, then the readout modules) on float64 copies: ``Z^L (inputs, T, d) -> head features``."""
    mods = [float64_block(cm, m) for m in cm.readout_modules]
    if cm.family == "bert":
        return lambda x: mods[0](x)
    pooling = cm.pooling

    def readout(x):
        pooled = x[:, 0] if pooling == "cls" else (x[:, -1] if pooling == "last" else x.mean(dim=1))
        return mods[0](pooled)

    return readout
