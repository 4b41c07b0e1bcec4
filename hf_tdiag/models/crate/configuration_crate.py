"""CRATE model configuration.

This file imports only ``transformers`` so that ``save_pretrained`` can copy it
next to the weights for ``trust_remote_code`` loading.
"""

from __future__ import annotations

import dataclasses
import math

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


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def size_pair(value, name: str = "size") -> tuple[int, int]:
    """``(height, width)`` from an int (a square) or a pair of ints, as configs give ``image_size``/``patch_size``."""
    if _is_int(value):
        return int(value), int(value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_int(v) for v in value):
        return int(value[0]), int(value[1])
    raise TypeError(f"{name}: expected an int or a (height, width) pair of ints, got {value!r}")


def _check_number(
    name: str, value, low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False
):
    """``value`` a finite real number in the interval (``low``, ``high``) with the given open/closed ends."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"CrateConfig: {name} must be a finite number, got {value!r}")
    if value < low or (low_open and value == low) or value > high or (high_open and value == high):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open or high == math.inf else ']'}"
        raise ValueError(f"CrateConfig: {name} must be in {interval}, got {value!r}")


# every Auto class the saved modeling_crate.py serves: written into a saved auto_map beside whichever class
# save_pretrained recorded, so each loads with trust_remote_code=True where hf-tdiag is not installed
AUTO_MAP_MODELS = {
    "AutoModel": "modeling_crate.CrateModel",
    "AutoModelForImageClassification": "modeling_crate.CrateForImageClassification",
}

# from_preset keywords besides the dataclass fields: PreTrainedConfig's own keyword arguments
_PRETRAINED_KEYWORDS = frozenset(
    {"num_labels", "output_attentions", "attn_implementation", "torch_dtype", "use_return_dict"}
)


class CrateConfig(PreTrainedConfig):
    r"""Configuration of a CRATE (Coding RAte reduction TransformEr) vision model.

    Attributes:
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

    Examples:
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification
        >>> config = CrateConfig.from_preset("crate-tiny", variant="crate-c", num_labels=10)
        >>> config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.head_dim
        (12, 384, 6, 64)
        >>> small = CrateConfig.from_preset("crate-digits", num_labels=10)  # 8x8 digits: 4 blocks of width 64
        >>> model = CrateForImageClassification(small)
        >>> small.image_size, small.patch_size, small.num_hidden_layers, model.num_labels
        (8, 2, 4, 10)
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
        if self.head_dim is None and _is_int(self.hidden_size) and _is_int(self.num_attention_heads):
            if self.num_attention_heads > 0:
                self.head_dim = self.hidden_size // self.num_attention_heads
        self._validate_crate()
        super().__post_init__(**kwargs)

    def _validate_crate(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "num_channels"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"CrateConfig: {name} must be a positive int, got {value!r}")
        if not isinstance(self.variant, str) or self.variant not in CRATE_VARIANTS:
            raise ValueError(f"CrateConfig: variant must be one of {list(CRATE_VARIANTS)}, got {self.variant!r}")
        if not isinstance(self.pooling, str) or self.pooling not in CRATE_POOLINGS:
            raise ValueError(f"CrateConfig: pooling must be one of {list(CRATE_POOLINGS)}, got {self.pooling!r}")
        inner = self.num_attention_heads * self.head_dim
        if self.variant in ("crate-t", "crate-identity") and inner != self.hidden_size:
            raise ValueError(
                f"CrateConfig: variant {self.variant!r} needs num_attention_heads * head_dim == hidden_size, got "
                f"{self.num_attention_heads} * {self.head_dim} = {inner} != {self.hidden_size}"
            )
        image = size_pair(self.image_size, "CrateConfig: image_size")
        patch = size_pair(self.patch_size, "CrateConfig: patch_size")
        if min(patch) <= 0 or min(image) <= 0:
            raise ValueError(f"CrateConfig: image_size and patch_size must be positive, got {image} and {patch}")
        if image[0] % patch[0] or image[1] % patch[1]:
            raise ValueError(f"CrateConfig: image_size {image} must be divisible by patch_size {patch}")
        _check_number("ista_step_size", self.ista_step_size, 0.0, low_open=True)  # eta > 0: a step
        _check_number("ista_lambda", self.ista_lambda, 0.0)
        _check_number("layer_norm_eps", self.layer_norm_eps, 0.0, low_open=True)  # 0 divides constant tokens by 0
        _check_number("initializer_range", self.initializer_range, 0.0)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            _check_number(name, getattr(self, name), 0.0, 1.0, high_open=True)

    def to_dict(self) -> dict:
        """The config as a dict; an ``auto_map`` that names ``modeling_crate`` lists every CRATE Auto model class."""
        out = super().to_dict()
        auto_map = out.get("auto_map")
        if isinstance(auto_map, dict):
            modeling = [v for v in auto_map.values() if isinstance(v, str) and "modeling_crate." in v]
            if modeling:
                prefix = modeling[0].split("modeling_crate.")[0]  # "" or "<repo>--" for Hub code
                missing = {k: prefix + v for k, v in AUTO_MAP_MODELS.items() if k not in auto_map}
                out["auto_map"] = {**auto_map, **missing}
        return out

    @property
    def num_patches(self) -> int:
        """Number of patches at ``image_size`` (tokens without the CLS token)."""
        (ih, iw), (ph, pw) = (
            size_pair(self.image_size, "CrateConfig: image_size"),
            size_pair(self.patch_size, "CrateConfig: patch_size"),
        )
        return (ih // ph) * (iw // pw)

    @classmethod
    def presets(cls) -> list[str]:
        """Names accepted by :meth:`from_preset`."""
        return list(CRATE_PRESETS)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> CrateConfig:
        """Config of a named size (``crate-tiny|small|base|large``, ``crate-32``, ``crate-digits``), with overrides."""
        if not isinstance(name, str) or name not in CRATE_PRESETS:
            raise ValueError(f"CrateConfig.from_preset: unknown preset {name!r}; available: {list(CRATE_PRESETS)}")
        known = {f.name for f in dataclasses.fields(cls)} | _PRETRAINED_KEYWORDS
        unknown = sorted(set(overrides) - known)
        if unknown:
            import difflib

            hints = [
                f"{k!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(k, known, n=1)) else repr(k)
                for k in unknown
            ]
            raise TypeError(f"CrateConfig.from_preset: unknown keyword(s) {', '.join(hints)}")
        fields = dict(CRATE_PRESETS[name])
        fields.update(overrides)
        if "head_dim" not in overrides:
            hidden, heads = fields["hidden_size"], fields["num_attention_heads"]
            fields["head_dim"] = hidden // heads if _is_int(hidden) and _is_int(heads) and heads > 0 else None
        return cls(**fields)


__all__ = ["CrateConfig", "CRATE_PRESETS", "CRATE_VARIANTS", "size_pair"]
