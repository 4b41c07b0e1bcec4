"""Sparse-rate-reduction regularisation (Hu, Zou & Xu 2024, Sec. 6).

The training loss becomes ``CE + β · mean_b SRR(Z^ℓ_b; U^ℓ)`` where ``Z^ℓ`` is
the **output** of block ℓ (``hidden_states[ℓ]``, blocks numbered 1…L; "layer ℓ"
as everywhere in hf-tdiag) for the samples ``b`` of the training batch and
``U^ℓ`` is block ℓ's subspaces, taken from the live weights so the gradient
reaches them (and, through ``Z^ℓ``, block ℓ's ISTA dictionary). ``--srr_layer``
picks ℓ: ``last`` (default, ``Z^L``: the paper's main setting; random layers did
worse in its Table 5), a block number 1…L (negative counts from the end),
``random`` (a new block each step) or ``all`` (mean over blocks).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from .._validation import block_number, positive_int
from ..measures.coding_rate import sparse_rate_reduction
from ..probes.subspaces import subspaces


def srr_layers_for_step(spec: str | int, num_layers: int, step: int, seed: int) -> list[int]:
    """Block numbers ℓ ∈ 1…L regularised at optimizer step ``step``.

    ``random`` draws from ``random.Random(f"{seed}:{step}")``: it depends only on the seed and the step, so a
    resumed run regularises the same blocks as an uninterrupted one.
    """
    positive_int(num_layers, "num_layers")
    if spec == "all":
        return list(range(1, num_layers + 1))
    if spec == "last":
        return [num_layers]
    if spec == "random":
        return [random.Random(f"{seed}:{step}").randrange(num_layers) + 1]
    if isinstance(spec, int) and not isinstance(spec, bool):
        return [block_number(spec, num_layers, "srr_layer", from_end=True)]
    raise ValueError(f"srr_layer: expected a block number, 'last', 'random' or 'all', got {spec!r}")


def srr_penalty(
    hidden_states: Sequence[torch.Tensor],
    U: Sequence[torch.Tensor],
    layers: Sequence[int],
    eps: float = 0.1,
    lam: float = 1.0,
) -> torch.Tensor:
    """``mean_ℓ mean_b SRR(Z^ℓ_b; U^ℓ)``, ``Z^ℓ = hidden_states[ℓ]`` (B, N, d), ``U^ℓ = U[ℓ−1]`` (K, d, p); float64 scalar."""
    if not layers:
        raise ValueError("layers: expected at least one block number, got an empty list")
    if len(hidden_states) != len(U) + 1:
        raise ValueError(
            f"hidden_states: expected Z^0..Z^L, one more state than blocks ({len(U) + 1}), got {len(hidden_states)}"
        )
    values = [sparse_rate_reduction(hidden_states[ell], U[ell - 1], eps=eps, lam=lam).mean() for ell in layers]
    return torch.stack(values).mean()


def model_srr_penalty(model, hidden_states, spec, step, seed, eps=0.1, lam=1.0) -> tuple[torch.Tensor, list[int]]:
    """The regulariser for ``model`` (unwrapped) at ``step``: ``(penalty, blocks)``; differentiable in ``U`` and ``Z``."""
    U = subspaces(model, "query", detach=False)
    layers = srr_layers_for_step(spec, len(U), step, seed)
    return srr_penalty(hidden_states, U, layers, eps=eps, lam=lam), layers


__all__ = ["srr_layers_for_step", "srr_penalty", "model_srr_penalty"]
