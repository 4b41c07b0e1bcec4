"""The certified chain: per-token radii through one block and the readout to the head's input (docs/concept_bound.md
§2, §6, §8).

Token t of ``Ẑ`` stays within ``e_t`` of the data's ``z_t``; each block maps these radii to output radii and is
Lipschitz on that domain with the constant ``L_j`` of section 6, composed from the per-piece constants of
:mod:`.certified`. The head's input then moves by at most ``Δ = min(Δ_readout, L_readout Π_j L_j δ_rec)``.
"""

from __future__ import annotations

import math

import torch

from .alpha import Norm
from .certified import (
    attention_deviation,
    attention_lipschitz,
    layernorm_deviation,
    layernorm_lipschitz,
    layernorm_output_norm,
    op_norm,
)

__all__ = [
    "token_radii",
    "layernorm_matrix_norm",
    "prenorm_block_certified",
    "postnorm_block_certified",
    "pooler_readout_certified",
    "layernorm_readout_certified",
    "suffix_gain",
    "head_input_deviation",
]


def token_radii(A: torch.Tensor, A_hat: torch.Tensor, positions: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """``e_t = ‖â_t − a_t‖`` at the concept ``positions`` of ``n_tokens`` tokens, 0 at the untouched ones (inputs, T)."""
    e = torch.zeros(A.shape[0], n_tokens, dtype=torch.float64, device=A.device)
    err = (A_hat.to(A).double() - A.double()).norm(dim=-1)
    return e.index_copy(1, positions, err)


def layernorm_matrix_norm(norm: Norm, n_tokens: int, d: int) -> float:
    """``‖X‖_F ≤ √T (γ_max √d + ‖β‖)`` for a matrix of ``T`` LayerNorm outputs."""
    return math.sqrt(n_tokens) * layernorm_output_norm(norm.weight, norm.bias, d)


def _per_token(radius: torch.Tensor, n_tokens: int, device) -> torch.Tensor:
    """A radius per input ``(inputs,)`` (every token may move that far) or per token, as ``(inputs, T)`` float64."""
    e = radius.double().to(device)
    return e[:, None].expand(-1, n_tokens) if e.ndim == 1 else e


def _layernorm(inputs: torch.Tensor, radius: torch.Tensor, norm: Norm) -> tuple:
    """``(L_LN, e')``: the Lipschitz bound on the per-token domain and each token's move bound."""
    return (
        layernorm_lipschitz(inputs, radius, norm.weight, norm.eps),
        layernorm_deviation(inputs, radius, norm.weight, norm.eps),
    )


def _attention(X: torch.Tensor, radius: torch.Tensor, weights: dict, cap: float | None) -> tuple:
    """``(L_attn on ‖Y − X‖_F ≤ ‖radius‖₂, per-token move bound)``; ``weights`` as :func:`.certified.attention_deviation`."""
    lipschitz = {k: v for k, v in weights.items() if k != "b_k"}
    return (
        attention_lipschitz(X, radius.norm(dim=-1), **lipschitz, x_norm_cap=cap),
        attention_deviation(X, radius, **weights),
    )


def _capped(e_out: torch.Tensor, lip: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Each token moves at most the whole Frobenius distance, which the Lipschitz bound also controls."""
    return torch.minimum(e_out, (lip * e.norm(dim=-1))[:, None])


def prenorm_block_certified(
    radius: torch.Tensor,
    ln1_in: torch.Tensor,
    ln1_out: torch.Tensor,
    ln2_in: torch.Tensor,
    ln1: Norm,
    ln2: Norm,
    attention: dict,
    branch: float,
    residual: bool,
) -> tuple:
    """``(L, e')`` of ``Z½ = Z + Attn(LN₁ Z)``, ``Z⁺ = Z½ + f(LN₂ Z½)`` (``residual``: ViT's MLP, CRATE-α's sparse
    coding) or ``Z⁺ = f(LN₂ Z½)`` (CRATE's ISTA): ``L = (1 + L_attn L_LN₁)(1 + L_f L_LN₂)`` or
    ``(1 + L_attn L_LN₁) L_f L_LN₂``, with ``branch = L_f``; ``ln1_in = Z``, ``ln1_out``, ``ln2_in`` the data's
    states at the two norms."""
    T, d = ln1_in.shape[-2], ln1_in.shape[-1]
    e = _per_token(radius, T, ln1_in.device)
    l_ln1, e_x = _layernorm(ln1_in, e, ln1)
    l_att, d_att = _attention(ln1_out, e_x, attention, layernorm_matrix_norm(ln1, T, d))
    sub1, e_mid = 1 + l_att * l_ln1, e + d_att
    l_ln2, e_y = _layernorm(ln2_in, e_mid, ln2)
    if residual:
        lip, e_out = sub1 * (1 + branch * l_ln2), e_mid + branch * e_y
    else:
        lip, e_out = sub1 * branch * l_ln2, branch * e_y
    return lip, _capped(e_out, lip, e)


def postnorm_block_certified(
    radius: torch.Tensor,
    Z: torch.Tensor,
    ln1_in: torch.Tensor,
    ln2_in: torch.Tensor,
    ln1: Norm,
    ln2: Norm,
    attention: dict,
    l_ffn: float,
    input_cap: float | None = None,
) -> tuple:
    """``(L, e')`` of ``Z½ = LN₁(Z + Attn Z)``, ``Z⁺ = LN₂(Z½ + MLP Z½)`` (BERT):
    ``L = L_LN₁ (1 + L_attn) L_LN₂ (1 + L_MLP)``; ``input_cap`` a bound on ``‖Z‖_F`` over the whole domain."""
    e = _per_token(radius, Z.shape[-2], Z.device)
    l_att, d_att = _attention(Z, e, attention, input_cap)
    l_ln1, e_mid = _layernorm(ln1_in, e + d_att, ln1)
    l_ln2, e_out = _layernorm(ln2_in, (1 + l_ffn) * e_mid, ln2)
    lip = l_ln1 * (1 + l_att) * l_ln2 * (1 + l_ffn)
    return lip, _capped(e_out, lip, e)


def pooler_readout_certified(W_p: torch.Tensor, e_cls: torch.Tensor) -> tuple:
    """``(L_readout, Δ_readout)`` of BERT's pooler ``tanh(W_p z_CLS + b_p)``: ``‖W_p‖_op`` and
    ``min(‖W_p‖_op e_CLS, 2√d)`` (tanh outputs lie in ``[-1, 1]^d``)."""
    w = float(op_norm(W_p))
    e = e_cls.double()
    cap = 2.0 * math.sqrt(W_p.shape[0])
    return torch.full_like(e, w), torch.minimum(w * e, torch.full_like(e, cap))


def layernorm_readout_certified(Z_last: torch.Tensor, e_last: torch.Tensor, pooling: str, norm: Norm) -> tuple:
    """``(L_readout, Δ_readout)`` of pooling then a LayerNorm: the CLS token (factor 1, its own radius) or the token
    mean (factor ``1/√T``, the mean radius), times ``L_LN`` on the pooled data token's domain."""
    e = e_last.double().to(Z_last.device)
    cls = pooling == "cls"
    pooled = (Z_last[:, :1] if cls else Z_last.mean(dim=1, keepdim=True)).double()
    radius = e[:, :1] if cls else e.mean(dim=1, keepdim=True)
    pool = 1.0 if cls else 1.0 / math.sqrt(Z_last.shape[1])
    lip = pool * layernorm_lipschitz(pooled, radius, norm.weight, norm.eps)
    return lip, layernorm_deviation(pooled, radius, norm.weight, norm.eps)[:, 0]


def suffix_gain(l_blocks: torch.Tensor) -> torch.Tensor:
    """``Π_j L_j`` per input of the suffix blocks' constants ``(inputs, blocks)`` (1 without blocks)."""
    return l_blocks.prod(1)


def head_input_deviation(
    readout_deviation: torch.Tensor, l_readout: torch.Tensor, gain: torch.Tensor, delta_rec: torch.Tensor
) -> torch.Tensor:
    """``Δ = min(Δ_readout, L_readout Π_j L_j δ_rec)``: how far the head's input moves, certified."""
    return torch.minimum(readout_deviation, l_readout * gain * delta_rec)
