"""Rᶜ along one MSSA step (Hu, Zou & Xu 2024, Fig. 1 and Sec. 4): does the attention step compress?

For token states ``Z`` (N × d) and one CRATE attention module with subspaces ``U = [U_1 … U_K]`` (its
``qkv`` weight), the step ``Z_κ = Z + κ·MSSA(Z)`` is taken for a range of step sizes κ and
``Rᶜ(Z_κ; U)`` is measured with the same ``U``. The variants differ only in MSSA's output matrix
(docs/guide/srr.md): CRATE-C uses ``U`` itself (the update Hu et al. show *increases* Rᶜ, against the SRR
principle), CRATE-N ``−U`` (built to decrease it), CRATE-T ``Uᵀ``, CRATE a learned ``W``.

Everything is built from a seed: ``Z`` has Gaussian tokens, ``U`` is a random orthonormal basis of ℝ^d split
into K blocks of p columns (``K·p = d``, so every variant applies), the CRATE ``W`` is Gaussian with the
same scale. One MSSA module per variant is the model's own :class:`CrateMSSA`, with those weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..measures.coding_rate import compression_rate
from ..models.crate import CrateConfig
from ..models.crate.modeling_crate import CrateMSSA

VARIANTS = ("crate-c", "crate-n", "crate-t", "crate")


def _mssa(variant: str, U: torch.Tensor, W: torch.Tensor) -> CrateMSSA:
    K, d, p = U.shape
    config = CrateConfig(hidden_size=d, num_attention_heads=K, head_dim=p, variant=variant, hidden_dropout_prob=0.0)
    config._attn_implementation = "eager"
    module = CrateMSSA(config).to(torch.float64).eval()
    with torch.no_grad():
        module.qkv.weight.copy_(U.permute(0, 2, 1).reshape(K * p, d))  # rows k·p:(k+1)·p are U_kᵀ
        if module.out_proj is not None:
            module.out_proj.weight.copy_(W)
            module.out_proj.bias.zero_()
    return module


def mssa_step_compression(
    step_sizes: Sequence[float],
    *,
    variants: Sequence[str] = VARIANTS,
    num_tokens: int = 64,
    hidden_size: int = 64,
    num_heads: int = 4,
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    eps: float = 0.1,
) -> dict:
    """``{"step_sizes", "variants", "Rc": {variant: [[Rc(Z_κ) for κ] for seed]}, "settings"}`` (float64)."""
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size: expected a multiple of num_heads={num_heads}, got {hidden_size}")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"variants: expected a subset of {list(VARIANTS)}, got {unknown}")
    steps = [float(k) for k in step_sizes]
    p = hidden_size // num_heads
    out = {v: [] for v in variants}
    for seed in seeds:
        g = torch.Generator().manual_seed(int(seed))
        Z = torch.randn(1, num_tokens, hidden_size, generator=g, dtype=torch.float64)
        basis, _ = torch.linalg.qr(torch.randn(hidden_size, hidden_size, generator=g, dtype=torch.float64))
        U = basis.reshape(hidden_size, num_heads, p).permute(1, 0, 2)  # (K, d, p), orthonormal columns
        W = torch.randn(hidden_size, hidden_size, generator=g, dtype=torch.float64) / hidden_size**0.5
        for variant in variants:
            with torch.no_grad():
                step = _mssa(variant, U, W)(Z)[0]
                curve = [float(compression_rate(Z + kappa * step, U, eps)[0]) for kappa in steps]
            out[variant].append(curve)
    return {
        "step_sizes": steps,
        "variants": list(variants),
        "Rc": out,
        "settings": {
            "num_tokens": num_tokens,
            "hidden_size": hidden_size,
            "num_heads": num_heads,
            "head_dim": p,
            "seeds": [int(s) for s in seeds],
            "eps": eps,
            "Z": "Gaussian tokens",
            "U": "random orthonormal basis split into K blocks",
            "step": "Z + kappa * MSSA(Z), MSSA = the model's CrateMSSA with that U",
        },
    }


__all__ = ["VARIANTS", "mssa_step_compression"]
