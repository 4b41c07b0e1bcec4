"""The constants of the concept-fidelity KL bound, twice and never mixed: certified and estimated.

The seed's bound ``KL ≤ ½‖W_c‖²_op L_block^{2 L_suf} (√N δ_rec + α‖G‖_F δ_gram)²`` (with the readout factor
``L_readout`` derived in ``docs/concept_bound.md``) is evaluated with

* :func:`certified_constants` — upper bounds, per input, on the domain the reconstruction's trajectory provably
  stays in: at layer ℓ token t of ``Ẑ`` is ``e_t = ‖â_t − a_t‖`` from the data's (0 for untouched tokens,
  ``‖e‖₂ = δ_rec``); block j maps these token radii to certified output radii and is Lipschitz on the domain
  ``{Y : ‖y_t − z^j_t‖ ≤ e_t}`` with the constant ``L_j`` of :mod:`hf_tdiag.measures.concepts.certified`
  (LayerNorms from each token's centred norm minus its radius, attention from the data's ``‖X M_k‖``,
  ``‖X B_k‖`` plus the radius, feed-forward/ISTA from operator norms, residuals ``1 + …``). Every constant is
  computed from the weights, the data's measured states and the reconstruction errors (no forward pass on
  ``Â``); ``head_input_deviation`` bounds how far the head's input moves.
  ``α`` is the seed's attention-projection constant ``γ_max²/(2√p s²) · ‖X‖_op Σ_k ‖W_V^k‖‖W_O^k‖`` of block
  ℓ+1 with ``s`` the smallest token scale and ``‖X‖_op`` the largest attention-input norm on the ball.
* :func:`estimate_constants` — local estimates at the data (power-iteration Jacobian norms and the realised
  ratios along the concept path; α at the data's median token scale). **They err low**, each for a stated reason:
  the power iteration's ``‖J v‖`` (unit ``v``) is at most the Jacobian norm at the data, which is at most the sup
  on the domain; a realised ratio ``‖f(Ẑ) − f(Z)‖/‖Ẑ − Z‖`` is at most the sup of the Jacobian norm on the segment
  (mean-value inequality); the median token scale is at least the smallest one, which α divides by. So every
  estimate is at most its certified counterpart, and ``bound_estimated`` may fall below the KL (an observation, not
  a theorem). ``tests/test_concept_constants_direction.py`` checks each direction on random models, inputs and
  reconstructions.
"""

from __future__ import annotations

import math

import torch

from .._progress import tqdm
from ..measures.concepts import jacobian_spectral_norm
from ..measures.concepts.certified import (
    attention_deviation,
    attention_lipschitz,
    feed_forward_lipschitz,
    ista_lipschitz,
    layernorm_deviation,
    layernorm_lipschitz,
    layernorm_output_norm,
    op_norm,
    sparse_coding_lipschitz,
)
from .concept_decoder import alpha_estimated
from .concept_model import ConceptModel, LayerActivations
from .offload import plain_copy, readable, runnable

__all__ = ["certified_constants", "estimate_constants", "block_lipschitz_certified"]


# --------------------------------------------------------------------------- what each block is made of


def _block_norms(h) -> tuple:
    """The block's two LayerNorms in forward order (pre-norm: before/after; post-norm: attention/output)."""
    if h.attention_norm is None:
        return h.attention_post_norm, h.ffn_post_norm
    return h.attention_norm, h.ffn_norm


@torch.no_grad()
def _norm_inputs(cm: ConceptModel, h, Z: torch.Tensor) -> list:
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
        "W_q": h.query.weight,
        "W_k": h.key.weight,
        "W_v": h.value.weight,
        "W_o": W_o.detach(),
        "b_q": h.query.bias,
        "num_heads": h.num_heads,
        "scaling": h.head_dim**-0.5,
    }


def _ln(norm, inputs, radius):
    """(Lipschitz bound on the per-token domain, per-token deviation bound) of a LayerNorm."""
    return (
        layernorm_lipschitz(inputs, radius, norm.weight, norm.eps),
        layernorm_deviation(inputs, radius, norm.weight, norm.eps),
    )


def _attention(h, X, radius, cap=None):
    """(Lipschitz bound on ``‖Y − X‖_F ≤ ‖radius‖₂``, per-token deviation bound) of a block's attention."""
    w = _attention_weights(h)
    lip = attention_lipschitz(X, radius.norm(dim=-1), **w, x_norm_cap=cap)
    dev = attention_deviation(X, radius, **w, b_k=h.key.bias)
    return lip, dev


def _ffn_lipschitz(cm: ConceptModel, h) -> float:
    """Lipschitz constant of a pre-norm block's residual branch after LN2: an MLP, or CRATE-α's sparse coding."""
    sparse = h.sparse_coding_weights()
    if sparse is not None:
        return sparse_coding_lipschitz(*sparse, h.sparse_dictionary.step_size)
    return feed_forward_lipschitz(h.ffn_in.weight, h.ffn_out.weight, cm.model.config.hidden_act)


def block_lipschitz_certified(
    cm: ConceptModel, index: int, Z: torch.Tensor, radius: torch.Tensor, capped_input: bool = False
) -> tuple:
    """``(L, e')`` for block ``index`` on the inputs whose token t stays within ``radius[:, t]`` of the data ``Z``:
    ``L`` (per input) bounds the block's Lipschitz constant there, ``e'`` (per input and token) each output
    token's move (see the module doc). A radius per input ``(inputs,)`` is a Frobenius ball (every token may
    move that far). ``capped_input``: the block's input is a LayerNorm output (post-norm blocks after the first
    suffix block), which bounds ``‖Y‖_F`` independently of the radius.
    """
    h = cm.arch.layers[index]
    (y1, x1), (y2, _) = _norm_inputs(cm, h, Z)
    with readable(cm.model, h.block):  # an offloaded block's weights, read after its forward pass above
        return _block_certified(cm, h, Z, radius, capped_input, (y1, x1, y2))


def _block_certified(cm: ConceptModel, h, Z: torch.Tensor, radius: torch.Tensor, capped_input: bool, seen) -> tuple:
    y1, x1, y2 = seen
    ln1, ln2 = _block_norms(h)
    T, d = Z.shape[-2], Z.shape[-1]
    e = radius.double().to(Z.device)
    e = e[:, None].expand(-1, T) if e.ndim == 1 else e
    if cm.family == "bert":  # Z½ = LN1(Z + Attn(Z)), Z⁺ = LN2(Z½ + FFN(Z½))
        cap = math.sqrt(T) * layernorm_output_norm(ln2.weight, ln2.bias, d) if capped_input else None
        l_att, d_att = _attention(h, Z, e, cap)
        l_ln1, e_mid = _ln(ln1, y1, e + d_att)
        l_ffn = feed_forward_lipschitz(h.ffn_in.weight, h.ffn_out.weight, cm.model.config.hidden_act)
        l_ln2, e_out = _ln(ln2, y2, (1 + l_ffn) * e_mid)
        lip = l_ln1 * (1 + l_att) * l_ln2 * (1 + l_ffn)
    else:  # pre-norm: Z½ = Z + Attn(LN1(Z)); CRATE (and CRATE-MAE) Z⁺ = ISTA(LN2(Z½)), ViT Z⁺ = Z½ + FFN(LN2(Z½)),
        # CRATE-α Z⁺ = Z½ + D₁a₂(LN2(Z½))
        l_ln1, e_x = _ln(ln1, y1, e)
        l_att, d_att = _attention(h, x1, e_x, math.sqrt(T) * layernorm_output_norm(ln1.weight, ln1.bias, d))
        sub1, e_mid = 1 + l_att * l_ln1, e + d_att
        l_ln2, e_y = _ln(ln2, y2, e_mid)
        if h.ista is not None:
            l_ista = ista_lipschitz(h.ista.weight, h.ista.step_size)
            lip, e_out = sub1 * l_ista * l_ln2, l_ista * e_y
        else:
            l_ffn = _ffn_lipschitz(cm, h)
            lip, e_out = sub1 * (1 + l_ffn * l_ln2), e_mid + l_ffn * e_y
    # each token moves at most the whole Frobenius distance, which the Lipschitz bound also controls
    return lip, torch.minimum(e_out, (lip * e.norm(dim=-1))[:, None])


# --------------------------------------------------------------------------- the readout and α


def _pool_factor(cm: ConceptModel, T: int) -> float:
    """Lipschitz constant of the pooling in Frobenius norm: 1 (CLS token), 1/√T (token mean)."""
    return 1.0 if cm.pooling == "cls" else 1.0 / math.sqrt(T)


def readout_certified(cm: ConceptModel, Z_last: torch.Tensor, e_last: torch.Tensor) -> tuple:
    """``(L_readout, deviation)`` per input: the readout's Lipschitz bound on the per-token domain ``e_last`` around
    ``Z^L`` (pooling × LayerNorm for CRATE/ViT; ``‖W_p‖_op`` for BERT's pooler ``tanh(W_p z + b)``), and a bound on
    how far the head's input moves (the CLS token's own radius, or the mean radius for mean pooling)."""
    with readable(cm.model, *cm.readout_modules):  # offloaded readout modules
        return _readout_certified(cm, Z_last, e_last)


def _readout_certified(cm: ConceptModel, Z_last: torch.Tensor, e_last: torch.Tensor) -> tuple:
    e = e_last.double().to(Z_last.device)
    if cm.family == "bert":
        dense = cm.readout_modules[0].dense
        w = float(op_norm(dense.weight))
        cap = 2.0 * math.sqrt(dense.weight.shape[0])  # tanh outputs lie in [-1, 1]^d
        return torch.full_like(e[:, 0], w), torch.minimum(w * e[:, 0], torch.full_like(e[:, 0], cap))
    norm = cm.readout_modules[0]
    pooled = (Z_last[:, :1] if cm.pooling == "cls" else Z_last.mean(dim=1, keepdim=True)).double()
    radius = e[:, :1] if cm.pooling == "cls" else e.mean(dim=1, keepdim=True)
    lip = _pool_factor(cm, Z_last.shape[1]) * layernorm_lipschitz(pooled, radius, norm.weight, norm.eps)
    return lip, layernorm_deviation(pooled, radius, norm.weight, norm.eps)[:, 0]


def _value_output_gain(h) -> float:
    """``Σ_k ‖W_V^k‖_op ‖W_O^k‖_op`` of a block's attention."""
    p = h.head_dim
    Wv, Wo = h.value.weight.detach().double(), h.output_weight().detach().double()
    return sum(
        float(op_norm(Wv[k * p : (k + 1) * p])) * float(op_norm(Wo[:, k * p : (k + 1) * p])) for k in range(h.num_heads)
    )


def _token_scale(Z: torch.Tensor, eps: float) -> torch.Tensor:
    """Per token ``√(var z + ε)``: what LayerNorm divides by."""
    return torch.sqrt(Z.double().var(dim=-1, unbiased=False) + eps)


@torch.no_grad()
def alpha_constants(cm: ConceptModel, layer: int, Z: torch.Tensor, radius: torch.Tensor) -> tuple:
    """Per input ``(α certified, α estimated)`` of block ℓ+1 (zeros when no block follows ℓ).

    ``α = γ_max²/(2√p s²) · ‖X‖_op · Σ_k‖W_V^k‖‖W_O^k‖`` with ``X`` the attention input (``LN₁(Z)`` pre-norm, ``Z``
    post-norm): certified with the smallest token scale and the largest ``‖X‖_op`` on the per-token domain
    ``radius`` (inputs, T), estimated with the median token scale and ``‖X‖_op`` of the data.
    """
    zeros = torch.zeros(Z.shape[0], dtype=torch.float64, device=Z.device)
    if layer >= cm.num_layers:
        return zeros, zeros
    h = cm.arch.layers[layer]
    e = radius.double().to(Z.device)
    norm = h.attention_norm
    X = None if norm is None else _norm_inputs(cm, h, Z)[0][1]  # the forward pass before the block's weights are read
    with readable(cm.model, h.block):  # an offloaded block's weights
        gain = _value_output_gain(h) / (2.0 * math.sqrt(h.head_dim))
        if norm is None:  # post-norm: the attention reads Z itself
            x_op = op_norm(Z)
            return gain * (x_op + e.norm(dim=-1)), gain * x_op
        return _alpha_prenorm(norm, Z, X, e, gain)


def _alpha_prenorm(norm, Z: torch.Tensor, X: torch.Tensor, e: torch.Tensor, gain: float) -> tuple:
    g2 = float(norm.weight.detach().double().abs().max()) ** 2 if norm.weight is not None else 1.0
    Zd = Z.double()
    m = (Zd - Zd.mean(-1, keepdim=True)).norm(dim=-1)
    s2_cert = ((m - e).clamp(min=0).square() / Z.shape[-1] + norm.eps).amin(-1)
    s2_est = _token_scale(Z, norm.eps).median(dim=-1).values.square()
    cap = math.sqrt(Z.shape[-2]) * layernorm_output_norm(norm.weight, norm.bias, Z.shape[-1])
    x_op = op_norm(X)
    x_sup = (x_op + layernorm_deviation(Z, e, norm.weight, norm.eps).norm(dim=-1)).clamp(max=cap)
    return g2 * gain * x_sup / s2_cert, g2 * gain * x_op / s2_est


# --------------------------------------------------------------------------- the two sets of constants


def token_deviations(acts: LayerActivations, A_hat: torch.Tensor) -> torch.Tensor:
    """Per input and token ``‖ẑ_t − z_t‖`` at layer ℓ: the reconstruction error of concept tokens, 0 elsewhere."""
    e = torch.zeros(acts.frame.shape[:2], dtype=torch.float64, device=acts.frame.device)
    err = (A_hat.to(acts.patches).double() - acts.patches.double()).norm(dim=-1)
    return e.index_copy(1, acts.positions, err)


@torch.no_grad()
def certified_constants(cm: ConceptModel, acts: LayerActivations, layer: int, A_hat: torch.Tensor) -> dict:
    """Certified constants per input (see module doc): ``w_c_op``, ``l_block`` (max over the suffix blocks),
    ``l_blocks`` (inputs × blocks), ``suffix_gain`` ``Π_j L_j``, ``l_readout``, ``alpha``, and
    ``head_input_deviation``, the certified bound on how far the head's input moves."""
    e = token_deviations(acts, A_hat)
    e0, delta_rec = e.clone(), e.norm(dim=-1)
    per_block = []
    for j in range(layer, cm.num_layers):
        lip, e = block_lipschitz_certified(
            cm, j, acts.block_inputs[j - layer], e, capped_input=cm.family == "bert" and j > layer
        )
        per_block.append(lip)
    n = e.shape[0]
    l_blocks = torch.stack(per_block, 1) if per_block else torch.ones(n, 0, dtype=torch.float64, device=e.device)
    l_readout, moved = readout_certified(cm, acts.block_inputs[-1], e)
    gain = l_blocks.prod(1)
    return {
        "w_c_op": _head_norm(cm),
        "l_block": l_blocks.amax(1) if per_block else torch.ones(n, dtype=torch.float64, device=e.device),
        "l_blocks": l_blocks,
        "suffix_gain": gain,
        "l_readout": l_readout,
        "alpha": alpha_constants(cm, layer, acts.block_inputs[0], e0)[0],
        "head_input_deviation": torch.minimum(moved, l_readout * gain * delta_rec),
    }


def _head_norm(cm: ConceptModel) -> float:
    """``‖W_c‖_op`` of the head (an offloaded head's weight read from its offload store)."""
    with readable(cm.model, cm.head):
        return float(op_norm(cm.head.weight))


def _float64(cm: ConceptModel, module):
    """A float64 copy of ``module`` (a part of ``cm.model``; without Accelerate hooks, offloaded weights made real)."""
    return plain_copy(cm.model, module).to(torch.float64).eval()


def _realized_ratios(cm, acts, A_hat, layer):
    """Per suffix block, per input ``‖f(Ẑ) − f(Z)‖_F / ‖Ẑ − Z‖_F`` along the concept path (0 where Ẑ = Z)."""
    z_hat = acts.frame.index_copy(1, acts.positions, A_hat.to(acts.frame))
    ratios = []
    with torch.no_grad():
        for j, block in enumerate(list(cm.blocks)[layer:]):
            with runnable(cm.model, block):
                out = cm.block_forward(block, z_hat)
            num = (out - acts.block_inputs[j + 1]).double().flatten(1).norm(dim=1)
            den = (z_hat - acts.block_inputs[j]).double().flatten(1).norm(dim=1)
            ratios.append(torch.where(den > 0, num / den.clamp(min=1e-300), torch.zeros_like(num)))
            z_hat = out
    return ratios


def estimate_constants(
    cm: ConceptModel,
    acts: LayerActivations,
    A_hat: torch.Tensor,
    layer: int,
    power_iters: int = 20,
    max_images: int = 32,
    progress: bool = False,
) -> dict:
    """Local estimates: ``‖W_c‖_op`` (exact), ``l_block`` (max over suffix blocks of the power-iteration Jacobian
    norm at the data, first ``max_images`` inputs, and the realised ratio on all inputs), ``l_readout`` (Jacobian
    norm of the readout at the data), ``alpha`` per input (median token scale)."""
    sub = slice(0, min(max_images, acts.frame.shape[0]))
    jac, ratios = [], _realized_ratios(cm, acts, A_hat, layer)
    for j, block in enumerate(tqdm(list(cm.blocks)[layer:], desc="constants", disable=not progress, leave=False)):
        b64 = _float64(cm, block)
        jac.append(
            jacobian_spectral_norm(
                lambda x, b64=b64: cm.block_forward(b64, x), acts.block_inputs[j][sub].double(), n_iter=power_iters
            )
        )
    readout64 = _float64_readout(cm)
    l_readout = jacobian_spectral_norm(readout64, acts.block_inputs[-1][sub].double(), n_iter=power_iters)
    per_block = [max(float(a.max()), float(r.max())) for a, r in zip(jac, ratios)]
    if cm.certified:
        _, alpha = alpha_constants(cm, layer, acts.block_inputs[0], torch.zeros(acts.frame.shape[:2]))
    else:  # decoders: RMSNorm-aware token scale, grouped-query value heads
        alpha = alpha_estimated(cm, layer, acts.block_inputs[0])
    return {
        "w_c_op": _head_norm(cm),
        "l_block": max(per_block, default=1.0),
        "l_readout": float(l_readout.max()),
        "alpha": alpha,
        "l_block_jacobian": [a.tolist() for a in jac],
        "l_block_realized": [r.tolist() for r in ratios],
        "l_readout_jacobian": l_readout.tolist(),
        "images_for_jacobians": sub.stop,
    }


def _float64_readout(cm: ConceptModel):
    mods = [_float64(cm, m) for m in cm.readout_modules]
    if cm.family == "bert":
        return lambda x: mods[0](x)
    pooling = cm.pooling

    def readout(x):
        pooled = x[:, 0] if pooling == "cls" else (x[:, -1] if pooling == "last" else x.mean(dim=1))
        return mods[0](pooled)

    return readout
