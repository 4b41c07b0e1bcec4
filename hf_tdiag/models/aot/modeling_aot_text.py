"""The attention-only transformer as a causal language model (AoT-MHSA-L, or AoT-MSSA-L with ``attention="mssa"``).

Token and learned position embeddings ``Z^0``, then ``L`` blocks ``Z^{l+1} = Z^l + eta * Attn(LN(Z^l))`` with causal
attention (:class:`.modeling_aot.AotLayer`), a final LayerNorm, and logits ``W_E LN(Z^L)`` with the LM head tied to
the token embeddings (GPT-2's layout without the MLPs). Past keys and values live in a transformers
:class:`~transformers.Cache`, so ``generate`` runs every strategy, with the dynamic or the static cache.

This file imports only torch, transformers and its sibling modules so that ``save_pretrained`` can ship it for
``trust_remote_code`` loading.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_utils import PreTrainedModel, slice_logits_to_keep
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_aot import AotTextConfig
from .modeling_aot import AotAttention, AotLayer, HubCardMixin, init_depth_scaled


@dataclass
class AotTextModelOutput(ModelOutput):
    """Output of :class:`AotTextModel`.

    Args:
        last_hidden_state: ``(B, N, d)`` ``LN(Z^L)``, the last block's output after the final LayerNorm.
        cache: the :class:`~transformers.Cache` of keys and values (with ``use_cache``).
        hidden_states: ``L+1`` tensors: the embeddings ``Z^0``, then each block output ``Z^l`` (before the final norm).
        attentions: ``L`` tensors ``(B, K, N, N_past+N)`` of attention probabilities (eager path only).
    """

    last_hidden_state: torch.Tensor | None = None
    cache: Cache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def position_ids_from_mask(attention_mask, past, length: int, device) -> torch.Tensor:
    """0-based positions counting only attended tokens (``cumsum(mask) - 1``, padding ``-1``); ``(B|1, N)``. A 2-D
    mask covers the past and the new tokens: the new ones are its last ``length`` columns."""
    if attention_mask is None or attention_mask.ndim != 2:
        return (torch.arange(length, device=device) + past).unsqueeze(0)
    mask = attention_mask.long()
    return (mask.cumsum(-1) * mask - 1)[:, -length:]


class AotTextEmbeddings(nn.Module):
    """Token + learned position embeddings, dropout."""

    def __init__(self, config: AotTextConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.max_positions = config.max_position_embeddings

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        if inputs_embeds.shape[1] > self.max_positions:  # a shape: checked when compiled too
            raise ValueError(
                f"input of {inputs_embeds.shape[1]} tokens is longer than max_position_embeddings={self.max_positions}"
                "; pass shorter sequences"
            )
        rows = position_ids.clamp(min=0)  # padding (-1) -> row 0 (its state is masked out)
        if not torch.compiler.is_compiling() and int(rows.max()) >= self.max_positions:
            raise ValueError(
                f"input is longer than max_position_embeddings={self.max_positions} (position {int(rows.max())})"
                "; pass shorter sequences"
            )
        return self.dropout(inputs_embeds + self.position_embeddings(rows))


class AotTextPreTrainedModel(HubCardMixin, PreTrainedModel):
    config: AotTextConfig
    config_class = AotTextConfig
    base_model_prefix = "aot"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["AotTextEmbeddings", "AotLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    _can_record_outputs = {"hidden_states": AotLayer, "attentions": OutputRecorder(AotAttention, index=1)}

    def _init_weights(self, module):
        """Transformers' Normal(0, initializer_range) Linear/Embedding, unit LayerNorm; depth-scaled output projections."""
        super()._init_weights(module)
        init_depth_scaled(self.config, module)


class AotTextModel(AotTextPreTrainedModel):
    """Bare causal AoT: ``LN(Z^L)`` and the cache. ``output_hidden_states=True`` returns ``Z^0 ... Z^L``,
    ``output_attentions=True`` the attention probabilities (computed on the eager path for that call)."""

    def __init__(self, config: AotTextConfig):
        super().__init__(config)
        self.config = config
        self.embeddings = AotTextEmbeddings(config)
        self.layer = nn.ModuleList([AotLayer(config, i, is_causal=True) for i in range(config.num_hidden_layers)])
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def _mask(self, hidden, attention_mask, cache, position_ids, output_attentions=False):
        config = self.config
        if output_attentions and config._attn_implementation not in ("eager", "sdpa"):
            # attention maps come from the eager path, which reads a tensor mask, not flex attention's BlockMask
            config = copy.copy(config)
            config._attn_implementation = "eager"
        return create_causal_mask(
            config=config, inputs_embeds=hidden, attention_mask=attention_mask, cache=cache, position_ids=position_ids
        )

    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> AotTextModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("AotTextModel.forward: pass exactly one of input_ids or inputs_embeds")
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        if inputs_embeds is None:
            inputs_embeds = self.embeddings.word_embeddings(input_ids)
        if use_cache is None:
            use_cache = bool(self.config.use_cache) and not (self.gradient_checkpointing and self.training)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask, past, inputs_embeds.shape[1], inputs_embeds.device)
        hidden = self.embeddings(inputs_embeds, position_ids)
        mask = self._mask(hidden, attention_mask, cache, position_ids, bool(kwargs.get("output_attentions")))
        for layer in self.layer:
            hidden = layer(hidden, mask, cache, **kwargs)
        return AotTextModelOutput(last_hidden_state=self.final_layernorm(hidden), cache=cache if use_cache else None)


class AotForCausalLM(AotTextPreTrainedModel, GenerationMixin):
    """Causal AoT language model with a KV cache; logits ``W_E LN(Z^L)`` (head tied to the token embeddings)."""

    _tied_weights_keys = {"lm_head.weight": "aot.embeddings.word_embeddings.weight"}

    def __init__(self, config: AotTextConfig):
        super().__init__(config)
        self.aot = AotTextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    @can_return_tuple
    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, cache=None, use_cache=None,
        labels=None, logits_to_keep: int | torch.Tensor = 0, **kwargs: Unpack[TransformersKwargs],
    ) -> CausalLMOutputWithPast:  # fmt: skip
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        out = self.aot(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, inputs_embeds=inputs_embeds,
            cache=cache, use_cache=use_cache, **kwargs,
        )  # fmt: skip
        logits = self.lm_head(slice_logits_to_keep(out.last_hidden_state, logits_to_keep))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, cache=out.cache, hidden_states=out.hidden_states, attentions=out.attentions
        )


__all__ = ["AotTextModelOutput", "AotTextPreTrainedModel", "AotTextModel", "AotForCausalLM"]
