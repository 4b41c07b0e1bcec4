"""Pooled per-layer features for linear probing: ``Z^0`` (embeddings) and every block output ``Z^ℓ``.

Each state ``(B, N, d)`` becomes one vector per sample: the mean over tokens (``pool="mean"``), or the
first (CLS) token (``pool="cls"``). Read with the same hooks as :func:`token_states`.
"""

from __future__ import annotations

import torch

from .._caller_state import module_modes, restore_modes
from .describe import describe
from .token_states import token_states


def layer_features(model, batches, pool: str = "mean") -> list[torch.Tensor]:
    """``[F^0, F^1, …, F^L]``, each ``(num_samples, d)`` float64 on the CPU, over an iterable of batches."""
    if pool not in ("mean", "cls"):
        raise ValueError(f"pool: expected 'mean' or 'cls', got {pool!r}")
    arch = describe(model)
    saved = module_modes(model)  # every submodule's flag, not only the top one's (hf_tdiag._caller_state)
    model.eval()
    chunks: list[list[torch.Tensor]] = []
    try:
        for batch in batches:
            ts = token_states(model, batch, mid=False, arch=arch)
            states = [ts.block_inputs[0]] + list(ts.block_outputs)
            pooled = [(Z.mean(1) if pool == "mean" else Z[:, 0]).to(torch.float64).cpu() for Z in states]
            chunks.append(pooled)
    finally:
        restore_modes(saved)
    if not chunks:
        raise ValueError("batches: no inputs")
    return [torch.cat([c[i] for c in chunks]) for i in range(len(chunks[0]))]


__all__ = ["layer_features"]
