"""ToST (Token Statistics Transformer, Wu et al. 2025) model configuration.

This file imports only ``transformers`` so that ``save_pretrained`` can copy it next to the weights for
``trust_remote_code`` loading.
"""

from __future__ import annotations

import dataclasses
import math

from transformers import PreTrainedConfig

# the authors' timm registrations in tost_vision/tost.py (``tost_cab_<size>_<depth>_p<patch>``): layer scale 1.0
# at depth 12 and 1e-5 at depth 24, qkv bias, LayerNorm eps 1e-6, two class-attention blocks, Fourier positions
_SIZES = {
    "tiny-12": dict(hidden_size=192, num_hidden_layers=12, num_attention_heads=4, layer_scale_init_value=1.0),
    "small-12": dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=8, layer_scale_init_value=1.0),
    "tiny-24": dict(hidden_size=192, num_hidden_layers=24, num_attention_heads=4, layer_scale_init_value=1e-5),
    "small-24": dict(hidden_size=384, num_hidden_layers=24, num_attention_heads=8, layer_scale_init_value=1e-5),
    "medium-24": dict(hidden_size=512, num_hidden_layers=24, num_attention_heads=8, layer_scale_init_value=1e-5),
    "large-24": dict(hidden_size=768, num_hidden_layers=24, num_attention_heads=16, layer_scale_init_value=1e-5),
}
TOST_PRESETS: dict[str, dict] = {
    f"tost-{size}-p{patch}": dict(image_size=224, patch_size=patch, **fields)
    for size, fields in _SIZES.items()
    for patch in (16, 8)
}
# 8x8 grayscale images (scikit-learn digits): 4x4 = 16 patches of 2x2 (one stride-2 convolution)
TOST_PRESETS["tost-digits"] = dict(
    image_size=8,
    patch_size=2,
    num_channels=1,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    layer_scale_init_value=1.0,
    num_class_attention_layers=1,
)

_PRETRAINED_KEYWORDS = frozenset(
    {"num_labels", "output_attentions", "attn_implementation", "torch_dtype", "use_return_dict"}
)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_number(name: str, value, low: float, high: float = math.inf, open_ends: str = "") -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"TostConfig: {name} must be a finite number, got {value!r}")
    if value < low or ("l" in open_ends and value == low) or value > high or ("h" in open_ends and value == high):
        raise ValueError(f"TostConfig: {name} must be in the range ({low}, {high}) allowed for it, got {value!r}")


class TostConfig(PreTrainedConfig):
    r"""Configuration of a ToST vision model (Token Statistics Self-Attention, linear in the number of tokens).

    Blocks: ``z½ = z + γ₁ ⊙ TSSA(LN1 z)``, ``z⁺ = z½ + γ₂ ⊙ MLP(LN2 z½)``; then a CLS token, class-attention
    blocks (CaiT), a LayerNorm and the linear head on the CLS token.

    Args:
        image_size (`int`): resolution of the presets (any multiple of ``patch_size`` runs: the positions are Fourier).
        patch_size (`int`): a power of two; the patch embedding is ``log2(patch_size)`` stride-2 3x3 convolutions
            with BatchNorm (GELU between them), as XCiT's and the authors'.
        num_channels, hidden_size, num_hidden_layers, num_attention_heads: as in ViT (head_dim = d / K).
        mlp_ratio (`float`): MLP hidden size over ``d``. hidden_act (`str`): ``"gelu"``.
        qkv_bias (`bool`): bias of the TSSA projection ``U_kᵀ`` (True in the authors' presets).
        layer_scale_init_value (`float`): initial ``γ₁, γ₂`` (the authors' ``eta``).
        num_class_attention_layers (`int`): CaiT class-attention blocks after the TSSA blocks (2).
        use_position_encoding (`bool`), position_hidden_dim (`int`): Fourier position encoding and its width (32).
        layer_norm_eps (`float`): 1e-6. causal (`bool`): cumulative (causal) token statistics, the language form.
        hidden_dropout_prob, attention_probs_dropout_prob, initializer_range: as in ViT.
    """

    model_type = "tost"

    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    hidden_size: int = 384
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    mlp_ratio: float = 4.0
    hidden_act: str = "gelu"
    qkv_bias: bool = True
    layer_scale_init_value: float = 1.0
    num_class_attention_layers: int = 2
    use_position_encoding: bool = True
    position_hidden_dim: int = 32
    layer_norm_eps: float = 1e-6
    causal: bool = False
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    initializer_range: float = 0.02

    def __post_init__(self, **kwargs):
        self.validate_architecture()
        super().__post_init__(**kwargs)

    def validate_architecture(self) -> None:
        """Raise a ``ValueError`` naming the first field that cannot build a model."""
        for name in ("image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers",
                     "num_attention_heads", "position_hidden_dim"):  # fmt: skip
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"TostConfig: {name} must be a positive int, got {value!r}")
        if not _is_int(self.num_class_attention_layers) or self.num_class_attention_layers < 0:
            raise ValueError(
                f"TostConfig: num_class_attention_layers must be an int >= 0, got {self.num_class_attention_layers!r}"
            )
        if self.patch_size & (self.patch_size - 1) or self.patch_size < 2:
            raise ValueError(
                f"TostConfig: patch_size must be a power of two >= 2 (stride-2 convolutions), got {self.patch_size}"
            )
        if self.image_size % self.patch_size:
            raise ValueError(
                f"TostConfig: image_size {self.image_size} must be divisible by patch_size {self.patch_size}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"TostConfig: hidden_size {self.hidden_size} must be a multiple of num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_size % (self.patch_size // 2) or self.position_hidden_dim % 2:
            raise ValueError("TostConfig: hidden_size must be divisible by patch_size / 2 and position_hidden_dim even")
        if self.hidden_act != "gelu":
            raise ValueError(f"TostConfig: hidden_act must be 'gelu', got {self.hidden_act!r}")
        _check_number("mlp_ratio", self.mlp_ratio, 0.0, open_ends="l")
        _check_number("layer_scale_init_value", self.layer_scale_init_value, 0.0)
        _check_number("layer_norm_eps", self.layer_norm_eps, 0.0, open_ends="l")
        _check_number("initializer_range", self.initializer_range, 0.0)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            _check_number(name, getattr(self, name), 0.0, 1.0, open_ends="h")

    @property
    def head_dim(self) -> int:
        """Per-head dimension ``p = d / K``."""
        return self.hidden_size // self.num_attention_heads

    @property
    def num_patches(self) -> int:
        """Number of patch tokens at ``image_size``."""
        return (self.image_size // self.patch_size) ** 2

    @classmethod
    def presets(cls) -> list[str]:
        """Names accepted by :meth:`from_preset`."""
        return list(TOST_PRESETS)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> TostConfig:
        """Config of a named size (``tost-small-12-p16``, ``tost-large-24-p8``, ``tost-digits``, ...)."""
        if not isinstance(name, str) or name not in TOST_PRESETS:
            raise ValueError(f"TostConfig.from_preset: unknown preset {name!r}; available: {list(TOST_PRESETS)}")
        known = {f.name for f in dataclasses.fields(cls)} | _PRETRAINED_KEYWORDS
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"TostConfig.from_preset: unknown keyword(s) {unknown}")
        return cls(**{**TOST_PRESETS[name], **overrides})


__all__ = ["TostConfig", "TOST_PRESETS"]
