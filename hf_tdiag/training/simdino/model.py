"""Student and EMA teacher around a Transformers ViT-like backbone, and the schedules of the authors' trainer.

The backbone is any base model whose output has ``last_hidden_state`` (ViT, DeiT, Dinov2, CRATE, CRATE-α, ...;
a ``*ForImageClassification`` model gives its base model). Its feature is the CLS token of the final state, or,
for a family with a ``pooling`` setting (CRATE's ``"mean"``), its ``pooler_output``. The teacher is a copy of the
student that gets no gradient; after each optimizer step ``θ_t ← m·θ_t + (1 − m)·θ_s`` with ``m`` on the
authors' cosine schedule from ``momentum_teacher`` to 1 (``simdino/utils.py:cosine_scheduler``).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn


def base_backbone(model: nn.Module) -> nn.Module:
    """The base model of a Transformers model with a task head (``model.base_model``), else ``model``."""
    base = getattr(model, "base_model", None)
    return base if isinstance(base, nn.Module) else model


def backbone_features(backbone: nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """``(batch, hidden)``: the pooled output of families with a ``pooling`` setting, else the CLS token."""
    outputs = backbone(pixel_values=pixel_values)
    pooled = getattr(outputs, "pooler_output", None)
    if hasattr(getattr(backbone, "config", None), "pooling") and pooled is not None:
        return pooled
    return outputs.last_hidden_state[:, 0]


def cosine_schedule(base: float, final: float, total_steps: int, warmup_steps: int = 0, start: float = 0.0):
    """Value at each step: linear warmup ``start → base`` over ``warmup_steps``, then ``final + ½(base − final)
    (1 + cos(π i / n))`` over the remaining ``n`` steps (``simdino/utils.py:cosine_scheduler``, per step)."""
    if not (isinstance(total_steps, int) and total_steps >= 1 and 0 <= warmup_steps <= total_steps):
        raise ValueError(
            f"total_steps/warmup_steps: expected 0 <= warmup <= total >= 1, got {warmup_steps}/{total_steps}"
        )
    values = [start + (base - start) * i / max(warmup_steps - 1, 1) for i in range(warmup_steps)]
    n = total_steps - warmup_steps
    values += [final + 0.5 * (base - final) * (1 + math.cos(math.pi * i / n)) for i in range(n)]
    return values


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, momentum: float) -> None:
    """``θ_t ← m·θ_t + (1 − m)·θ_s`` for every parameter (floating buffers too: a BatchNorm's running stats)."""
    t_params, s_params = list(teacher.parameters()), list(student.parameters())
    if len(t_params) != len(s_params):
        raise ValueError("teacher: expected the student's architecture (a different number of parameters)")
    torch._foreach_lerp_(t_params, s_params, 1.0 - momentum)
    for tb, sb in zip(teacher.buffers(), student.buffers()):
        if tb.is_floating_point():
            tb.lerp_(sb, 1.0 - momentum)


class Branch(nn.Module):
    """A backbone and its projection head: ``head(features(backbone(view)))`` over a list of views."""

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, views: list[torch.Tensor]) -> torch.Tensor:
        # views of one resolution go through the backbone together (the authors' MultiCropWrapper)
        feats, start = [], 0
        while start < len(views):
            end = start
            while end < len(views) and views[end].shape[-2:] == views[start].shape[-2:]:
                end += 1
            feats.append(backbone_features(self.backbone, torch.cat(views[start:end])))
            start = end
        return self.head(torch.cat(feats))


class SelfDistillation(nn.Module):
    """Student branch, EMA teacher branch (no gradient) and the loss module (DINO's centre is its buffer)."""

    def __init__(self, backbone: nn.Module, head: nn.Module, loss: nn.Module, n_global: int = 2):
        super().__init__()
        self.student = Branch(base_backbone(backbone), head)
        self.teacher = copy.deepcopy(self.student)
        self.teacher.requires_grad_(False)
        self.loss = loss
        self.n_global = n_global

    def forward(self, views: list[torch.Tensor], **loss_kwargs) -> tuple[torch.Tensor, dict]:
        with torch.no_grad():
            teacher = self.teacher(views[: self.n_global])
        student = self.student(views)
        return self.loss(student, teacher, **loss_kwargs)

    def update_teacher(self, momentum: float) -> None:
        ema_update(self.teacher, self.student, momentum)


__all__ = ["base_backbone", "backbone_features", "cosine_schedule", "ema_update", "Branch", "SelfDistillation"]
