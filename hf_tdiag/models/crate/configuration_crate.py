"""CRATE model configuration.

This file imports only ``transformers`` so that ``save_pretrained`` can copy it
next to the weights for ``trust_remote_code`` loading.
"""

from __future__ import annotations

from transformers import PreTrainedConfig

CRATE_VARIANTS = ("crate", "crate-c", "crate-n", "crate-t", "crate-fix", "crate-identity")
CRATE_POOLINGS = ("cls", "mean")

# name -> architecture fields; 224 px / patch 16 for the ImageNet sizes (Yu et al. 2023)
CRATE_PRESETS: dict[str, dict] = {
    "crate-tiny": dict(image_size=224, patch_size=16, hidden_size=384, num_hidden_layers=12, num_attention_heads=6),
    "crate-small": dict(image_size=224, patch_size=16, hidden_size=576, num_hidden_layers=12, num_attention_heads=12),
    "crate-base": dict(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12, num_attention_heads=12),
    "crate-large": dict(image_size=224, patch_size=16, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16),
    # 32 px images (CIFAR-like), 8x8 = 64 patches of 4x4
    "crate-32": dict(image_size=32, patch_size=4, hidden_size=384, num_hidden_layers=8, num_attention_heads=6),
    # 8x8 grayscale images (scikit-learn digits), 4x4 = 16 patches of 2x2
    "crate-digits": dict(
        image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=4, num_attention_heads=4
    ),
}


def _as_pair(value, name: str) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    raise TypeError(f"CrateConfig: {name} must be an int or a pair of ints, got {value!r}")


class CrateConfig(PreTrainedConfig):
    r"""Configuration of a CRATE (Coding RAte reduction TransformEr) vision model.

    Args:
        image_size (`int` or pair): input resolution the position embedding is built for.
        patch_size (`int` or pair): side of the square (or rectangular) patches.
        num_channels (`int`): image channels.
        hidden_size (`int`): token dimension ``d``.
        num_hidden_layers (`int`): number of CRATE blocks ``L``.
        num_attention_heads (`int`): number of subspaces / heads ``K``.
        head_dim (`int`, *optional*): subspace dimension ``p`` (defaults to ``hidden_size // num_attention_heads``).
        ista_step_size (`float`): ISTA step size ``eta`` (0.1).
        ista_lambda (`float`): ISTA sparsity weight ``lambda`` (0.1).
        pooling (`str`): ``"cls"`` (CLS token) or ``"mean"`` (mean over tokens) feeds the head.
        hidden_dropout_prob (`float`): dropout on the embeddings and on the MSSA output.
        attention_probs_dropout_prob (`float`): dropout on the attention probabilities.
        layer_norm_eps (`float`): LayerNorm epsilon.
        initializer_range (`float`): std of the truncated-normal / normal initializers.
        variant (`str`): output matrix of MSSA: ``crate`` learned ``W`` (+bias), ``crate-c`` ``U=[U_1..U_K]``,
            ``crate-n`` ``-U``, ``crate-t`` ``U^T`` (needs ``K*p == d``), ``crate-fix`` fixed random matrix
            (non-trainable, saved), ``crate-identity`` ``I`` (needs ``K*p == d``).

    Example:

    ```python
    >>> from hf_tdiag import CrateConfig, CrateForImageClassification
    >>> config = CrateConfig.from_preset("crate-tiny", variant="crate-c", num_labels=10)
    >>> model = CrateForImageClassification(config)
    ```
    """

    model_type = "crate"

    image_size: int | list[int] | tuple[int, int] = 224
    patch_size: int | list[int] | tuple[int, int] = 16
    num_channels: int = 3
    hidden_size: int = 384
    num_hidden_layers: int = 12
    num_attention_heads: int = 6
    head_dim: int | None = None
    ista_step_size: float = 0.1
    ista_lambda: float = 0.1
    pooling: str = "cls"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    variant: str = "crate"

    def __post_init__(self, **kwargs):
        if self.head_dim is None and isinstance(self.hidden_size, int) and isinstance(self.num_attention_heads, int):
            if self.num_attention_heads > 0:
                self.head_dim = self.hidden_size // self.num_attention_heads
        self._validate_crate()
        super().__post_init__(**kwargs)

    def _validate_crate(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "num_channels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"CrateConfig: {name} must be a positive int, got {value!r}")
        if self.variant not in CRATE_VARIANTS:
            raise ValueError(f"CrateConfig: variant must be one of {list(CRATE_VARIANTS)}, got {self.variant!r}")
        if self.pooling not in CRATE_POOLINGS:
            raise ValueError(f"CrateConfig: pooling must be one of {list(CRATE_POOLINGS)}, got {self.pooling!r}")
        inner = self.num_attention_heads * self.head_dim
        if self.variant in ("crate-t", "crate-identity") and inner != self.hidden_size:
            raise ValueError(
                f"CrateConfig: variant {self.variant!r} needs num_attention_heads * head_dim == hidden_size, got "
                f"{self.num_attention_heads} * {self.head_dim} = {inner} != {self.hidden_size}"
            )
        image = _as_pair(self.image_size, "image_size")
        patch = _as_pair(self.patch_size, "patch_size")
        if min(patch) <= 0 or min(image) <= 0:
            raise ValueError(f"CrateConfig: image_size and patch_size must be positive, got {image} and {patch}")
        if image[0] % patch[0] or image[1] % patch[1]:
            raise ValueError(f"CrateConfig: image_size {image} must be divisible by patch_size {patch}")
        for name in ("ista_step_size", "ista_lambda", "layer_norm_eps", "initializer_range"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ValueError(f"CrateConfig: {name} must be a non-negative number, got {value!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
                raise ValueError(f"CrateConfig: {name} must be in [0, 1), got {value!r}")

    @property
    def num_patches(self) -> int:
        """Number of patches at ``image_size`` (tokens without the CLS token)."""
        (ih, iw), (ph, pw) = _as_pair(self.image_size, "image_size"), _as_pair(self.patch_size, "patch_size")
        return (ih // ph) * (iw // pw)

    @classmethod
    def presets(cls) -> list[str]:
        """Names accepted by :meth:`from_preset`."""
        return list(CRATE_PRESETS)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "CrateConfig":
        """Config of a named size (``crate-tiny|small|base|large``, ``crate-32``, ``crate-digits``), with overrides."""
        if name not in CRATE_PRESETS:
            raise ValueError(f"CrateConfig.from_preset: unknown preset {name!r}; available: {list(CRATE_PRESETS)}")
        fields = dict(CRATE_PRESETS[name])
        fields.update(overrides)
        if "head_dim" not in overrides:
            fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
        return cls(**fields)


__all__ = ["CrateConfig", "CRATE_PRESETS", "CRATE_VARIANTS"]
