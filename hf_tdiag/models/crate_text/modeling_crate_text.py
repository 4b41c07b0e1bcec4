"""The bare text CRATE model and its task heads: masked LM, causal LM (with generation), sequence/token classification, extractive
question answering and multiple choice.

The heads follow Transformers' BERT/GPT-2 conventions (``labels`` with -100 ignored, ``loss_function`` by class-name
suffix). The LM head is ``decoder(h)`` tied to the token embeddings, or ``decoder(LN(GELU(dense(h))))`` with
``config.lm_head_transform`` (the RoBERTa-shaped head of Transformers PR #27759).

This file imports only torch, transformers and its sibling modules so that ``save_pretrained`` can ship it for
``trust_remote_code`` loading.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import (
    CausalLMOutputWithPast,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import slice_logits_to_keep
from transformers.processing_utils import Unpack
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from .configuration_crate_text import CrateTextConfig
from .modeling_crate_text_blocks import (
    CrateTextEmbeddings,
    CrateTextKwargs,
    CrateTextLayer,
    CrateTextModelOutput,
    CrateTextPooler,
    CrateTextPreTrainedModel,
    pooled_token,
    position_ids_from_mask,
)


class CrateTextModel(CrateTextPreTrainedModel):
    """Bare text CRATE: token states of the last block, the pooled token, and the cache of causal models.

    ``output_hidden_states=True`` returns ``Z^0 ... Z^L``, ``output_mid_hidden_states=True`` the mid states,
    ``output_attentions=True`` the attention probabilities (computed on the eager path for that call).
    """

    def __init__(self, config: CrateTextConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.config = config
        self.embeddings = CrateTextEmbeddings(config)
        self.layer = nn.ModuleList([CrateTextLayer(config, i) for i in range(config.num_hidden_layers)])
        self.final_layernorm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.final_layernorm else None
        )
        self.pooler = CrateTextPooler(config) if add_pooling_layer else None
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def _mask(self, hidden, attention_mask, cache, position_ids, output_attentions=False):
        config = self.config
        if output_attentions and config._attn_implementation not in ("eager", "sdpa"):
            # attention maps come from the eager path, which reads a tensor mask (sdpa's boolean one too), not flex
            # attention's BlockMask: build the mask that path needs for this call
            config = copy.copy(config)
            config._attn_implementation = "eager"
        if config.is_decoder:
            return create_causal_mask(
                config=config,
                inputs_embeds=hidden,
                attention_mask=attention_mask,
                cache=cache,
                position_ids=position_ids,
            )
        return create_bidirectional_mask(config=config, inputs_embeds=hidden, attention_mask=attention_mask)

    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[CrateTextKwargs],
    ) -> CrateTextModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("CrateTextModel.forward: pass exactly one of input_ids or inputs_embeds")
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        if inputs_embeds is None:
            inputs_embeds = self.embeddings.word_embeddings(input_ids)
        if not self.config.is_decoder:
            if cache is not None or use_cache:
                raise ValueError("cache / use_cache need a causal model (config.is_decoder=True)")
        elif use_cache is None:
            use_cache = bool(self.config.use_cache) and not (self.gradient_checkpointing and self.training)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask, past, inputs_embeds.shape[1], inputs_embeds.device)
        hidden = self.embeddings(inputs_embeds, position_ids, token_type_ids)
        mask = self._mask(hidden, attention_mask, cache, position_ids, bool(kwargs.get("output_attentions")))
        for layer in self.layer:
            hidden, _ = layer(hidden, mask, cache, **kwargs)
        if self.final_layernorm is not None:
            hidden = self.final_layernorm(hidden)
        pooled = None
        if self.pooler is not None:
            pooled = self.pooler(pooled_token(hidden, attention_mask, self.config.is_decoder))
        return CrateTextModelOutput(last_hidden_state=hidden, pooler_output=pooled, cache=cache if use_cache else None)


class CrateTextLMHead(nn.Module):
    """Vocabulary logits: ``decoder(h)``, or ``decoder(LN(GELU(dense(h))))`` with ``lm_head_transform``."""

    def __init__(self, config: CrateTextConfig):
        super().__init__()
        if config.lm_head_transform:
            self.dense = nn.Linear(config.hidden_size, config.hidden_size)
            self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.head_layer_norm_eps)
        else:
            self.dense = self.layer_norm = None
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.lm_head_bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.dense is not None:
            hidden = self.layer_norm(F.gelu(self.dense(hidden)))
        return self.decoder(hidden)


_TIED = {"lm_head.decoder.weight": "crate.embeddings.word_embeddings.weight"}


def _base_call(model, **kwargs: Unpack[CrateTextKwargs]) -> CrateTextModelOutput:
    return model.crate(**{k: v for k, v in kwargs.items() if v is not None or k in ("input_ids", "inputs_embeds")})


def _uncached(model, kwargs: dict) -> dict:
    """``kwargs`` for a head that returns no cache: a caller's ``use_cache`` (a Trainer's, a pipeline's) is replaced by
    no cache at all (``False`` for a causal base model, nothing for an encoder)."""
    kwargs.pop("use_cache", None)
    return {"use_cache": False if model.config.is_decoder else None, **kwargs}


class CrateTextForMaskedLM(CrateTextPreTrainedModel):
    """Bidirectional CRATE with the LM head; ``labels`` of masked positions (others -100) give the MLM loss."""

    _tied_weights_keys = _TIED

    def __init__(self, config: CrateTextConfig):
        super().__init__(config)
        if config.is_decoder:
            raise ValueError("CrateTextForMaskedLM needs bidirectional attention: set config.is_decoder=False")
        self.crate = CrateTextModel(config, add_pooling_layer=False)
        self.lm_head = CrateTextLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, value):
        self.lm_head.decoder = value

    @can_return_tuple
    def forward(
        self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
        labels=None, **kwargs: Unpack[CrateTextKwargs],
    ) -> MaskedLMOutput:  # fmt: skip
        out = _base_call(
            self, input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            position_ids=position_ids, inputs_embeds=inputs_embeds, **kwargs,
        )  # fmt: skip
        logits = self.lm_head(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)


class CrateTextForCausalLM(CrateTextPreTrainedModel, GenerationMixin):
    """Causal CRATE language model (CRATE-LM / CRATE-GPT) with a KV cache; ``generate`` supports every strategy."""

    _tied_weights_keys = _TIED

    def __init__(self, config: CrateTextConfig):
        super().__init__(config)
        if not config.is_decoder:
            raise ValueError("CrateTextForCausalLM needs causal attention: set config.is_decoder=True")
        self.crate = CrateTextModel(config, add_pooling_layer=False)
        self.lm_head = CrateTextLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, value):
        self.lm_head.decoder = value

    def _validate_generated_length(self, generation_config, input_ids_length, has_default_max_length):
        """Before generating: the prompt plus the tokens to generate fit the learned positions (the last token
        generated is never fed back, so ``max_length`` may be one more than the positions); else a ValueError naming
        the prompt length, ``max_new_tokens`` (or ``max_length``) and the largest value that fits."""
        super()._validate_generated_length(generation_config, input_ids_length, has_default_max_length)
        positions = self.config.max_position_embeddings - self.config.position_offset
        total = generation_config.max_length
        if total is None or total <= positions + 1:
            return
        room = positions + 1 - input_ids_length
        new = generation_config.max_new_tokens
        asked = (
            f"max_new_tokens={new}" if new is not None else f"max_length={total} (up to {total - input_ids_length} new)"
        )
        raise ValueError(
            f"generate: a prompt of {input_ids_length} tokens with {asked} would run past the model's "
            f"{positions} positions (max_position_embeddings={self.config.max_position_embeddings}); pass "
            + (
                f"max_new_tokens <= {room} or a shorter prompt"
                if room > 0
                else f"a prompt of at most {positions} tokens"
            )
        )

    @can_return_tuple
    def forward(
        self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
        cache=None, use_cache=None, labels=None, logits_to_keep: int | torch.Tensor = 0, **kwargs: Unpack[CrateTextKwargs],
    ) -> CausalLMOutputWithPast:  # fmt: skip
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        out = _base_call(
            self, input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            position_ids=position_ids, inputs_embeds=inputs_embeds, cache=cache, use_cache=use_cache, **kwargs,
        )  # fmt: skip
        logits = self.lm_head(slice_logits_to_keep(out.last_hidden_state, logits_to_keep))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, cache=out.cache, hidden_states=out.hidden_states, attentions=out.attentions
        )


class CrateTextClassificationHead(nn.Module):
    """``out_proj(dropout(tanh(dense(dropout(h_pooled)))))`` on one token per sequence (PR #27759's head)."""

    def __init__(self, config: CrateTextConfig):
        super().__init__()
        drop = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(drop)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, token: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.dropout(torch.tanh(self.dense(self.dropout(token)))))


class CrateTextForSequenceClassification(CrateTextPreTrainedModel):
    """Sequence classification/regression on the first token (encoders) or the last attended token (decoders)."""

    def __init__(self, config: CrateTextConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.crate = CrateTextModel(config, add_pooling_layer=False)
        self.classifier = CrateTextClassificationHead(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
        labels=None, **kwargs: Unpack[CrateTextKwargs],
    ) -> SequenceClassifierOutput:  # fmt: skip
        out = _base_call(
            self, input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            position_ids=position_ids, inputs_embeds=inputs_embeds, **_uncached(self, kwargs),
        )  # fmt: skip
        token = pooled_token(out.last_hidden_state, attention_mask, self.config.is_decoder)
        logits = self.classifier(token)
        loss = self.loss_function(labels, logits, self.config, **kwargs) if labels is not None else None
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class CrateTextForTokenClassification(CrateTextPreTrainedModel):
    """Per-token labels (e.g. NER): dropout + linear on every token state."""

    def __init__(self, config: CrateTextConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.crate = CrateTextModel(config, add_pooling_layer=False)
        drop = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(drop)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
        labels=None, **kwargs: Unpack[CrateTextKwargs],
    ) -> TokenClassifierOutput:  # fmt: skip
        out = _base_call(
            self, input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            position_ids=position_ids, inputs_embeds=inputs_embeds, **_uncached(self, kwargs),
        )  # fmt: skip
        logits = self.classifier(self.dropout(out.last_hidden_state))
        loss = self.loss_function(logits, labels, self.config, **kwargs) if labels is not None else None
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class CrateTextForQuestionAnswering(CrateTextPreTrainedModel):
    """Extractive QA: start/end logits from a linear map of each token state (``num_labels`` must be 2)."""

    def __init__(self, config: CrateTextConfig):
        super().__init__(config)
        if config.num_labels != 2:
            raise ValueError(f"CrateTextForQuestionAnswering needs num_labels=2 (start, end), got {config.num_labels}")
        self.crate = CrateTextModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
        start_positions=None, end_positions=None, **kwargs: Unpack[CrateTextKwargs],
    ) -> QuestionAnsweringModelOutput:  # fmt: skip
        out = _base_call(
            self, input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            position_ids=position_ids, inputs_embeds=inputs_embeds, **_uncached(self, kwargs),
        )  # fmt: skip
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).unbind(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions, **kwargs)
        return QuestionAnsweringModelOutput(
            loss=loss, start_logits=start_logits, end_logits=end_logits, hidden_states=out.hidden_states,
            attentions=out.attentions,
        )  # fmt: skip


class CrateTextForMultipleChoice(CrateTextPreTrainedModel):
    """Multiple choice: inputs ``(B, C, N)``; the pooled token of each choice scored by one linear unit."""

    def __init__(self, config: CrateTextConfig):
        super().__init__(config)
        self.crate = CrateTextModel(config, add_pooling_layer=True)
        drop = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(drop)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    @can_return_tuple
    def forward(
        self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
        labels=None, **kwargs: Unpack[CrateTextKwargs],
    ) -> MultipleChoiceModelOutput:  # fmt: skip
        reference = input_ids if input_ids is not None else inputs_embeds
        if reference is None or reference.ndim < 3:
            raise ValueError("CrateTextForMultipleChoice: input_ids must have shape (batch, num_choices, seq_len)")
        choices = reference.shape[1]

        def flat(t, keep=1):
            return None if t is None else t.reshape(-1, *t.shape[2:]) if t.ndim > keep + 1 else t

        out = _base_call(
            self, input_ids=flat(input_ids), attention_mask=flat(attention_mask), token_type_ids=flat(token_type_ids),
            position_ids=flat(position_ids), inputs_embeds=flat(inputs_embeds, keep=2),
            **_uncached(self, kwargs),
        )  # fmt: skip
        logits = self.classifier(self.dropout(out.pooler_output)).view(-1, choices)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


__all__ = [
    "CrateTextModel",
    "CrateTextLMHead",
    "CrateTextForMaskedLM",
    "CrateTextForCausalLM",
    "CrateTextForSequenceClassification",
    "CrateTextForTokenClassification",
    "CrateTextForQuestionAnswering",
    "CrateTextForMultipleChoice",
]
