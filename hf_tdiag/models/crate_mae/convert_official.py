"""Load checkpoints of the authors' CRATE-MAE code (CRATE repository, ``model/crate_ae/crate_ae.py``,
``MaskedAutoencoderViT`` with ``Block_CRATE`` encoder and decoder blocks) into :class:`CrateMAEForPreTraining`.

Official layout (``model.state_dict()``, possibly wrapped as ``{"model": ...}`` and/or with ``module.`` prefixes)::

    patch_embed.proj.weight (d, C, P, P), patch_embed.proj.bias      cls_token, mask_token (1, 1, d)
    pos_embed, decoder_pos_embed (1, N + 1, d)                        fixed sine-cosine (recomputed here)
    blocks.i.layers.0.0.norm, .0.0.fn.qkv.weight, .0.0.fn.to_out.0.{weight,bias}       MSSA
    blocks.i.layers.0.1.norm, .0.1.fn.weight                                          ISTA dictionary
    norm                                                             the encoder's final LayerNorm
    decoder_blocks.i.layers.0.0.norm, .0.0.fn.weight                 D·LN(x)
    decoder_blocks.i.layers.0.1.norm, .0.1.fn.qkv.weight, .0.1.fn.to_out.0.{weight,bias}   MSSA
    decoder_norm, decoder_pred.{weight,bias}
    decoder_embed.{weight,bias}                                      defined but unused by the authors' forward
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..crate.convert_official import unwrap_official_state_dict
from .configuration_crate_mae import CRATE_MAE_PRESETS, CrateMAEConfig
from .modeling_crate_mae import CrateMAEForPreTraining, sincos_position_embedding

_UNUSED = ("decoder_embed.weight", "decoder_embed.bias")


def _ln(m: dict, src: str, dst: str) -> None:
    m[f"{src}.weight"], m[f"{src}.bias"] = f"{dst}.weight", f"{dst}.bias"


def official_key_map(config: CrateMAEConfig) -> dict[str, str]:
    """Map official parameter name -> our parameter name for ``config``."""
    m = {
        "patch_embed.proj.weight": "crate_mae.embeddings.projection.weight",
        "patch_embed.proj.bias": "crate_mae.embeddings.projection.bias",
        "cls_token": "crate_mae.embeddings.cls_token",
        "mask_token": "crate_mae.embeddings.mask_token",
        "pos_embed": "crate_mae.embeddings.position_embeddings",
        "decoder_pred.weight": "decoder.decoder_pred.weight",
        "decoder_pred.bias": "decoder.decoder_pred.bias",
    }
    _ln(m, "norm", "crate_mae.layernorm")
    _ln(m, "decoder_norm", "decoder.decoder_norm")
    for i in range(config.num_hidden_layers):
        src, dst = f"blocks.{i}.layers.0", f"crate_mae.encoder.{i}"
        _ln(m, f"{src}.0.norm", f"{dst}.layernorm_before")
        _ln(m, f"{src}.1.norm", f"{dst}.layernorm_after")
        m[f"{src}.0.fn.qkv.weight"] = f"{dst}.attention.qkv.weight"
        if config.num_attention_heads > 1:
            _ln(m, f"{src}.0.fn.to_out.0", f"{dst}.attention.out_proj")
        m[f"{src}.1.fn.weight"] = f"{dst}.ista.weight"
    for i in range(config.decoder_num_hidden_layers):
        src, dst = f"decoder_blocks.{i}.layers.0", f"decoder.layer.{i}"
        _ln(m, f"{src}.0.norm", f"{dst}.layernorm_before")
        m[f"{src}.0.fn.weight"] = f"{dst}.dictionary.weight"
        _ln(m, f"{src}.1.norm", f"{dst}.layernorm_after")
        m[f"{src}.1.fn.qkv.weight"] = f"{dst}.attention.qkv.weight"
        if config.decoder_num_attention_heads > 1:
            _ln(m, f"{src}.1.fn.to_out.0", f"{dst}.attention.out_proj")
    return m


def _resolve_config(config) -> CrateMAEConfig:
    if isinstance(config, CrateMAEConfig):
        return config
    if isinstance(config, str) and config in CRATE_MAE_PRESETS:
        return CrateMAEConfig.from_preset(config)
    raise ValueError(f"config: expected a CrateMAEConfig or one of {list(CRATE_MAE_PRESETS)}, got {config!r}")


def convert_official_crate_mae(state_dict: Mapping, config: CrateMAEConfig | str) -> CrateMAEForPreTraining:
    """A :class:`CrateMAEForPreTraining` holding an official CRATE-MAE ``state_dict``'s weights.

    The fixed sine-cosine positions are recomputed and must agree with the checkpoint's ``pos_embed`` and
    ``decoder_pos_embed`` (1e-5); ``decoder_embed`` (unused by the authors' forward) is dropped. Missing,
    unexpected, mis-shaped or non-finite entries raise a ``ValueError`` naming the key.
    """
    sd = unwrap_official_state_dict(state_dict)
    config = _resolve_config(config)
    key_map = official_key_map(config)
    model = CrateMAEForPreTraining(config)
    target = model.state_dict()
    missing = [k for k in (*key_map, "decoder_pos_embed") if k not in sd]
    if missing:
        raise ValueError(f"state_dict is missing {len(missing)} key(s) for this CRATE-MAE config, e.g. {missing[:5]}")
    unexpected = [k for k in sd if k not in key_map and k not in (*_UNUSED, "decoder_pos_embed")]
    if unexpected:
        raise ValueError(f"state_dict has {len(unexpected)} unexpected key(s), e.g. {unexpected[:5]}")
    expected_pos = sincos_position_embedding(config.hidden_size, config.image_size // config.patch_size)
    for key in ("pos_embed", "decoder_pos_embed"):
        if sd[key].shape != expected_pos.shape or not torch.allclose(sd[key].float(), expected_pos, atol=1e-5):
            raise ValueError(f"state_dict[{key!r}] is not the fixed 2-D sine-cosine embedding of this config")
    converted = {}
    for src, dst in key_map.items():
        tensor = sd[src]
        if tuple(tensor.shape) != tuple(target[dst].shape):
            raise ValueError(
                f"state_dict[{src!r}] has shape {tuple(tensor.shape)}, expected {tuple(target[dst].shape)}"
            )
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"state_dict[{src!r}] must be finite floating point, got {tensor.dtype}")
        converted[dst] = tensor.detach().to(dtype=target[dst].dtype)
    model.load_state_dict(converted, strict=True)
    return model.eval()


__all__ = ["convert_official_crate_mae", "official_key_map"]
