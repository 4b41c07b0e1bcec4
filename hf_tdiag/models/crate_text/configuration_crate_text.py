"""Configuration of the text CRATE models (masked and causal language models and their task heads).

Why a model type of its own (``crate_text``) and not a ``modality`` field on the vision ``crate`` config: a text
model needs a vocabulary, learned positions indexed by token position (with an optional RoBERTa-style offset), token
types and special-token ids; it has no patches, channels or image size. A shared config would carry a half of fields
that mean nothing for each modality and its validation would branch on the modality everywhere. The two types share
the block equations (MSSA with one tied ``U`` for query, key and value, then ISTA) and the field names for them
(``num_attention_heads``, ``head_dim``, ``ista_step_size``, ``ista_lambda``), so a diagnostic written for one reads the
other.

``block`` selects the sparse-coding step as the authors wrote it:

* ``"crate"``: one ISTA step on a square dictionary started at the input (the CRATE paper, the Transformers PR
  #27759 encoder and ``crate.py`` of CRATE-LM): ``z = ReLU(x + eta D^T (x - D x) - eta lambda)``, ``z`` in ``R^d``.
* ``"crate-lm"``: the overcomplete block of CRATE-LM (Bai & Ma 2024, ``crate_overcomplete.py``): a dictionary
  ``D`` of ``ista_dictionary_size`` atoms (``4 d`` there), two ISTA steps started at zero and the decoded code:
  ``z0 = ReLU(eta D^T x - eta lambda)``, ``z1 = ReLU(z0 + eta D^T (x - D z0) - eta lambda)``, output ``D z1``.

This file imports only ``transformers`` so that ``save_pretrained`` can copy it next to the weights for
``trust_remote_code`` loading.
"""

from __future__ import annotations

import dataclasses
import math

from transformers import PreTrainedConfig

CRATE_TEXT_BLOCKS = ("crate", "crate-lm")

# name -> fields. crate-lm-12l: CRATE-LM's pre-trained 12-layer model (GPT-2 vocabulary padded to 50304, 1024
# positions); crate-gpt-12l: the square-ISTA causal model of CRATE-LM's crate.py (no final LayerNorm); crate-bert-base:
# the RoBERTa-shaped encoder of Transformers PR #27759 (its CrateConfig defaults).
CRATE_TEXT_PRESETS: dict[str, dict] = {
    "crate-lm-12l": dict(
        vocab_size=50304,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        max_position_embeddings=1024,
        block="crate-lm",
        ista_dictionary_size=4 * 768,
        attention_bias=True,
        final_layernorm=True,
        is_decoder=True,
    ),
    "crate-gpt-12l": dict(
        vocab_size=50304,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        max_position_embeddings=1024,
        block="crate",
        attention_bias=True,
        final_layernorm=False,
        is_decoder=True,
    ),
    "crate-bert-base": dict(
        vocab_size=50265,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        max_position_embeddings=512,
        position_offset=2,
        type_vocab_size=2,
        block="crate",
        attention_bias=False,
        final_layernorm=False,
        embedding_layernorm=True,
        lm_head_transform=True,
        lm_head_bias=True,
        head_layer_norm_eps=1e-12,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    ),
}

_PRETRAINED_KEYWORDS = frozenset(
    {"num_labels", "output_attentions", "attn_implementation", "torch_dtype", "dtype", "problem_type"}
)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_number(name: str, value, low: float, high: float = math.inf, low_open: bool = False, high_open=False):
    """``value`` a finite real in (``low``, ``high``) with the given open/closed ends, else a one-line ValueError."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"CrateTextConfig: {name} must be a finite number, got {value!r}")
    if value < low or (low_open and value == low) or value > high or (high_open and value == high):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open or high == math.inf else ']'}"
        raise ValueError(f"CrateTextConfig: {name} must be in {interval}, got {value!r}")


class CrateTextConfig(PreTrainedConfig):
    r"""Configuration of a text CRATE model (``CrateTextFor{MaskedLM,CausalLM,SequenceClassification,...}``).

    Attributes:
        vocab_size (`int`): number of token ids.
        hidden_size (`int`): token dimension ``d``.
        num_hidden_layers (`int`): number of CRATE blocks ``L``.
        num_attention_heads (`int`): number of subspaces ``K``.
        head_dim (`int`, *optional*): subspace dimension ``p`` (``hidden_size // num_attention_heads``).
        max_position_embeddings (`int`): rows of the learned position table.
        position_offset (`int`): row of position 0 (2 for RoBERTa-shaped checkpoints, whose rows 0..pad are unused).
        type_vocab_size (`int`): token-type (segment) embeddings; 0 for none.
        block (`str`): ``"crate"`` (square one-step ISTA) or ``"crate-lm"`` (overcomplete two-step ISTA, decoded).
        ista_dictionary_size (`int`, *optional*): atoms of the ISTA dictionary; ``hidden_size`` for ``"crate"``,
            ``4 * hidden_size`` by default for ``"crate-lm"``.
        ista_step_size (`float`): ISTA step ``eta`` (0.1). ista_lambda (`float`): sparsity weight ``lambda`` (0.1).
        attention_bias (`bool`): bias on the MSSA output projection (CRATE-LM: yes; PR #27759: no).
        embedding_layernorm (`bool`): LayerNorm on the embedding sum (PR #27759). final_layernorm (`bool`): LayerNorm
            after the last block (CRATE-LM overcomplete).
        lm_head_transform (`bool`): RoBERTa-style dense-GELU-LayerNorm before the vocabulary projection (PR #27759).
        lm_head_bias (`bool`): bias on the vocabulary projection.
        is_decoder (`bool`): causal attention (required by ``CrateTextForCausalLM``); bidirectional otherwise.
        layer_norm_eps (`float`): epsilon of the block LayerNorms; head_layer_norm_eps (`float`, *optional*): of the
            embedding and LM-head LayerNorms (1e-12 in PR #27759), defaults to ``layer_norm_eps``.
        hidden_dropout_prob, attention_probs_dropout_prob, classifier_dropout (`float`): dropout probabilities.
        initializer_range (`float`): std of the normal initializers.

    Examples:
        >>> from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM
        >>> config = CrateTextConfig.from_preset("crate-lm-12l", num_hidden_layers=2, hidden_size=64,
        ...     num_attention_heads=4, ista_dictionary_size=256, vocab_size=1000, max_position_embeddings=128)
        >>> model = CrateTextForCausalLM(config)
        >>> config.num_hidden_layers, config.hidden_size, model.config.vocab_size
        (2, 64, 1000)
    """

    model_type = "crate_text"

    vocab_size: int = 50304
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    head_dim: int | None = None
    max_position_embeddings: int = 1024
    position_offset: int = 0
    type_vocab_size: int = 0
    block: str = "crate-lm"
    ista_dictionary_size: int | None = None
    ista_step_size: float = 0.1
    ista_lambda: float = 0.1
    attention_bias: bool = True
    embedding_layernorm: bool = False
    final_layernorm: bool = True
    lm_head_transform: bool = False
    lm_head_bias: bool = False
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    classifier_dropout: float | None = None
    layer_norm_eps: float = 1e-5
    head_layer_norm_eps: float | None = None
    initializer_range: float = 0.02
    is_decoder: bool = False
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        ints = _is_int(self.hidden_size) and _is_int(self.num_attention_heads) and self.num_attention_heads > 0
        if self.head_dim is None and ints:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.ista_dictionary_size is None and _is_int(self.hidden_size):
            self.ista_dictionary_size = self.hidden_size * (4 if self.block == "crate-lm" else 1)
        if self.head_layer_norm_eps is None:
            self.head_layer_norm_eps = self.layer_norm_eps
        self._validate_crate_text()
        super().__post_init__(**kwargs)

    def _validate_crate_text(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"CrateTextConfig: {name} must be a positive int, got {value!r}")
        for name in ("max_position_embeddings", "ista_dictionary_size"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"CrateTextConfig: {name} must be a positive int, got {value!r}")
        for name in ("position_offset", "type_vocab_size"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ValueError(f"CrateTextConfig: {name} must be a non-negative int, got {value!r}")
        if self.position_offset >= self.max_position_embeddings:
            raise ValueError(
                f"CrateTextConfig: position_offset ({self.position_offset}) must be below max_position_embeddings "
                f"({self.max_position_embeddings})"
            )
        if not isinstance(self.block, str) or self.block not in CRATE_TEXT_BLOCKS:
            raise ValueError(f"CrateTextConfig: block must be one of {list(CRATE_TEXT_BLOCKS)}, got {self.block!r}")
        if self.block == "crate" and self.ista_dictionary_size != self.hidden_size:
            raise ValueError(
                f"CrateTextConfig: block 'crate' has a square dictionary, so ista_dictionary_size must equal "
                f"hidden_size ({self.hidden_size}), got {self.ista_dictionary_size}; use block='crate-lm' for an "
                "overcomplete one"
            )
        _check_number("ista_step_size", self.ista_step_size, 0.0, low_open=True)
        _check_number("ista_lambda", self.ista_lambda, 0.0)
        _check_number("layer_norm_eps", self.layer_norm_eps, 0.0, low_open=True)
        _check_number("head_layer_norm_eps", self.head_layer_norm_eps, 0.0, low_open=True)
        _check_number("initializer_range", self.initializer_range, 0.0)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            _check_number(name, getattr(self, name), 0.0, 1.0, high_open=True)
        if self.classifier_dropout is not None:
            _check_number("classifier_dropout", self.classifier_dropout, 0.0, 1.0, high_open=True)
        for name in ("attention_bias", "embedding_layernorm", "final_layernorm", "lm_head_transform", "lm_head_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"CrateTextConfig: {name} must be True or False, got {getattr(self, name)!r}")
        if self.pad_token_id is not None and not (_is_int(self.pad_token_id) and 0 <= self.pad_token_id):
            raise ValueError(
                f"CrateTextConfig: pad_token_id must be a non-negative int or None, got {self.pad_token_id!r}"
            )

    @classmethod
    def presets(cls) -> list[str]:
        """Names accepted by :meth:`from_preset`."""
        return list(CRATE_TEXT_PRESETS)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> CrateTextConfig:
        """Config of a named architecture (``crate-lm-12l``, ``crate-gpt-12l``, ``crate-bert-base``), with overrides."""
        if not isinstance(name, str) or name not in CRATE_TEXT_PRESETS:
            raise ValueError(
                f"CrateTextConfig.from_preset: unknown preset {name!r}; available: {list(CRATE_TEXT_PRESETS)}"
            )
        known = {f.name for f in dataclasses.fields(cls)} | _PRETRAINED_KEYWORDS
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"CrateTextConfig.from_preset: unknown keyword(s) {unknown}")
        fields = dict(CRATE_TEXT_PRESETS[name])
        fields.update(overrides)
        hidden = fields.get("hidden_size")
        if "head_dim" not in overrides and _is_int(hidden) and _is_int(fields.get("num_attention_heads")):
            fields["head_dim"] = hidden // fields["num_attention_heads"] if fields["num_attention_heads"] > 0 else None
        if "ista_dictionary_size" not in overrides and _is_int(hidden):
            fields["ista_dictionary_size"] = hidden * (4 if fields.get("block") == "crate-lm" else 1)
        return cls(**fields)


__all__ = ["CrateTextConfig", "CRATE_TEXT_PRESETS", "CRATE_TEXT_BLOCKS"]
