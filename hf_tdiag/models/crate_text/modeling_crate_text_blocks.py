"""Text CRATE (Coding RAte reduction TransformEr) building blocks: embeddings, MSSA, the two ISTA blocks, the layer.

One block maps token states ``Z`` to ``Z+``::

    Z_half = Z + MSSA(LN1(Z))            # q = k = v = U_k^T z per head, causal when config.is_decoder
    Z_plus = ISTA(LN2(Z_half))           # no residual around ISTA (as in every CRATE code)

``ISTA`` is the square one-step sparse code of the CRATE paper (``block="crate"``) or the overcomplete, decoded
two-step block of CRATE-LM (``block="crate-lm"``); see :mod:`.configuration_crate_text`. Causal models keep the
tied ``w = U^T z`` of past tokens in a transformers :class:`~transformers.Cache` (as key and as value).

This file imports only torch, transformers and its sibling configuration so that ``save_pretrained`` can ship it for
``trust_remote_code`` loading.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs
from transformers.utils.output_capturing import OutputRecorder

from .configuration_crate_text import CrateTextConfig


class CrateTextKwargs(TransformersKwargs, total=False):
    """The keyword arguments of the forward passes: Transformers' own, and the family's recorded outputs.

    Attributes:
        output_mid_hidden_states: each block's mid state ``Z^{l-1/2}`` (after attention, before the sparse-coding step).
    """

    output_mid_hidden_states: bool | None


@dataclass
class CrateTextModelOutput(ModelOutput):
    """Output of :class:`CrateTextModel`.

    Args:
        last_hidden_state: ``(B, N, d)`` output of the last block (after the final LayerNorm where configured).
        pooler_output: ``(B, d)`` pooled token (first token for encoders, last non-padding token for decoders) after
            the dense-tanh pooler, when the model has one.
        cache: the :class:`~transformers.Cache` of the tied projections ``w`` (causal models with ``use_cache``).
        hidden_states: ``L+1`` tensors: the embeddings ``Z^0``, then each block output ``Z^l`` (before a final norm).
        mid_hidden_states: ``L`` tensors ``Z^{l-1/2} = Z^{l-1} + MSSA(LN1(Z^{l-1}))``.
        attentions: ``L`` tensors ``(B, K, N, N_past+N)`` of attention probabilities (eager path only).
    """

    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    cache: Cache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    mid_hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def position_ids_from_mask(
    attention_mask: torch.Tensor | None, past: int | torch.Tensor, length: int, device
) -> torch.Tensor:
    """0-based positions counting only attended tokens (``cumsum(mask) - 1``); padding gets ``-1``; ``(B|1, N)``.

    ``past`` (the cached length) may be a 0-d tensor (a static cache's counter); the positions are then built by
    adding it, so that a compiled graph does not depend on its value. A 2-D mask covers the past and the new tokens:
    the new ones are its last ``length`` columns."""
    if attention_mask is None or attention_mask.ndim != 2:
        return (torch.arange(length, device=device) + past).unsqueeze(0)
    mask = attention_mask.long()
    positions = mask.cumsum(-1) * mask - 1
    return positions[:, -length:]


class CrateTextEmbeddings(nn.Module):
    """Token + learned position (+ token type) embeddings, optional LayerNorm, dropout."""

    def __init__(self, config: CrateTextConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, config.hidden_size) if config.type_vocab_size > 0 else None
        )
        self.layernorm = (
            nn.LayerNorm(config.hidden_size, eps=config.head_layer_norm_eps) if config.embedding_layernorm else None
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.position_offset = config.position_offset
        self.max_positions = config.max_position_embeddings

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, token_type_ids=None) -> torch.Tensor:
        if inputs_embeds.shape[1] + self.position_offset > self.max_positions:  # a shape: checked when compiled too
            raise ValueError(
                f"input of {inputs_embeds.shape[1]} tokens is longer than the {self.max_positions - self.position_offset}"
                f" positions of max_position_embeddings={self.max_positions} (position_offset={self.position_offset})"
                "; pass shorter sequences"
            )
        rows = (position_ids + self.position_offset).clamp(min=0)  # padding (-1) -> the row before position 0
        # the position values (a cache's length, given position_ids) are data: checked in eager mode only, where a
        # compiled graph or an exported program would have to guard on them
        if not torch.compiler.is_compiling() and int(rows.max()) >= self.max_positions:
            raise ValueError(
                f"input is longer than max_position_embeddings={self.max_positions} (position row {int(rows.max())})"
                "; pass shorter sequences"
            )
        hidden = inputs_embeds + self.position_embeddings(rows)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros(inputs_embeds.shape[:2], dtype=torch.long, device=inputs_embeds.device)
            hidden = hidden + self.token_type_embeddings(token_type_ids)
        elif token_type_ids is not None and not torch.compiler.is_compiling() and bool((token_type_ids != 0).any()):
            raise ValueError("token_type_ids were given but the model has type_vocab_size=0")
        if self.layernorm is not None:
            hidden = self.layernorm(hidden)
        return self.dropout(hidden)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[CrateTextKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q k^T * scaling + mask) v`` in plain torch; returns ``(B, N, K, p)`` and the ``(B, K, N, M)`` probabilities."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : key.shape[-2]]
        if mask.dtype == torch.bool:  # an SDPA-style mask (True = attend), when output_attentions forces eager
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    dropped = F.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(dropped, value).transpose(1, 2).contiguous(), probs


class CrateTextMSSA(nn.Module):
    """Multi-head subspace self-attention: ``softmax((U_k^T Z)^T (U_k^T Z)/sqrt(p)) U_k^T Z`` mixed by ``out_proj``."""

    def __init__(self, config: CrateTextConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        self.is_causal = bool(config.is_decoder)
        inner = self.num_heads * self.head_dim
        self.qkv = nn.Linear(config.hidden_size, inner, bias=False)
        self.out_proj = nn.Linear(inner, config.hidden_size, bias=config.attention_bias)
        self.out_proj.depth_scaled = True  # initialised at initializer_range / sqrt(2 L) (_init_weights)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, hidden_states, attention_mask=None, cache: Cache | None = None, **kwargs: Unpack[CrateTextKwargs]
    ):
        batch, tokens, _ = hidden_states.shape
        w = self.qkv(hidden_states).view(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)
        keys = values = w
        if cache is not None:
            keys, values = cache.update(w, w, self.layer_idx)
        implementation = self.config._attn_implementation
        if kwargs.get("output_attentions"):
            implementation = "eager"  # attention maps exist only on the eager path
        interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        if implementation == "eager" and attention_mask is None and self.is_causal and tokens > 1:
            past = keys.shape[-2] - tokens
            blocked = torch.ones(tokens, keys.shape[-2], dtype=torch.bool, device=w.device).triu(past + 1)
            attention_mask = torch.zeros(blocked.shape, dtype=w.dtype, device=w.device).masked_fill(
                blocked, torch.finfo(w.dtype).min
            )[None, None]
        heads, probs = interface(
            self,
            w,
            keys,
            values,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
        )
        out = self.dropout(self.out_proj(heads.reshape(batch, tokens, self.num_heads * self.head_dim)))
        return out, probs


class CrateTextISTA(nn.Module):
    """One ISTA step on a square dictionary ``D`` started at ``z = x``: ``ReLU(x + eta D^T (x - D x) - eta lambda)``."""

    def __init__(self, config: CrateTextConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.hidden_size, config.hidden_size))
        self.step_size = float(config.ista_step_size)
        self.lambd = float(config.ista_lambda)

    def sparse_code(self, x: torch.Tensor) -> torch.Tensor:
        """The code ``z`` (here also the block output); row form ``x + eta (x - x D^T) D - eta lambda`` of CRATE's code."""
        residual = x - F.linear(x, self.weight)
        return F.relu(x + self.step_size * (residual @ self.weight) - self.step_size * self.lambd)

    def decode(self, code: torch.Tensor) -> torch.Tensor:
        return code

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sparse_code(x)


class CrateTextOvercompleteISTA(nn.Module):
    """CRATE-LM's block: ``weight = D^T`` (``m x d``); two ISTA steps from zero, then the reconstruction ``D z1``."""

    def __init__(self, config: CrateTextConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.ista_dictionary_size, config.hidden_size))
        self.step_size = float(config.ista_step_size)
        self.lambd = float(config.ista_lambda)

    def codes(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both iterates ``(z0, z1)``: ``z0 = ReLU(eta D^T x - eta lambda)``, ``z1 = ReLU(z0 + eta D^T (x - D z0) - eta lambda)``."""
        eta, shift = self.step_size, self.step_size * self.lambd
        correlation = F.linear(x, self.weight)  # D^T x
        z0 = F.relu(eta * correlation - shift)
        residual = x - z0 @ self.weight  # x - D z0
        return z0, F.relu(z0 + eta * F.linear(residual, self.weight) - shift)

    def sparse_code(self, x: torch.Tensor) -> torch.Tensor:
        """The second iterate ``z1`` of :meth:`codes`."""
        return self.codes(x)[1]

    def decode(self, code: torch.Tensor) -> torch.Tensor:
        return code @ self.weight  # D z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.sparse_code(x))


class CrateTextLayer(GradientCheckpointingLayer):
    """``Z_half = Z + MSSA(LN1(Z))``, ``Z_plus = ISTA(LN2(Z_half))``; returns ``(Z_plus, Z_half)``."""

    def __init__(self, config: CrateTextConfig, layer_idx: int):
        super().__init__()
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = CrateTextMSSA(config, layer_idx)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ista = CrateTextOvercompleteISTA(config) if config.block == "crate-lm" else CrateTextISTA(config)

    def forward(self, hidden_states, attention_mask=None, cache=None, **kwargs: Unpack[CrateTextKwargs]):
        attn_out, _ = self.attention(self.layernorm_before(hidden_states), attention_mask, cache, **kwargs)
        mid = hidden_states + attn_out
        return self.ista(self.layernorm_after(mid)), mid


class CrateTextPooler(nn.Module):
    """Dense + tanh on one token per sequence (the first for encoders, the last attended one for decoders)."""

    def __init__(self, config: CrateTextConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, token: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(token))


def pooled_token(hidden: torch.Tensor, attention_mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """``(B, d)``: the first token (encoders) or the last attended token of each row (decoders)."""
    if not causal:
        return hidden[:, 0]
    if attention_mask is None or attention_mask.ndim != 2:
        return hidden[:, -1]
    length = hidden.shape[1]
    mask = attention_mask[:, -length:].long()
    last = (mask * torch.arange(length, device=hidden.device)).argmax(-1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


try:  # hf-tdiag's model card on save_pretrained / push_to_hub (hf_tdiag/_hub_card.py), in the package only
    if not __name__.startswith("hf_tdiag."):
        raise ImportError(f"{__name__} is a copy loaded as remote code")
    from hf_tdiag._hub_card import HubCardMixin
except ImportError:  # a copy loaded with trust_remote_code: transformers' own save_pretrained / push_to_hub

    class HubCardMixin:
        pass


class CrateTextPreTrainedModel(HubCardMixin, PreTrainedModel):
    config: CrateTextConfig
    config_class = CrateTextConfig
    base_model_prefix = "crate"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["CrateTextEmbeddings", "CrateTextLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True  # torch.compile(fullgraph=True) and torch.export: tests/test_model_common.py
    _can_record_outputs = {
        "hidden_states": OutputRecorder(CrateTextLayer, index=0),
        "mid_hidden_states": OutputRecorder(CrateTextLayer, index=1),
        "attentions": OutputRecorder(CrateTextMSSA, index=1),
    }

    def _init_weights(self, module):
        """Normal(0, initializer_range) for Linear/Embedding as Transformers does; Kaiming-uniform ISTA dictionaries and a
        depth-scaled MSSA output projection, as CRATE-LM's code."""
        super()._init_weights(module)
        if isinstance(module, (CrateTextISTA, CrateTextOvercompleteISTA)):
            init.kaiming_uniform_(module.weight)
        elif isinstance(module, nn.Linear) and getattr(module, "depth_scaled", False):
            # on the projection itself: transformers skips _init_weights for a remote-code module without parameters
            # of its own (CrateTextMSSA), so a branch on the MSSA never ran
            std = self.config.initializer_range / (2 * self.config.num_hidden_layers) ** 0.5
            init.normal_(module.weight, mean=0.0, std=std)


__all__ = [
    "CrateTextModelOutput",
    "CrateTextKwargs",
    "CrateTextPreTrainedModel",
    "CrateTextLayer",
    "CrateTextMSSA",
    "CrateTextISTA",
    "CrateTextOvercompleteISTA",
    "pooled_token",
    "position_ids_from_mask",
]
