"""CRATE-MAE (Pai et al., ICLR 2024, "Masked Completion via Structured Diffusion with White-Box Transformers")
model configuration.

This file imports only ``transformers`` so that ``save_pretrained`` can copy it next to the weights for
``trust_remote_code`` loading.
"""

from __future__ import annotations

import dataclasses
import math

from transformers import PreTrainedConfig

# the authors' mae_crate_* constructors (CRATE repository, model/crate_ae/crate_ae.py): patch 16, decoder as wide
# and (from small up) as deep as the encoder
CRATE_MAE_PRESETS: dict[str, dict] = {
    "crate-mae-tiny": dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, decoder_num_hidden_layers=12,
                           decoder_num_attention_heads=6),
    "crate-mae-small": dict(hidden_size=576, num_hidden_layers=12, num_attention_heads=12,
                            decoder_num_hidden_layers=12, decoder_num_attention_heads=12),
    "crate-mae-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                           decoder_num_hidden_layers=12, decoder_num_attention_heads=12),
    "crate-mae-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                            decoder_num_hidden_layers=24, decoder_num_attention_heads=16),
    # 8x8 grayscale images (scikit-learn digits), 16 patches of 2x2
    "crate-mae-digits": dict(image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=4,
                             num_attention_heads=4, decoder_num_hidden_layers=2, decoder_num_attention_heads=4,
                             mask_ratio=0.5),
}  # fmt: skip

_PRETRAINED_KEYWORDS = frozenset(
    {"num_labels", "output_attentions", "attn_implementation", "torch_dtype", "use_return_dict"}
)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_number(name: str, value, low: float, high: float = math.inf, open_ends: str = "") -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"CrateMAEConfig: {name} must be a finite number, got {value!r}")
    if value < low or ("l" in open_ends and value == low) or value > high or ("h" in open_ends and value == high):
        raise ValueError(f"CrateMAEConfig: {name} must lie in the range ({low}, {high}) allowed for it, got {value!r}")


class CrateMAEConfig(PreTrainedConfig):
    r"""Configuration of CRATE-MAE: a CRATE encoder and a decoder whose blocks invert the encoder's operators.

    Encoder block: ``z½ = z + MSSA(LN1 z)``, ``z⁺ = ReLU(x + η Dᵀ(x − D x) − ηλ)`` with ``x = LN2 z½`` (CRATE's,
    λ = 0.5). Decoder block: ``y = D·LN1(x)``, ``x⁺ = y − MSSA(LN2 y)``. As in the authors' code the decoder is as
    wide as the encoder and the encoder runs on the whole sequence with mask tokens in the masked places.

    Args:
        image_size, patch_size, num_channels: input geometry (square images, square patches).
        hidden_size, num_hidden_layers, num_attention_heads: encoder width, depth and heads.
        decoder_num_hidden_layers, decoder_num_attention_heads: decoder depth and heads.
        ista_step_size (`float`): η (0.1). ista_lambda (`float`): λ (0.5, the authors' default).
        layer_norm_eps (`float`): the blocks' LayerNorm eps (1e-5). final_layer_norm_eps (`float`): the encoder's
            and decoder's final LayerNorm eps (1e-6).
        mask_ratio (`float`): fraction of patches masked in pre-training (0.75).
        norm_pix_loss (`bool`): reconstruct per-patch normalized pixels.
        patch_embedding_gain (`float`): gain of the patch projection's Xavier-uniform initialization (1.0, the
            authors'). Xavier scales the patch content by ``sqrt(2 / (C·p² + d))``: at 16×16×3 patches it is of the
            unit-amplitude sine-cosine positions' size, at 2×2 patches of one channel about a third of it. Masked
            pre-training learns either way; a classifier trained from random init on such small patches needs
            about 3 (digits test accuracy at seeds 0-2: 0.17-0.46 at 1, 0.77-0.84 at 3).
        initializer_range (`float`): std of the CLS and mask tokens' normal initialization (MAE's 0.02); the linear
            maps are Xavier-uniform and the dictionaries Kaiming-uniform, as the authors initialize them.
    """

    model_type = "crate-mae"

    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    decoder_num_hidden_layers: int = 12
    decoder_num_attention_heads: int = 12
    ista_step_size: float = 0.1
    ista_lambda: float = 0.5
    layer_norm_eps: float = 1e-5
    final_layer_norm_eps: float = 1e-6
    mask_ratio: float = 0.75
    norm_pix_loss: bool = False
    patch_embedding_gain: float = 1.0
    initializer_range: float = 0.02

    def __post_init__(self, **kwargs):
        self.validate_architecture()
        super().__post_init__(**kwargs)

    def validate_architecture(self) -> None:
        """Raise a ``ValueError`` naming the first field that cannot build a model."""
        for name in ("image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers",
                     "num_attention_heads", "decoder_num_hidden_layers", "decoder_num_attention_heads"):  # fmt: skip
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"CrateMAEConfig: {name} must be a positive int, got {value!r}")
        if self.image_size % self.patch_size:
            raise ValueError(
                f"CrateMAEConfig: image_size {self.image_size} must be divisible by patch_size {self.patch_size}"
            )
        for heads in ("num_attention_heads", "decoder_num_attention_heads"):
            if self.hidden_size % getattr(self, heads):
                raise ValueError(f"CrateMAEConfig: hidden_size {self.hidden_size} must be a multiple of {heads}")
        if self.hidden_size % 4:
            raise ValueError("CrateMAEConfig: hidden_size must be a multiple of 4 (2-D sine-cosine positions)")
        _check_number("ista_step_size", self.ista_step_size, 0.0, open_ends="l")
        _check_number("ista_lambda", self.ista_lambda, 0.0)
        _check_number("layer_norm_eps", self.layer_norm_eps, 0.0, open_ends="l")
        _check_number("final_layer_norm_eps", self.final_layer_norm_eps, 0.0, open_ends="l")
        _check_number("mask_ratio", self.mask_ratio, 0.0, 1.0, open_ends="h")
        _check_number("initializer_range", self.initializer_range, 0.0)
        _check_number("patch_embedding_gain", self.patch_embedding_gain, 0.0, open_ends="l")

    @property
    def num_patches(self) -> int:
        """Number of patches (tokens without the CLS token)."""
        return (self.image_size // self.patch_size) ** 2

    @classmethod
    def presets(cls) -> list[str]:
        """Names accepted by :meth:`from_preset`."""
        return list(CRATE_MAE_PRESETS)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> CrateMAEConfig:
        """Config of a named size (``crate-mae-tiny|small|base|large``, ``crate-mae-digits``) with overrides."""
        if not isinstance(name, str) or name not in CRATE_MAE_PRESETS:
            raise ValueError(
                f"CrateMAEConfig.from_preset: unknown preset {name!r}; available: {list(CRATE_MAE_PRESETS)}"
            )
        known = {f.name for f in dataclasses.fields(cls)} | _PRETRAINED_KEYWORDS
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"CrateMAEConfig.from_preset: unknown keyword(s) {unknown}")
        return cls(**{**CRATE_MAE_PRESETS[name], **overrides})


__all__ = ["CrateMAEConfig", "CRATE_MAE_PRESETS"]
