"""Projection heads of SimDINO and DINO (``simdino/vision_transformer.py:DINOHead`` of ``RobinWu218/SimDINO``).

SimDINO's head is DINO's MLP without the prototype layer: ``Linear → GELU → (Linear → GELU)* → Linear`` to the
bottleneck, then L2 normalisation; DINO adds a weight-normalised prototype layer (``g = 1``: each prototype row is
unit-norm) whose scores the cross-entropy compares.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _init(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class ProjectionHead(nn.Module):
    """``normalize(MLP(x))``: ``num_layers`` linear layers (GELU between) from ``in_dim`` to ``bottleneck_dim``."""

    def __init__(self, in_dim: int, hidden_dim: int = 2048, bottleneck_dim: int = 256, num_layers: int = 3):
        super().__init__()
        for name, value in (("in_dim", in_dim), ("hidden_dim", hidden_dim), ("bottleneck_dim", bottleneck_dim)):
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if not (isinstance(num_layers, int) and num_layers >= 1):
            raise ValueError(f"num_layers: expected a positive int, got {num_layers!r}")
        if num_layers == 1:
            self.mlp = nn.Linear(in_dim, bottleneck_dim)
        else:
            layers = [nn.Linear(in_dim, hidden_dim), nn.GELU()]
            for _ in range(num_layers - 2):
                layers += [nn.Linear(hidden_dim, hidden_dim), nn.GELU()]
            self.mlp = nn.Sequential(*layers, nn.Linear(hidden_dim, bottleneck_dim))
        self.apply(_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.mlp(x), dim=-1, p=2)


class PrototypeHead(nn.Module):
    """DINO's head: :class:`ProjectionHead`, then scores against ``out_dim`` unit-norm prototypes (weight norm, g = 1)."""

    def __init__(
        self, in_dim: int, out_dim: int, hidden_dim: int = 2048, bottleneck_dim: int = 256, num_layers: int = 3
    ):
        super().__init__()
        if not (isinstance(out_dim, int) and out_dim >= 1):
            raise ValueError(f"out_dim: expected a positive int, got {out_dim!r}")
        self.projection = ProjectionHead(in_dim, hidden_dim, bottleneck_dim, num_layers)
        self.prototypes = nn.Parameter(torch.empty(out_dim, bottleneck_dim))
        nn.init.trunc_normal_(self.prototypes, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.projection(x), F.normalize(self.prototypes, dim=-1))


__all__ = ["ProjectionHead", "PrototypeHead"]
