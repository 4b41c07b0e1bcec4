"""CRATE-α model configuration (Yang et al. 2024, "Scaling White-Box Transformers for Vision").

This file imports only ``transformers`` so that ``save_pretrained`` can copy it next to the weights for
``trust_remote_code`` loading.
"""

from __future__ import annotations

import dataclasses
import math

from transformers import PreTrainedConfig

# widths, depths and heads of the authors' ``decode_variant`` (models/crate.py); the patch size is part of the name
_SIZES = {
    "tiny": dict(hidden_size=192, num_hidden_layers=12, num_attention_heads=3),
    "small": dict(hidden_size=576, num_hidden_layers=12, num_attention_heads=12),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16),
    "huge": dict(hidden_size=1280, num_hidden_layers=32, num_attention_heads=16),
}
CRATE_ALPHA_PRESETS: dict[str, dict] = {
    f"crate-alpha-{size}-{patch}": dict(image_size=224, patch_size=patch, **_SIZES[size])
    for size, patches in (("tiny", (16,)), ("small", (16,)), ("base", (32, 16, 8)), ("large", (32, 14, 8)))
    for patch in patches
}
CRATE_ALPHA_PRESETS["crate-alpha-huge-14"] = dict(image_size=224, patch_size=14, **_SIZES["huge"])
# 8x8 grayscale images (scikit-learn digits), 4x4 = 16 patches of 2x2
CRATE_ALPHA_PRESETS["crate-alpha-digits"] = dict(
    image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=4, num_attention_heads=4
)

_PRETRAINED_KEYWORDS = frozenset(
    {"num_labels", "output_attentions", "attn_implementation", "torch_dtype", "use_return_dict"}
)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def alpha_size_pair(value, name: str = "size") -> tuple[int, int]:
    """``(height, width)`` from an int (a square) or a pair of ints."""
    if _is_int(value):
        return int(value), int(value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_int(v) for v in value):
        return int(value[0]), int(value[1])
    raise TypeError(f"{name}: expected an int or a (height, width) pair of ints, got {value!r}")


def _check_number(name: str, value, low: float, high: float = math.inf, open_ends: str = "") -> None:
    """``value`` finite and in [low, high]; ``open_ends`` holds ``"l"``/``"h"`` for an open end."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"CrateAlphaConfig: {name} must be a finite number, got {value!r}")
    if value < low or ("l" in open_ends and value == low) or value > high or ("h" in open_ends and value == high):
        interval = (
            f"{'(' if 'l' in open_ends else '['}{low}, {high}{')' if 'h' in open_ends or high == math.inf else ']'}"
        )
        raise ValueError(f"CrateAlphaConfig: {name} must be in {interval}, got {value!r}")


class CrateAlphaConfig(PreTrainedConfig):
    r"""Configuration of a CRATE-α vision model.

    One block: ``z½ = z + MSSA(LN(z))`` (MSSA without output bias), then the overcomplete two-step sparse code of
    ``x = LN(z½)``: ``a₁ = ReLU(η·Dᵀx − ηλ)``, ``a₂ = ReLU(a₁ − η·Dᵀ(D a₁ − x) − ηλ)``, ``z⁺ = z½ + D₁ a₂`` with
    ``D, D₁`` of shape ``(d, overcomplete_ratio·d)``.

    Args:
        image_size, patch_size (`int` or pair): input resolution and the stride/kernel of the patch convolution.
        num_channels (`int`): image channels.
        hidden_size (`int`): token dimension ``d``.
        num_hidden_layers (`int`): number of blocks.
        num_attention_heads (`int`): subspaces / heads ``K``.
        head_dim (`int`, *optional*): subspace dimension ``p`` (``hidden_size // num_attention_heads``).
        overcomplete_ratio (`int`): dictionary width over ``d`` (4).
        ista_step_size (`float`): ``η`` (0.1). ista_lambda (`float`): ``λ`` (0.1).
        layer_norm_eps (`float`): epsilon of the blocks' LayerNorms (1e-6, as the authors' code).
        classifier_layer_norm_eps (`float`): epsilon of the head's LayerNorm (1e-5: PyTorch's default there).
        pooling (`str`): ``"cls"`` (the PyTorch release) or ``"mean"``.
        hidden_dropout_prob, attention_probs_dropout_prob (`float`): dropouts.
        initializer_range (`float`): std of the normal initializers.
    """

    model_type = "crate-alpha"

    image_size: int | list[int] | tuple[int, int] = 224
    patch_size: int | list[int] | tuple[int, int] = 16
    num_channels: int = 3
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    head_dim: int | None = None
    overcomplete_ratio: int = 4
    ista_step_size: float = 0.1
    ista_lambda: float = 0.1
    layer_norm_eps: float = 1e-6
    classifier_layer_norm_eps: float = 1e-5
    pooling: str = "cls"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    initializer_range: float = 0.02

    def __post_init__(self, **kwargs):
        if self.head_dim is None and _is_int(self.hidden_size) and _is_int(self.num_attention_heads):
            if self.num_attention_heads > 0:
                self.head_dim = self.hidden_size // self.num_attention_heads
        self.validate_architecture()
        super().__post_init__(**kwargs)

    def validate_architecture(self) -> None:
        """Raise a ``ValueError`` naming the first field that cannot build a model."""
        for name in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "head_dim",
            "num_channels",
            "overcomplete_ratio",
        ):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"CrateAlphaConfig: {name} must be a positive int, got {value!r}")
        if self.pooling not in ("cls", "mean"):
            raise ValueError(f"CrateAlphaConfig: pooling must be 'cls' or 'mean', got {self.pooling!r}")
        image = alpha_size_pair(self.image_size, "CrateAlphaConfig: image_size")
        patch = alpha_size_pair(self.patch_size, "CrateAlphaConfig: patch_size")
        if min(patch) <= 0 or min(image) <= 0:
            raise ValueError(f"CrateAlphaConfig: image_size and patch_size must be positive, got {image} and {patch}")
        if image[0] % patch[0] or image[1] % patch[1]:
            raise ValueError(f"CrateAlphaConfig: image_size {image} must be divisible by patch_size {patch}")
        _check_number("ista_step_size", self.ista_step_size, 0.0, open_ends="l")
        _check_number("ista_lambda", self.ista_lambda, 0.0)
        _check_number("layer_norm_eps", self.layer_norm_eps, 0.0, open_ends="l")
        _check_number("classifier_layer_norm_eps", self.classifier_layer_norm_eps, 0.0, open_ends="l")
        _check_number("initializer_range", self.initializer_range, 0.0)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            _check_number(name, getattr(self, name), 0.0, 1.0, open_ends="h")

    @property
    def num_patches(self) -> int:
        """Number of patches at ``image_size`` (tokens without the CLS token)."""
        (ih, iw), (ph, pw) = alpha_size_pair(self.image_size), alpha_size_pair(self.patch_size)
        return (ih // ph) * (iw // pw)

    @property
    def dictionary_size(self) -> int:
        """Number of atoms ``overcomplete_ratio · d`` of ``D`` and ``D₁``."""
        return self.overcomplete_ratio * self.hidden_size

    @classmethod
    def presets(cls) -> list[str]:
        """Names accepted by :meth:`from_preset`."""
        return list(CRATE_ALPHA_PRESETS)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> CrateAlphaConfig:
        """Config of a named size (``crate-alpha-base-16``, ``crate-alpha-large-14``, ``crate-alpha-digits``, ...)."""
        if not isinstance(name, str) or name not in CRATE_ALPHA_PRESETS:
            raise ValueError(
                f"CrateAlphaConfig.from_preset: unknown preset {name!r}; available: {list(CRATE_ALPHA_PRESETS)}"
            )
        known = {f.name for f in dataclasses.fields(cls)} | _PRETRAINED_KEYWORDS
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"CrateAlphaConfig.from_preset: unknown keyword(s) {unknown}")
        fields = dict(CRATE_ALPHA_PRESETS[name])
        fields.update(overrides)
        if "head_dim" not in overrides:
            fields["head_dim"] = None
        return cls(**fields)


__all__ = ["CrateAlphaConfig", "CRATE_ALPHA_PRESETS", "alpha_size_pair"]
