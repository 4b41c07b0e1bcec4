"""The empirical KL between two classifiers' softmax outputs and the seed's KL bound.

``KL(σ(p) ‖ σ(q)) = Σ_c σ(p)_c (log σ(p)_c − log σ(q)_c)``;
``KL ≤ ½‖W_c‖²_op · L_block^{2 L_suf} · (√N δ_rec + α‖G‖_F δ_gram)²`` (Appendix C, eq. 35).
"""

from __future__ import annotations

import math

import torch

from ..._validation import check_tensor


def kl_divergence(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Per-row ``KL(σ(p) ‖ σ(q)) = Σ_c σ(p)_c (log σ(p)_c − log σ(q)_c)`` in float64."""
    for name, x in (("logits_p", logits_p), ("logits_q", logits_q)):
        check_tensor(x, name, ndim=(1, 2), allow_numpy=True)
    if logits_p.shape != logits_q.shape:
        raise ValueError(
            f"logits_q: expected the shape of logits_p {tuple(logits_p.shape)}, got {tuple(logits_q.shape)}"
        )
    lp = torch.log_softmax(logits_p.double(), dim=-1)
    lq = torch.log_softmax(logits_q.double(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(-1).clamp(min=0)


def _constant(name: str, value) -> torch.Tensor:
    """A finite non-negative constant (a number, or one per input) as float64."""
    t = torch.as_tensor(value, dtype=torch.float64)
    if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
        raise ValueError(f"{name}: expected finite non-negative values, got {value}")
    return t


def kl_bound(
    w_c_op,
    l_block,
    n_suffix_blocks: int,
    n_tokens: int,
    delta_rec,
    alpha,
    gram_norm,
    delta_gram,
    l_readout=1.0,
) -> dict[str, torch.Tensor]:
    """``KL ≤ ½ (‖W_c‖_op L_readout)² · L_block^{2 L_suf} · (√N δ_rec + α‖G‖_F δ_gram)²`` and its two terms.

    ``l_readout`` is the Lipschitz constant of the readout between the last block and the linear head (pooling and
    the final LayerNorm of ViT/CRATE, the pooler of BERT; derived in ``docs/concept_bound.md``); 1 where the head
    reads the last block's token directly. Constants are numbers or per-input tensors (broadcast with δ_rec).
    """
    if n_suffix_blocks < 0:
        raise ValueError(f"n_suffix_blocks: expected >= 0, got {n_suffix_blocks}")
    if n_tokens < 1:
        raise ValueError(f"n_tokens: expected >= 1, got {n_tokens}")
    w_c_op, l_block, alpha, l_readout = (
        _constant(n, v)
        for n, v in (("w_c_op", w_c_op), ("l_block", l_block), ("alpha", alpha), ("l_readout", l_readout))
    )
    delta_rec = torch.as_tensor(delta_rec, dtype=torch.float64)
    gram_norm = torch.as_tensor(gram_norm, dtype=torch.float64)
    delta_gram = torch.as_tensor(delta_gram, dtype=torch.float64)
    const = 0.5 * (w_c_op * l_readout) ** 2 * l_block ** (2 * n_suffix_blocks)
    rec_term = math.sqrt(n_tokens) * delta_rec
    gram_term = alpha * gram_norm * delta_gram
    return {
        "bound": const * (rec_term + gram_term) ** 2,
        "rec_term": rec_term,
        "gram_term": gram_term,
        "bound_rec_only": const * rec_term**2,
        "bound_gram_only": const * gram_term**2,
        "constant": const,
    }


def kl_bound_chain(w_c_op, head_input_deviation) -> torch.Tensor:
    """``KL ≤ ½ (‖W_c‖_op · Δ)²`` with ``Δ`` a bound on how far the head's input moves (the certified chain)."""
    w_c_op, dev = _constant("w_c_op", w_c_op), _constant("head_input_deviation", head_input_deviation)
    return 0.5 * (w_c_op * dev) ** 2
