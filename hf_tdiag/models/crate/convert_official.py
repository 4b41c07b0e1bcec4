"""Load checkpoints of the official CRATE code into :class:`CrateForImageClassification`.

Official layout (``model.state_dict()`` of the official ``CRATE`` module, possibly wrapped as
``{"state_dict": ...}`` and/or with ``module.`` prefixes from DataParallel)::

    to_patch_embedding.1  LayerNorm(patch_dim)      after  b c (h p1) (w p2) -> b (h w) (p1 p2 c)
    to_patch_embedding.2  Linear(patch_dim -> dim)
    to_patch_embedding.3  LayerNorm(dim)
    pos_embedding         (1, patches + 1, dim)
    cls_token             (1, 1, dim)
    transformer.layers.i.0.norm          LayerNorm(dim)
    transformer.layers.i.0.fn.qkv.weight (heads * head_dim, dim)
    transformer.layers.i.0.fn.to_out.0   Linear(heads * head_dim -> dim)
    transformer.layers.i.1.norm          LayerNorm(dim)
    transformer.layers.i.1.fn.weight     (dim, dim) dictionary D
    mlp_head.0 LayerNorm(dim), mlp_head.1 Linear(dim -> classes)

Imports only torch/transformers and the sibling modules.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .configuration_crate import CRATE_PRESETS, CrateConfig
from .modeling_crate import CrateForImageClassification

_WRAPPER_KEYS = ("state_dict", "model", "model_state_dict")


def unwrap_official_state_dict(checkpoint: Mapping) -> dict[str, torch.Tensor]:
    """Strip a ``state_dict``/``model`` wrapper key and ``module.`` prefixes; every value must be a tensor."""
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f"state_dict must be a mapping of parameter names to tensors, got {type(checkpoint).__name__}")
    sd = checkpoint
    for key in _WRAPPER_KEYS:
        if key in sd and isinstance(sd[key], Mapping) and not any(isinstance(v, torch.Tensor) for v in sd.values()):
            sd = sd[key]
            break
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        name = str(key)
        while name.startswith("module."):
            name = name[len("module.") :]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"state_dict[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
        out[name] = value
    return out


def _count_layers(sd: Mapping[str, torch.Tensor]) -> int:
    indices = set()
    for key in sd:
        if key.startswith("transformer.layers."):
            part = key.split(".")[2]
            if part.isdigit():
                indices.add(int(part))
    return max(indices) + 1 if indices else 0


def official_key_map(config: CrateConfig) -> dict[str, str]:
    """Map official parameter name -> our parameter name for ``config`` (tied variants have no ``to_out``)."""
    m = {
        "to_patch_embedding.1.weight": "crate.embeddings.patch_embeddings.norm_in.weight",
        "to_patch_embedding.1.bias": "crate.embeddings.patch_embeddings.norm_in.bias",
        "to_patch_embedding.2.weight": "crate.embeddings.patch_embeddings.projection.weight",
        "to_patch_embedding.2.bias": "crate.embeddings.patch_embeddings.projection.bias",
        "to_patch_embedding.3.weight": "crate.embeddings.patch_embeddings.norm_out.weight",
        "to_patch_embedding.3.bias": "crate.embeddings.patch_embeddings.norm_out.bias",
        "pos_embedding": "crate.embeddings.position_embeddings",
        "cls_token": "crate.embeddings.cls_token",
        "mlp_head.0.weight": "classifier_norm.weight",
        "mlp_head.0.bias": "classifier_norm.bias",
        "mlp_head.1.weight": "classifier.weight",
        "mlp_head.1.bias": "classifier.bias",
    }
    for i in range(config.num_hidden_layers):
        src, dst = f"transformer.layers.{i}", f"crate.encoder.layer.{i}"
        m[f"{src}.0.norm.weight"] = f"{dst}.layernorm_before.weight"
        m[f"{src}.0.norm.bias"] = f"{dst}.layernorm_before.bias"
        m[f"{src}.0.fn.qkv.weight"] = f"{dst}.attention.qkv.weight"
        if config.variant == "crate":
            m[f"{src}.0.fn.to_out.0.weight"] = f"{dst}.attention.out_proj.weight"
            m[f"{src}.0.fn.to_out.0.bias"] = f"{dst}.attention.out_proj.bias"
        elif config.variant == "crate-fix":
            m[f"{src}.0.fn.to_out.0.weight"] = f"{dst}.attention.fixed_output"
        m[f"{src}.1.norm.weight"] = f"{dst}.layernorm_after.weight"
        m[f"{src}.1.norm.bias"] = f"{dst}.layernorm_after.bias"
        m[f"{src}.1.fn.weight"] = f"{dst}.ista.weight"
    return m


def _resolve_config(config, sd: Mapping[str, torch.Tensor]) -> CrateConfig:
    if isinstance(config, CrateConfig):
        return config
    if isinstance(config, str):
        if config not in CRATE_PRESETS:
            raise ValueError(f"config: unknown preset {config!r}; available: {list(CRATE_PRESETS)}")
        head = sd.get("mlp_head.1.weight")
        if head is None:
            raise ValueError("state_dict is missing key 'mlp_head.1.weight' (classifier weight)")
        return CrateConfig.from_preset(config, num_labels=int(head.shape[0]))
    raise TypeError(f"config must be a CrateConfig or a preset name, got {type(config).__name__}")


def convert_official_crate(state_dict: Mapping, config: CrateConfig | str) -> CrateForImageClassification:
    """Build a :class:`CrateForImageClassification` holding the weights of an official CRATE ``state_dict``.

    ``config`` is a :class:`CrateConfig` (its ``variant`` decides how ``to_out`` is read: learned for ``crate``,
    fixed matrix for ``crate-fix`` (its bias must be zero), ignored for the tied variants) or a preset name, in which
    case ``num_labels`` is read from the checkpoint. Missing, unexpected, mis-shaped or non-finite entries raise a
    ``ValueError`` naming the key.
    """
    sd = unwrap_official_state_dict(state_dict)
    config = _resolve_config(config, sd)
    key_map = official_key_map(config)
    model = CrateForImageClassification(config)
    target = model.state_dict()

    n_layers = _count_layers(sd)
    layer_hint = (
        f" (the checkpoint has {n_layers} layers, the config {config.num_hidden_layers})"
        if n_layers != config.num_hidden_layers
        else ""
    )
    missing = [k for k in key_map if k not in sd]
    if missing:
        raise ValueError(
            f"state_dict is missing {len(missing)} key(s) for a {config.num_hidden_layers}-layer {config.variant!r} "
            f"model, e.g. {missing[:5]}{layer_hint}"
        )
    ignored_prefixes = ()
    if config.variant not in ("crate", "crate-fix"):
        ignored_prefixes = tuple(f"transformer.layers.{i}.0.fn.to_out." for i in range(config.num_hidden_layers))
    unexpected = [k for k in sd if k not in key_map and not k.startswith(ignored_prefixes)]
    if config.variant == "crate-fix":
        bias_keys = [f"transformer.layers.{i}.0.fn.to_out.0.bias" for i in range(config.num_hidden_layers)]
        for key in bias_keys:
            if key in sd and bool(sd[key].ne(0).any()):
                raise ValueError(f"state_dict[{key!r}] is non-zero but variant 'crate-fix' has no output bias")
        unexpected = [k for k in unexpected if k not in bias_keys]
    if unexpected:
        raise ValueError(f"state_dict has {len(unexpected)} unexpected key(s), e.g. {unexpected[:5]}{layer_hint}")

    converted = {}
    for src, dst in key_map.items():
        tensor = sd[src]
        if tuple(tensor.shape) != tuple(target[dst].shape):
            raise ValueError(
                f"state_dict[{src!r}] has shape {tuple(tensor.shape)}, expected {tuple(target[dst].shape)} "
                f"for {dst} of config (hidden_size={config.hidden_size}, heads={config.num_attention_heads}, "
                f"head_dim={config.head_dim}, patch_size={config.patch_size}, num_labels={config.num_labels})"
            )
        if not tensor.is_floating_point():
            raise ValueError(f"state_dict[{src!r}] must be floating point, got {tensor.dtype}")
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"state_dict[{src!r}] contains NaN or inf")
        converted[dst] = tensor.detach().to(dtype=target[dst].dtype)
    model.load_state_dict(converted, strict=True)
    return model.eval()


__all__ = ["convert_official_crate", "official_key_map", "unwrap_official_state_dict"]
