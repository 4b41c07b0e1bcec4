"""The constants of the concept-fidelity KL bound, twice and never mixed: certified and estimated.

The seed's bound ``KL ≤ ½‖W_c‖²_op L_block^{2 L_suf} (√N δ_rec + α‖G‖_F δ_gram)²`` (with the readout factor
``L_readout`` derived in ``docs/concept_bound.md``) is evaluated with

* :func:`certified_constants` — upper bounds, per input, on the domain the reconstruction's trajectory provably
  stays in: at layer ℓ token t of ``Ẑ`` is ``e_t = ‖â_t − a_t‖`` from the data's (0 for untouched tokens,
  ``‖e‖₂ = δ_rec``); block j maps these token radii to certified output radii and is Lipschitz on the domain
  ``{Y : ‖y_t − z^j_t‖ ≤ e_t}`` (:mod:`hf_tdiag.measures.concepts.chain` over the per-piece constants of
  :mod:`hf_tdiag.measures.concepts.certified`). Every constant is computed from the weights, the data's measured
  states and the reconstruction errors (no forward pass on ``Â``); ``head_input_deviation`` bounds how far the
  head's input moves. ``α`` (:mod:`hf_tdiag.measures.concepts.alpha`) is taken with the smallest token scale and
  the largest ``‖X‖_op`` on that domain.
* :func:`estimate_constants` — local estimates at the data (power-iteration Jacobian norms and the realised
  ratios along the concept path; α at the data's median token scale). **They err low**, each for a stated reason:
  the power iteration's ``‖J v‖`` (unit ``v``) is at most the Jacobian norm at the data, which is at most the sup
  on the domain; a realised ratio ``‖f(Ẑ) − f(Z)‖/‖Ẑ − Z‖`` is at most the sup of the Jacobian norm on the segment
  (mean-value inequality); the median token scale is at least the smallest one, which α divides by. So every
  estimate is at most its certified counterpart, and ``bound_estimated`` may fall below the KL (an observation, not
  a theorem). ``tests/test_concept_constants_direction.py`` checks each direction on random models, inputs and
  reconstructions.

What each reads from the model is :mod:`hf_tdiag.probes.concept_blocks` (and :mod:`hf_tdiag.probes.concept_decoder`
for decoders); this module only wires those readings into the formulas.
"""

from __future__ import annotations

import torch

from ..._progress import tqdm
from ...measures.concepts import jacobian_spectral_norm, realized_ratio
from ...measures.concepts.alpha import alpha, alpha_postnorm, alpha_prenorm, gamma_max, token_scale, value_output_gain
from ...measures.concepts.certified import (
    feed_forward_lipschitz,
    ista_lipschitz,
    op_norm,
    sparse_coding_lipschitz,
)
from ...measures.concepts.chain import (
    head_input_deviation,
    layernorm_matrix_norm,
    layernorm_readout_certified,
    pooler_readout_certified,
    postnorm_block_certified,
    prenorm_block_certified,
    suffix_gain,
    token_radii,
)
from ...probes.concept_blocks import (
    BlockPieces,
    attention_pieces,
    block_pieces,
    float64_block,
    float64_readout,
    head_weight,
    readout_pieces,
    suffix_outputs,
)
from ...probes.concept_decoder import attention_norm_reading, value_output_heads
from ...probes.concept_model import ConceptModel, LayerActivations

__all__ = [
    "alpha_constants",
    "block_lipschitz_certified",
    "certified_constants",
    "decoder_alpha_estimated",
    "estimate_constants",
]


def _branch_lipschitz(p: BlockPieces) -> float:
    """``L_f`` of the block's second sub-layer: an MLP, CRATE's ISTA step or CRATE-α's sparse coding."""
    if p.branch == "ista":
        return ista_lipschitz(*p.branch_weights, p.step_size)
    if p.branch == "sparse":
        return sparse_coding_lipschitz(*p.branch_weights, p.step_size)
    return feed_forward_lipschitz(*p.branch_weights, p.activation)


def block_lipschitz_certified(
    cm: ConceptModel, index: int, Z: torch.Tensor, radius: torch.Tensor, capped_input: bool = False
) -> tuple:
    """``(L, e')`` for block ``index`` on the inputs whose token t stays within ``radius[:, t]`` of the data ``Z``:
    ``L`` (per input) bounds the block's Lipschitz constant there, ``e'`` (per input and token) each output
    token's move. A radius per input ``(inputs,)`` is a Frobenius ball (every token may move that far).
    ``capped_input``: the block's input is a LayerNorm output (post-norm blocks after the first suffix block),
    which bounds ``‖Y‖_F`` independently of the radius.
    """
    p = block_pieces(cm, index, Z)
    L_f = _branch_lipschitz(p)
    if p.post_norm:
        cap = layernorm_matrix_norm(p.ln2, Z.shape[-2], Z.shape[-1]) if capped_input else None
        return postnorm_block_certified(radius, Z, p.ln1_in, p.ln2_in, p.ln1, p.ln2, p.attention, L_f, cap)
    residual = p.branch != "ista"  # CRATE's ISTA step has no residual around it
    return prenorm_block_certified(radius, p.ln1_in, p.ln1_out, p.ln2_in, p.ln1, p.ln2, p.attention, L_f, residual)


@torch.no_grad()
def alpha_constants(cm: ConceptModel, layer: int, Z: torch.Tensor, radius: torch.Tensor) -> tuple:
    """Per input ``(α certified, α estimated)`` of block ℓ+1 (zeros when no block follows ℓ): pre-norm blocks with
    their attention norm's token scale, post-norm blocks on ``Z`` itself; ``radius`` (inputs, T) the per-token
    domain around the data states ``Z``."""
    zeros = torch.zeros(Z.shape[0], dtype=torch.float64, device=Z.device)
    if layer >= cm.num_layers:
        return zeros, zeros
    p = attention_pieces(cm, layer, Z)
    gain = value_output_gain(p.heads)
    if p.norm is None:
        return alpha_postnorm(Z, radius, p.head_dim, gain)
    return alpha_prenorm(Z, p.attention_input, radius, p.norm, p.head_dim, gain)


def decoder_alpha_estimated(cm: ConceptModel, layer: int, Z: torch.Tensor) -> torch.Tensor:
    """Per input α of a decoder's block ℓ+1 at the data ``Z``: its pre-attention norm's median token scale (RMSNorm
    or LayerNorm) and ``Σ_h ‖W_V,g(h)‖‖W_O,h‖`` over query heads (zeros when no block follows ℓ). It errs low: at
    most α with the smallest token scale at the data."""
    if layer >= cm.num_layers:
        return torch.zeros(Z.shape[0], dtype=torch.float64, device=Z.device)
    gain = value_output_gain(value_output_heads(cm.model, cm.arch.decoder, layer))
    norm, centred, X = attention_norm_reading(cm, layer, Z)
    s2 = token_scale(Z, norm.eps, centred).median(dim=-1).values.square()
    return alpha(gamma_max(norm.weight), cm.arch.layers[layer].head_dim, gain, op_norm(X), s2)


def _readout_certified(cm: ConceptModel, Z_last: torch.Tensor, e_last: torch.Tensor) -> tuple:
    """``(L_readout, Δ_readout)`` per input of the model's readout on the per-token domain ``e_last`` around ``Z^L``."""
    r = readout_pieces(cm)
    if r.pooler_weight is not None:
        return pooler_readout_certified(r.pooler_weight, e_last.double().to(Z_last.device)[:, 0])
    return layernorm_readout_certified(Z_last, e_last, r.pooling, r.norm)


@torch.no_grad()
def certified_constants(cm: ConceptModel, acts: LayerActivations, layer: int, A_hat: torch.Tensor) -> dict:
    """Certified constants per input (see module doc): ``w_c_op``, ``l_block`` (max over the suffix blocks),
    ``l_blocks`` (inputs × blocks), ``suffix_gain`` ``Π_j L_j``, ``l_readout``, ``alpha``, and
    ``head_input_deviation``, the certified bound on how far the head's input moves."""
    e = token_radii(acts.patches, A_hat, acts.positions, acts.frame.shape[1]).to(acts.frame.device)
    e0, delta_rec = e.clone(), e.norm(dim=-1)
    per_block = []
    for j in range(layer, cm.num_layers):
        capped = cm.family == "bert" and j > layer
        lip, e = block_lipschitz_certified(cm, j, acts.block_inputs[j - layer], e, capped_input=capped)
        per_block.append(lip)
    n = e.shape[0]
    l_blocks = torch.stack(per_block, 1) if per_block else torch.ones(n, 0, dtype=torch.float64, device=e.device)
    l_readout, moved = _readout_certified(cm, acts.block_inputs[-1], e)
    gain = suffix_gain(l_blocks)
    return {
        "w_c_op": float(op_norm(head_weight(cm))),
        "l_block": l_blocks.amax(1) if per_block else torch.ones(n, dtype=torch.float64, device=e.device),
        "l_blocks": l_blocks,
        "suffix_gain": gain,
        "l_readout": l_readout,
        "alpha": alpha_constants(cm, layer, acts.block_inputs[0], e0)[0],
        "head_input_deviation": head_input_deviation(moved, l_readout, gain, delta_rec),
    }


def _realized_ratios(cm: ConceptModel, acts: LayerActivations, A_hat: torch.Tensor, layer: int) -> list:
    """Per suffix block, per input ``‖f(Ẑ) − f(Z)‖_F / ‖Ẑ − Z‖_F`` along the concept path (0 where Ẑ = Z)."""
    z_hat = suffix_outputs(cm, acts, A_hat, layer)
    return [
        realized_ratio(z_hat[j + 1], acts.block_inputs[j + 1], z_hat[j], acts.block_inputs[j])
        for j in range(len(z_hat) - 1)
    ]


def _jacobian_norms(cm: ConceptModel, acts: LayerActivations, layer: int, sub: slice, power_iters: int, progress):
    """Per suffix block, the power-iteration Jacobian norm at the data of the first inputs ``sub`` (float64)."""
    jac = []
    for j, block in enumerate(tqdm(list(cm.blocks)[layer:], desc="constants", disable=not progress, leave=False)):
        b64 = float64_block(cm, block)
        jac.append(
            jacobian_spectral_norm(
                lambda x, b64=b64: cm.block_forward(b64, x), acts.block_inputs[j][sub].double(), n_iter=power_iters
            )
        )
    return jac


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
    ratios = _realized_ratios(cm, acts, A_hat, layer)
    jac = _jacobian_norms(cm, acts, layer, sub, power_iters, progress)
    l_readout = jacobian_spectral_norm(float64_readout(cm), acts.block_inputs[-1][sub].double(), n_iter=power_iters)
    per_block = [max(float(a.max()), float(r.max())) for a, r in zip(jac, ratios)]
    if cm.certified:
        _, alpha_est = alpha_constants(cm, layer, acts.block_inputs[0], torch.zeros(acts.frame.shape[:2]))
    else:  # decoders: RMSNorm-aware token scale, grouped-query value heads
        alpha_est = decoder_alpha_estimated(cm, layer, acts.block_inputs[0])
    return {
        "w_c_op": float(op_norm(head_weight(cm))),
        "l_block": max(per_block, default=1.0),
        "l_readout": float(l_readout.max()),
        "alpha": alpha_est,
        "l_block_jacobian": [a.tolist() for a in jac],
        "l_block_realized": [r.tolist() for r in ratios],
        "l_readout_jacobian": l_readout.tolist(),
        "images_for_jacobians": sub.stop,
    }
