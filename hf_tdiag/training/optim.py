"""Optimizers: AdamW (torch) and Lion (Chen et al. 2023, used by the official CRATE ImageNet recipe)."""

from __future__ import annotations

import torch
from torch import nn


class Lion(torch.optim.Optimizer):
    """Lion: ``u = sign(β₁m + (1−β₁)g)``, ``θ ← θ(1 − ηλ) − ηu``, ``m ← β₂m + (1−β₂)g``."""

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0):
        if not lr >= 0:
            raise ValueError(f"lr: expected a non-negative learning rate, got {lr!r}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas: expected two values in [0, 1), got {betas!r}")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay: expected a non-negative value, got {weight_decay!r}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), wd = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                grad = p.grad
                if wd:
                    p.mul_(1 - lr * wd)
                update = m.mul(beta1).add_(grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-lr)
                m.mul_(beta2).add_(grad, alpha=1 - beta2)
        return loss


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups as in the Transformers examples: weight decay on matrices, none on biases, norms and embeddings."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim < 2 or name.endswith(("cls_token", "position_embeddings")):
            no_decay.append(param)
        else:
            decay.append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float, betas=(0.9, 0.999)):
    """``adamw`` or ``lion`` over :func:`param_groups` of ``model``."""
    groups = param_groups(model, weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas))
    if name == "lion":
        return Lion(groups, lr=lr, betas=tuple(betas))
    raise ValueError(f"optimizer: expected 'adamw' or 'lion', got {name!r}")


__all__ = ["Lion", "param_groups", "build_optimizer"]
