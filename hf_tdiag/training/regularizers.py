"""Sparse-rate-reduction regularisation (Hu, Zou & Xu 2024, Sec. 6).

The training loss becomes ``CE + β · mean_b SRR(Z^ℓ_b; U^ℓ)`` where ``Z^ℓ`` is
the input of block ℓ (the state :func:`hf_tdiag.layer_srr` measures by default)
for the samples ``b`` of the training batch and ``U^ℓ`` is block ℓ's subspaces,
taken from the live weights so the gradient reaches them. ``--srr_layer`` picks
ℓ: an index, ``last``, ``random`` (a new layer each step, as the paper does to
keep the cost of one layer per iteration) or ``all`` (mean over layers).
"""

from __future__ import annotations

import random
from typing import Sequence

import torch

from ..measures.coding_rate import sparse_rate_reduction
from ..probes.subspaces import subspaces


def srr_layers_for_step(spec: str | int, num_layers: int, step: int, seed: int) -> list[int]:
    """Layer indices regularised at optimizer step ``step``.

    ``random`` draws from ``random.Random(hash((seed, step)))``: it depends only on the seed and the step, so a
    resumed run regularises the same layers as an uninterrupted one.
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers: expected a positive int, got {num_layers!r}")
    if spec == "all":
        return list(range(num_layers))
    if spec == "last":
        return [num_layers - 1]
    if spec == "random":
        return [random.Random(f"{seed}:{step}").randrange(num_layers)]
    if isinstance(spec, int) and not isinstance(spec, bool):
        if not -num_layers <= spec < num_layers:
            raise ValueError(f"srr_layer: index {spec} out of range for a model with {num_layers} layers")
        return [spec % num_layers]
    raise ValueError(f"srr_layer: expected an index, 'last', 'random' or 'all', got {spec!r}")


def srr_penalty(
    hidden_states: Sequence[torch.Tensor],
    U: Sequence[torch.Tensor],
    layers: Sequence[int],
    eps: float = 0.1,
    lam: float = 1.0,
) -> torch.Tensor:
    """``mean_ℓ mean_b SRR(Z^ℓ_b; U^ℓ)`` with ``Z^ℓ = hidden_states[ℓ]`` (B, N, d) and ``U[ℓ]`` (K, d, p); float64 scalar."""
    if not layers:
        raise ValueError("layers: expected at least one layer index, got an empty list")
    if len(hidden_states) < len(U):
        raise ValueError(
            f"hidden_states: expected at least one state per layer ({len(U)}), got {len(hidden_states)}"
        )
    values = [sparse_rate_reduction(hidden_states[i], U[i], eps=eps, lam=lam).mean() for i in layers]
    return torch.stack(values).mean()


def model_srr_penalty(model, hidden_states, spec, step, seed, eps=0.1, lam=1.0) -> tuple[torch.Tensor, list[int]]:
    """The regulariser for ``model`` (unwrapped) at ``step``: ``(penalty, layers)``; differentiable in ``U``."""
    U = subspaces(model, "query", detach=False)
    layers = srr_layers_for_step(spec, len(U), step, seed)
    return srr_penalty(hidden_states, U, layers, eps=eps, lam=lam), layers


__all__ = ["srr_layers_for_step", "srr_penalty", "model_srr_penalty"]
