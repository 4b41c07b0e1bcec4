"""Load checkpoints of the authors' PyTorch CRATE-α code (``torch_inference/model/crate_alpha.py``).

Official layout (``crate_alpha_B16.pth``, ``crate_alpha_L14.pth``; possibly wrapped as ``{"state_dict": ...}`` and/or
with ``module.`` prefixes)::

    conv1.weight (d, C, P, P), conv1.bias (d,)      patch convolution
    pos_embedding (1, patches + 1, d), cls_token (1, 1, d)
    transformer.layers.i.0.norm                       LayerNorm(d), eps 1e-6
    transformer.layers.i.0.fn.qkv.weight              (heads * head_dim, d)
    transformer.layers.i.0.fn.to_out.0.weight         (d, heads * head_dim), no bias
    transformer.layers.i.1.norm                       LayerNorm(d), eps 1e-6
    transformer.layers.i.1.fn.D, .1.fn.D1             (d, 4d)
    mlp_head.0 LayerNorm(d), mlp_head.1 Linear(d -> classes)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..crate.convert_official import unwrap_official_state_dict
from .configuration_crate_alpha import CRATE_ALPHA_PRESETS, CrateAlphaConfig
from .modeling_crate_alpha import CrateAlphaForImageClassification


def official_key_map(config: CrateAlphaConfig) -> dict[str, str]:
    """Map official parameter name -> our parameter name for ``config``."""
    m = {
        "conv1.weight": "crate_alpha.embeddings.projection.weight",
        "conv1.bias": "crate_alpha.embeddings.projection.bias",
        "pos_embedding": "crate_alpha.embeddings.position_embeddings",
        "cls_token": "crate_alpha.embeddings.cls_token",
        "mlp_head.0.weight": "classifier_norm.weight",
        "mlp_head.0.bias": "classifier_norm.bias",
        "mlp_head.1.weight": "classifier.weight",
        "mlp_head.1.bias": "classifier.bias",
    }
    project = not (config.num_attention_heads == 1 and config.head_dim == config.hidden_size)
    for i in range(config.num_hidden_layers):
        src, dst = f"transformer.layers.{i}", f"crate_alpha.encoder.layer.{i}"
        for part, ours in (("0.norm", "layernorm_before"), ("1.norm", "layernorm_after")):
            m[f"{src}.{part}.weight"] = f"{dst}.{ours}.weight"
            m[f"{src}.{part}.bias"] = f"{dst}.{ours}.bias"
        m[f"{src}.0.fn.qkv.weight"] = f"{dst}.attention.qkv.weight"
        if project:
            m[f"{src}.0.fn.to_out.0.weight"] = f"{dst}.attention.out_proj.weight"
        m[f"{src}.1.fn.D"] = f"{dst}.sparse_coding.D"
        m[f"{src}.1.fn.D1"] = f"{dst}.sparse_coding.D1"
    return m


def _resolve_config(config, sd: Mapping[str, torch.Tensor]) -> CrateAlphaConfig:
    if isinstance(config, CrateAlphaConfig):
        return config
    if isinstance(config, str):
        if config not in CRATE_ALPHA_PRESETS:
            raise ValueError(f"config: unknown preset {config!r}; available: {list(CRATE_ALPHA_PRESETS)}")
        head = sd.get("mlp_head.1.weight")
        if head is None:
            raise ValueError("state_dict is missing key 'mlp_head.1.weight' (classifier weight)")
        return CrateAlphaConfig.from_preset(config, num_labels=int(head.shape[0]))
    raise TypeError(f"config must be a CrateAlphaConfig or a preset name, got {type(config).__name__}")


def convert_official_crate_alpha(
    state_dict: Mapping, config: CrateAlphaConfig | str
) -> CrateAlphaForImageClassification:
    """A :class:`CrateAlphaForImageClassification` holding an official CRATE-α ``state_dict``'s weights.

    ``config`` is a :class:`CrateAlphaConfig` or a preset name (``num_labels`` then read from the checkpoint).
    Missing, unexpected, mis-shaped or non-finite entries raise a ``ValueError`` naming the key.
    """
    sd = unwrap_official_state_dict(state_dict)
    config = _resolve_config(config, sd)
    key_map = official_key_map(config)
    model = CrateAlphaForImageClassification(config)
    target = model.state_dict()
    missing = [k for k in key_map if k not in sd]
    if missing:
        raise ValueError(
            f"state_dict is missing {len(missing)} key(s) for a {config.num_hidden_layers}-layer CRATE-α, "
            f"e.g. {missing[:5]}"
        )
    unexpected = [k for k in sd if k not in key_map]
    if unexpected:
        raise ValueError(f"state_dict has {len(unexpected)} unexpected key(s), e.g. {unexpected[:5]}")
    converted = {}
    for src, dst in key_map.items():
        tensor = sd[src]
        if tuple(tensor.shape) != tuple(target[dst].shape):
            raise ValueError(
                f"state_dict[{src!r}] has shape {tuple(tensor.shape)}, expected {tuple(target[dst].shape)} for "
                f"{dst} (hidden_size={config.hidden_size}, heads={config.num_attention_heads}, "
                f"patch_size={config.patch_size}, num_labels={config.num_labels})"
            )
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"state_dict[{src!r}] must be finite floating point, got {tensor.dtype}")
        converted[dst] = tensor.detach().to(dtype=target[dst].dtype)
    model.load_state_dict(converted, strict=True)
    return model.eval()


def official_forward(state_dict: Mapping, pixel_values: torch.Tensor, config: CrateAlphaConfig) -> torch.Tensor:
    """Logits of the authors' forward, transcribed as functional ops on the official ``state_dict`` (a check)."""
    import torch.nn.functional as F

    sd = unwrap_official_state_dict(state_dict)
    eps, eta, lam = config.layer_norm_eps, config.ista_step_size, config.ista_lambda
    x = F.conv2d(pixel_values, sd["conv1.weight"], sd["conv1.bias"], stride=config.patch_size)
    x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
    x = torch.cat((sd["cls_token"].expand(x.shape[0], -1, -1), x), dim=1) + sd["pos_embedding"][:, : x.shape[1] + 1]
    heads = config.num_attention_heads
    for i in range(config.num_hidden_layers):
        p = f"transformer.layers.{i}"
        y = F.layer_norm(x, x.shape[-1:], sd[f"{p}.0.norm.weight"], sd[f"{p}.0.norm.bias"], eps)
        w = F.linear(y, sd[f"{p}.0.fn.qkv.weight"])
        w = w.reshape(w.shape[0], w.shape[1], heads, -1).transpose(1, 2)
        attn = torch.softmax(w @ w.transpose(-1, -2) * w.shape[-1] ** -0.5, dim=-1)
        out = (attn @ w).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        if f"{p}.0.fn.to_out.0.weight" in sd:
            out = F.linear(out, sd[f"{p}.0.fn.to_out.0.weight"])
        x = x + out
        y = F.layer_norm(x, x.shape[-1:], sd[f"{p}.1.norm.weight"], sd[f"{p}.1.norm.bias"], eps)
        D, D1 = sd[f"{p}.1.fn.D"], sd[f"{p}.1.fn.D1"]
        z1 = F.relu(eta * torch.einsum("pd,nlp->nld", D, y) - eta * lam)
        grad = torch.einsum("pd,nlp->nld", D, torch.einsum("dp,nlp->nld", D, z1) - y)
        z2 = F.relu(z1 - eta * grad - eta * lam)
        x = x + torch.einsum("dp,nlp->nld", D1, z2)
    pooled = x[:, 0] if config.pooling == "cls" else x.mean(dim=1)
    pooled = F.layer_norm(
        pooled, pooled.shape[-1:], sd["mlp_head.0.weight"], sd["mlp_head.0.bias"], config.classifier_layer_norm_eps
    )
    return F.linear(pooled, sd["mlp_head.1.weight"], sd["mlp_head.1.bias"])


__all__ = ["convert_official_crate_alpha", "official_key_map", "official_forward"]
