"""The empirical KL between two classifiers' softmax outputs and the seed's KL bound.

``KL(σ(p) ‖ σ(q)) = Σ_c σ(p)_c (log σ(p)_c − log σ(q)_c)``;
``KL ≤ ½‖W_c‖²_op · L_block^{2 L_suf} · (√N δ_rec + α‖G‖_F δ_gram)²`` (Appendix C, eq. 35).
"""

from __future__ import annotations

import math

import torch

from ._checks import _check_tensor

def kl_divergence(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Per-row ``KL(σ(p) ‖ σ(q)) = Σ_c σ(p)_c (log σ(p)_c − log σ(q)_c)`` in float64."""
    for name, x in (("logits_p", logits_p), ("logits_q", logits_q)):
        _check_tensor(x, name, (1, 2))
    if logits_p.shape != logits_q.shape:
        raise ValueError(f"logits_q: expected the shape of logits_p {tuple(logits_p.shape)}, got {tuple(logits_q.shape)}")
    lp = torch.log_softmax(logits_p.double(), dim=-1)
    lq = torch.log_softmax(logits_q.double(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(-1).clamp(min=0)


def kl_bound(
    w_c_op: float,
    l_block: float,
    n_suffix_blocks: int,
    n_tokens: int,
    delta_rec,
    alpha: float,
    gram_norm,
    delta_gram,
    l_norm: float = 1.0,
) -> dict[str, torch.Tensor]:
    """``KL ≤ ½ (‖W_c‖_op L_norm)² · L_block^{2 L_suf} · (√N δ_rec + α‖G‖_F δ_gram)²`` and its two terms.

    ``l_norm`` is the Lipschitz constant of whatever non-linear map sits between the last block and
    the linear head (the final LayerNorm of ViT/CRATE); 1 where the head is purely linear.
    """
    if n_suffix_blocks < 0:
        raise ValueError(f"n_suffix_blocks: expected >= 0, got {n_suffix_blocks}")
    if n_tokens < 1:
        raise ValueError(f"n_tokens: expected >= 1, got {n_tokens}")
    for name, v in (("w_c_op", w_c_op), ("l_block", l_block), ("alpha", alpha), ("l_norm", l_norm)):
        if not math.isfinite(float(v)) or float(v) < 0:
            raise ValueError(f"{name}: expected a finite non-negative number, got {v}")
    delta_rec = torch.as_tensor(delta_rec, dtype=torch.float64)
    gram_norm = torch.as_tensor(gram_norm, dtype=torch.float64)
    delta_gram = torch.as_tensor(delta_gram, dtype=torch.float64)
    const = 0.5 * (float(w_c_op) * float(l_norm)) ** 2 * float(l_block) ** (2 * n_suffix_blocks)
    rec_term = math.sqrt(n_tokens) * delta_rec
    gram_term = float(alpha) * gram_norm * delta_gram
    return {
        "bound": const * (rec_term + gram_term) ** 2,
        "rec_term": rec_term,
        "gram_term": gram_term,
        "bound_rec_only": const * rec_term**2,
        "bound_gram_only": const * gram_term**2,
        "constant": torch.tensor(const, dtype=torch.float64),
    }
