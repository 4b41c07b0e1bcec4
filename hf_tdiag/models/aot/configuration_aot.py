"""Configurations of the attention-only transformer (AoT, Wang et al., ICML 2025): a vision model and a causal
language model.

This file imports only ``transformers`` so that ``save_pretrained`` can copy it next to the weights for
``trust_remote_code`` loading.
"""

from __future__ import annotations

import dataclasses
import math

from transformers import PreTrainedConfig

#: the attention operator of a block: ``mssa`` (q = k = v = U_k^T z, CRATE's subspace attention) or ``mhsa`` (separate
#: query, key, value and output projections, the standard multi-head attention)
AOT_ATTENTIONS = ("mssa", "mhsa")
#: the output matrix of MSSA: ``learned`` (a separate ``W_O`` with bias) or ``subspace`` (``U = [U_1..U_K]``: the
#: update ``sum_k U_k U_k^T Z softmax(...)`` of the paper's denoising operator, no extra parameters)
AOT_MSSA_OUTPUTS = ("learned", "subspace")
AOT_POOLINGS = ("cls", "mean")

# name -> architecture fields. "aot-digits" has the width, heads and patches of "crate-digits" and 6 blocks instead
# of 4: without the ISTA dictionary a block has 2/3 of a CRATE block's weights, so the two match in parameters
# (50,304 against 50,432 in the blocks)
AOT_PRESETS: dict[str, dict] = {
    "aot-digits": dict(
        image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=6, num_attention_heads=4
    ),
    "aot-32": dict(image_size=32, patch_size=4, hidden_size=384, num_hidden_layers=12, num_attention_heads=6),
    "aot-tiny": dict(image_size=224, patch_size=16, hidden_size=384, num_hidden_layers=12, num_attention_heads=6),
    "aot-small": dict(image_size=224, patch_size=16, hidden_size=576, num_hidden_layers=12, num_attention_heads=12),
    "aot-base": dict(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12, num_attention_heads=12),
}

AOT_TEXT_PRESETS: dict[str, dict] = {
    # GPT-2 small's width, depth, heads, vocabulary and context with attention-only blocks (AoT-MHSA-L)
    "aot-mhsa-gpt2": dict(vocab_size=50257, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                          max_position_embeddings=1024, attention="mhsa", bos_token_id=50256, eos_token_id=50256),
    # the same with MSSA blocks (AoT-MSSA-L)
    "aot-mssa-gpt2": dict(vocab_size=50257, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                          max_position_embeddings=1024, attention="mssa", bos_token_id=50256, eos_token_id=50256),
    # a tiny causal model for the offline corpus of hf_tdiag.text_corpus
    "aot-text-tiny": dict(vocab_size=2048, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                          max_position_embeddings=128, attention="mhsa"),
}  # fmt: skip

_PRETRAINED_KEYWORDS = frozenset(
    {"num_labels", "output_attentions", "attn_implementation", "torch_dtype", "dtype", "problem_type", "is_decoder"}
)

# every Auto class the saved modeling files serve: written into a saved auto_map beside whichever class
# save_pretrained recorded, so each loads with trust_remote_code=True where hf-tdiag is not installed
AUTO_MAP_MODELS = {
    "AutoModel": "modeling_aot.AotModel",
    "AutoModelForImageClassification": "modeling_aot.AotForImageClassification",
}
AUTO_MAP_TEXT_MODELS = {
    "AutoModel": "modeling_aot_text.AotTextModel",
    "AutoModelForCausalLM": "modeling_aot_text.AotForCausalLM",
}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def size_pair(value, name: str = "size") -> tuple[int, int]:
    """``(height, width)`` from an int (a square) or a pair of ints."""
    if _is_int(value):
        return int(value), int(value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_int(v) for v in value):
        return int(value[0]), int(value[1])
    raise ValueError(f"{name}: expected an int or a (height, width) pair of ints, got {value!r}")


def _check_number(owner: str, name: str, value, low: float, high: float = math.inf, open_ends: str = "") -> None:
    """``value`` a finite real in the interval from ``low`` to ``high`` (``open_ends``: "l", "h" or "lh" open)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{owner}: {name} must be a finite number, got {value!r}")
    low_open, high_open = "l" in open_ends, "h" in open_ends or high == math.inf
    if value < low or (low_open and value == low) or value > high or ("h" in open_ends and value == high):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{owner}: {name} must be in {interval}, got {value!r}")


def _check_choice(owner: str, name: str, value, choices) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{owner}: {name} must be one of {list(choices)}, got {value!r}")


def _check_blocks(config, owner: str) -> None:
    """The fields both AoT configs share: sizes, attention operator, step size, norms and dropouts."""
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim"):
        value = getattr(config, name)
        if not _is_int(value) or value <= 0:
            raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")
    _check_choice(owner, "attention", config.attention, AOT_ATTENTIONS)
    _check_choice(owner, "mssa_output", config.mssa_output, AOT_MSSA_OUTPUTS)
    _check_number(owner, "step_size", config.step_size, 0.0, open_ends="l")  # eta > 0: a step
    _check_number(owner, "layer_norm_eps", config.layer_norm_eps, 0.0, open_ends="l")
    _check_number(owner, "initializer_range", config.initializer_range, 0.0)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        _check_number(owner, name, getattr(config, name), 0.0, 1.0, open_ends="h")
    if not isinstance(config.attention_bias, bool):
        raise ValueError(f"{owner}: attention_bias must be True or False, got {config.attention_bias!r}")


def _default_head_dim(config) -> None:
    if config.head_dim is None and _is_int(config.hidden_size) and _is_int(config.num_attention_heads):
        if config.num_attention_heads > 0:
            config.head_dim = config.hidden_size // config.num_attention_heads


def _with_auto_map(out: dict, module: str, models: dict) -> dict:
    """``out`` with every Auto class of ``models`` in its ``auto_map`` once the map names ``module``."""
    auto_map = out.get("auto_map")
    if isinstance(auto_map, dict):
        named = [v for v in auto_map.values() if isinstance(v, str) and f"{module}." in v]
        if named:
            prefix = named[0].split(f"{module}.")[0]  # "" or "<repo>--" for Hub code
            out["auto_map"] = {**auto_map, **{k: prefix + v for k, v in models.items() if k not in auto_map}}
    return out


def _from_preset(cls, presets: dict, name: str, overrides: dict):
    owner = f"{cls.__name__}.from_preset"
    if not isinstance(name, str) or name not in presets:
        raise ValueError(f"{owner}: unknown preset {name!r}; available: {list(presets)}")
    known = {f.name for f in dataclasses.fields(cls)} | _PRETRAINED_KEYWORDS
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"{owner}: unknown keyword(s) {unknown}")
    fields = {**presets[name], **overrides}
    if "head_dim" not in overrides:
        hidden, heads = fields.get("hidden_size"), fields.get("num_attention_heads")
        fields["head_dim"] = hidden // heads if _is_int(hidden) and _is_int(heads) and heads > 0 else None
    return cls(**fields)


class AotConfig(PreTrainedConfig):
    r"""Configuration of an attention-only vision transformer (AoT-MSSA-V): patch embedding and CLS token, then
    ``L`` blocks ``Z^{l+1} = Z^l + eta * MSSA(LN(Z^l))`` (no MLP, no ISTA step), then a LayerNorm + Linear head.

    Attributes:
        image_size (`int` or pair), patch_size (`int` or pair), num_channels (`int`): the input and its patches.
        hidden_size (`int`): token dimension ``d``. num_hidden_layers (`int`): blocks ``L``.
        num_attention_heads (`int`): subspaces / heads ``K``. head_dim (`int`, *optional*): ``p`` (``d // K``).
        attention (`str`): ``"mssa"`` (q = k = v = ``U_k^T z``) or ``"mhsa"`` (separate q, k, v projections).
        mssa_output (`str`): MSSA's output matrix, ``"learned"`` ``W_O`` or ``"subspace"`` ``U = [U_1..U_K]``.
        step_size (`float`): ``eta``, the scale of each block's attention update (1.0).
        attention_bias (`bool`): biases on the q/k/v projections of ``mhsa`` (the output projection always has one).
        pooling (`str`): ``"cls"`` or ``"mean"`` token feeds the head.
        hidden_dropout_prob, attention_probs_dropout_prob (`float`): dropouts. layer_norm_eps (`float`).
        initializer_range (`float`): std of the initializers.

    Examples:
        >>> from hf_tdiag.models.aot import AotConfig, AotForImageClassification
        >>> config = AotConfig.from_preset("aot-digits", num_labels=10)
        >>> model = AotForImageClassification(config)
        >>> config.num_hidden_layers, config.hidden_size, config.attention, model.num_labels
        (6, 64, 'mssa', 10)
    """

    model_type = "aot"

    image_size: int | list[int] | tuple[int, int] = 224
    patch_size: int | list[int] | tuple[int, int] = 16
    num_channels: int = 3
    hidden_size: int = 384
    num_hidden_layers: int = 12
    num_attention_heads: int = 6
    head_dim: int | None = None
    attention: str = "mssa"
    mssa_output: str = "learned"
    step_size: float = 1.0
    attention_bias: bool = False
    pooling: str = "cls"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02

    def __post_init__(self, **kwargs):
        _default_head_dim(self)
        self.validate_architecture()
        super().__post_init__(**kwargs)

    def validate_architecture(self) -> None:
        """Raise a ``ValueError`` naming the first field that cannot build a model."""
        _check_blocks(self, "AotConfig")
        if not _is_int(self.num_channels) or self.num_channels <= 0:
            raise ValueError(f"AotConfig: num_channels must be a positive int, got {self.num_channels!r}")
        _check_choice("AotConfig", "pooling", self.pooling, AOT_POOLINGS)
        image = size_pair(self.image_size, "AotConfig: image_size")
        patch = size_pair(self.patch_size, "AotConfig: patch_size")
        if min(patch) <= 0 or min(image) <= 0:
            raise ValueError(f"AotConfig: image_size and patch_size must be positive, got {image} and {patch}")
        if image[0] % patch[0] or image[1] % patch[1]:
            raise ValueError(f"AotConfig: image_size {image} must be divisible by patch_size {patch}")

    def to_dict(self) -> dict:
        """The config as a dict; an ``auto_map`` that names ``modeling_aot`` lists every AoT vision Auto class."""
        return _with_auto_map(super().to_dict(), "modeling_aot", AUTO_MAP_MODELS)

    @property
    def num_patches(self) -> int:
        """Number of patches at ``image_size`` (tokens without the CLS token)."""
        (ih, iw), (ph, pw) = size_pair(self.image_size), size_pair(self.patch_size)
        return (ih // ph) * (iw // pw)

    @classmethod
    def presets(cls) -> list[str]:
        """Names accepted by :meth:`from_preset`."""
        return list(AOT_PRESETS)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> AotConfig:
        """Config of a named size (``aot-digits``, ``aot-32``, ``aot-tiny|small|base``), with overrides."""
        return _from_preset(cls, AOT_PRESETS, name, overrides)


class AotTextConfig(PreTrainedConfig):
    r"""Configuration of an attention-only causal language model (AoT-MHSA-L, or AoT-MSSA-L with
    ``attention="mssa"``): token and learned position embeddings, ``L`` blocks ``Z^{l+1} = Z^l + eta *
    Attn(LN(Z^l))`` with causal attention, a final LayerNorm and an LM head tied to the token embeddings.

    Attributes:
        vocab_size (`int`), max_position_embeddings (`int`): token ids and positions.
        hidden_size, num_hidden_layers, num_attention_heads, head_dim, attention, mssa_output, step_size,
        attention_bias, hidden_dropout_prob, attention_probs_dropout_prob, layer_norm_eps, initializer_range: as in
        :class:`AotConfig` (``attention`` defaults to ``"mhsa"`` here).
        is_decoder (`bool`): always True (the model is causal). use_cache (`bool`): keep keys and values.

    Examples:
        >>> from hf_tdiag.models.aot import AotTextConfig, AotForCausalLM
        >>> config = AotTextConfig.from_preset("aot-text-tiny", vocab_size=100)
        >>> model = AotForCausalLM(config)
        >>> config.attention, config.num_hidden_layers, model.config.vocab_size
        ('mhsa', 4, 100)
    """

    model_type = "aot_text"

    vocab_size: int = 50257
    max_position_embeddings: int = 1024
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    head_dim: int | None = None
    attention: str = "mhsa"
    mssa_output: str = "learned"
    step_size: float = 1.0
    attention_bias: bool = True
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    is_decoder: bool = True
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        _default_head_dim(self)
        self.validate_architecture()
        super().__post_init__(**kwargs)

    def validate_architecture(self) -> None:
        """Raise a ``ValueError`` naming the first field that cannot build a model."""
        _check_blocks(self, "AotTextConfig")
        for name in ("vocab_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"AotTextConfig: {name} must be a positive int, got {value!r}")
        if self.is_decoder is not True:
            raise ValueError(f"AotTextConfig: the AoT language model is causal; is_decoder must be True, got "
                             f"{self.is_decoder!r}")  # fmt: skip
        if self.pad_token_id is not None and not (_is_int(self.pad_token_id) and 0 <= self.pad_token_id):
            raise ValueError(
                f"AotTextConfig: pad_token_id must be a non-negative int or None, got {self.pad_token_id!r}"
            )

    def to_dict(self) -> dict:
        """The config as a dict; an ``auto_map`` that names ``modeling_aot_text`` lists every AoT text Auto class."""
        return _with_auto_map(super().to_dict(), "modeling_aot_text", AUTO_MAP_TEXT_MODELS)

    @classmethod
    def presets(cls) -> list[str]:
        """Names accepted by :meth:`from_preset`."""
        return list(AOT_TEXT_PRESETS)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> AotTextConfig:
        """Config of a named architecture (``aot-mhsa-gpt2``, ``aot-mssa-gpt2``, ``aot-text-tiny``), with overrides."""
        return _from_preset(cls, AOT_TEXT_PRESETS, name, overrides)


__all__ = ["AotConfig", "AotTextConfig", "AOT_PRESETS", "AOT_TEXT_PRESETS", "AOT_ATTENTIONS", "AOT_MSSA_OUTPUTS"]
