"""The attention-only transformer (AoT, Wang, Lu, Yu, Pai, Qu and Ma, ICML 2025) as a Transformers vision model, and the
block it shares with the language model (:mod:`.modeling_aot_text`).

One block maps ``Z`` to ``Z+`` with attention only (no MLP, no ISTA step)::

    Z_plus = Z + eta * Attn(LN(Z))

``Attn`` is MSSA (``config.attention="mssa"``: each token projected onto K subspaces, ``w = U_k^T z`` used as query,
key and value, as in CRATE, then mapped back by a learned ``W_O`` or by ``U = [U_1..U_K]`` itself,
``config.mssa_output``), or standard multi-head self-attention (``"mhsa"``: separate query, key and value
projections and ``W_O``), which the paper uses for its language models. With ``mssa_output="subspace"`` the update
is ``eta * sum_k U_k softmax((U_k^T Z)^T (U_k^T Z)/sqrt(p)) U_k^T Z``, the paper's subspace-denoising step.

This file imports only torch, transformers and its sibling ``configuration_aot`` so that ``save_pretrained`` can ship
it for ``trust_remote_code`` loading.
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
from transformers.modeling_outputs import ImageClassifierOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_aot import AotConfig, size_pair


@dataclass
class AotModelOutput(ModelOutput):
    """Output of :class:`AotModel`.

    Args:
        last_hidden_state: ``(B, N, d)`` output ``Z^L`` of the last block.
        pooler_output: ``(B, d)`` CLS token (``pooling="cls"``) or token mean (``"mean"``) of ``Z^L``.
        hidden_states: ``L+1`` tensors ``(B, N, d)``: the embeddings ``Z^0``, then each block output ``Z^l``.
        attentions: ``L`` tensors ``(B, K, N, N)`` of attention probabilities (eager path only).
    """

    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class AotPatchEmbeddings(nn.Module):
    """Patchify channel-last ``b c (h p1) (w p2) -> b (h w) (p1 p2 c)``, then LayerNorm, Linear, LayerNorm (CRATE's)."""

    def __init__(self, config: AotConfig):
        super().__init__()
        self.image_size = size_pair(config.image_size, "image_size")
        self.patch_size = size_pair(config.patch_size, "patch_size")
        self.num_channels = config.num_channels
        self.grid_size = (self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        patch_dim = self.patch_size[0] * self.patch_size[1] * config.num_channels
        self.norm_in = nn.LayerNorm(patch_dim, eps=config.layer_norm_eps)
        self.projection = nn.Linear(patch_dim, config.hidden_size)
        self.norm_out = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if pixel_values.ndim != 4:
            raise ValueError(
                f"pixel_values must have shape (batch, channels, height, width), got {tuple(pixel_values.shape)}"
            )
        batch, channels, height, width = pixel_values.shape
        if channels != self.num_channels:
            raise ValueError(f"pixel_values has {channels} channels; the model was configured with {self.num_channels}")
        ph, pw = self.patch_size
        if height % ph or width % pw:
            raise ValueError(f"image size ({height}x{width}) must be divisible by the patch size ({ph}x{pw})")
        patches = pixel_values.reshape(batch, channels, height // ph, ph, width // pw, pw)
        patches = patches.permute(0, 2, 4, 3, 5, 1).reshape(batch, (height // ph) * (width // pw), ph * pw * channels)
        return self.norm_out(self.projection(self.norm_in(patches)))


class AotEmbeddings(nn.Module):
    """Patch embedding, CLS token and learned position embedding."""

    def __init__(self, config: AotConfig):
        super().__init__()
        self.patch_embeddings = AotPatchEmbeddings(config)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.position_embeddings = nn.Parameter(
            torch.zeros(1, self.patch_embeddings.num_patches + 1, config.hidden_size)
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        height, width = pixel_values.shape[-2:]
        if (height, width) != self.patch_embeddings.image_size:
            ih, iw = self.patch_embeddings.image_size
            raise ValueError(
                f"Input image size ({height}x{width}) doesn't match the model ({ih}x{iw}); resize the images"
            )
        tokens = self.patch_embeddings(pixel_values)
        tokens = torch.cat((self.cls_token.expand(tokens.shape[0], -1, -1), tokens), dim=1)
        return self.dropout(tokens + self.position_embeddings)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
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


class AotAttention(nn.Module):
    """MSSA (``q = k = v = U_k^T z``, output ``W_O`` or ``U``) or MHSA (separate ``W_Q, W_K, W_V, W_O``), causal for
    the language model; keys and values of past tokens in a transformers :class:`~transformers.Cache`."""

    def __init__(self, config, layer_idx: int = 0, is_causal: bool = False):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = is_causal
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        self.kind = config.attention
        inner = self.num_heads * self.head_dim
        if self.kind == "mssa":
            self.qkv = nn.Linear(config.hidden_size, inner, bias=False)  # rows: U_k^T, k = 1..K
            learned = config.mssa_output == "learned"
            self.out_proj = nn.Linear(inner, config.hidden_size) if learned else None
        else:
            self.q_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
            self.k_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
            self.v_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
            self.out_proj = nn.Linear(inner, config.hidden_size)
        if self.out_proj is not None:
            self.out_proj.depth_scaled = True  # initialised at initializer_range / sqrt(2 L) (init_depth_scaled)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def output_matrix(self) -> torch.Tensor:
        """The output matrix ``(d, K*p)`` in ``nn.Linear`` (out, in) layout: ``W_O``, or ``U`` (``mssa_output="subspace"``)."""
        return self.out_proj.weight if self.out_proj is not None else self.qkv.weight.t()

    def subspace_bases(self) -> torch.Tensor | None:
        """``(K, d, p)`` bases ``U_k`` of MSSA (``None`` for MHSA, which has no single subspace per head)."""
        if self.kind != "mssa":
            return None
        return self.qkv.weight.view(self.num_heads, self.head_dim, -1).transpose(1, 2)

    def _heads(self, linear: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = hidden.shape
        return linear(hidden).view(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, tokens, _ = hidden_states.shape
        if self.kind == "mssa":
            query = key = value = self._heads(self.qkv, hidden_states)
        else:
            query = self._heads(self.q_proj, hidden_states)
            key, value = self._heads(self.k_proj, hidden_states), self._heads(self.v_proj, hidden_states)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        implementation = self.config._attn_implementation
        if kwargs.get("output_attentions"):
            implementation = "eager"  # attention maps exist only on the eager path
        interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        if implementation == "eager" and attention_mask is None and self.is_causal and tokens > 1:
            past = key.shape[-2] - tokens
            blocked = torch.ones(tokens, key.shape[-2], dtype=torch.bool, device=query.device).triu(past + 1)
            attention_mask = torch.zeros(blocked.shape, dtype=query.dtype, device=query.device).masked_fill(
                blocked, torch.finfo(query.dtype).min
            )[None, None]
        heads, probs = interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            is_causal=self.is_causal,
        )
        heads = heads.reshape(batch, tokens, self.num_heads * self.head_dim)  # every interface returns (B, N, K, p)
        out = self.out_proj(heads) if self.out_proj is not None else heads @ self.qkv.weight  # W_O or U
        return self.dropout(out), probs


class AotLayer(GradientCheckpointingLayer):
    """One AoT block: ``Z_plus = Z + eta * Attn(LN(Z))``."""

    def __init__(self, config, layer_idx: int = 0, is_causal: bool = False):
        super().__init__()
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = AotAttention(config, layer_idx, is_causal)
        self.step_size = float(config.step_size)

    def forward(self, hidden_states, attention_mask=None, cache=None, **kwargs: Unpack[TransformersKwargs]):
        update, _ = self.attention(self.layernorm_before(hidden_states), attention_mask, cache, **kwargs)
        return hidden_states + self.step_size * update


try:  # hf-tdiag's model card on save_pretrained / push_to_hub (hf_tdiag/_hub_card.py), in the package only
    if not __name__.startswith("hf_tdiag."):
        raise ImportError(f"{__name__} is a copy loaded as remote code")
    from hf_tdiag._hub_card import HubCardMixin
except ImportError:  # a copy loaded with trust_remote_code: transformers' own save_pretrained / push_to_hub

    class HubCardMixin:
        pass


def init_depth_scaled(config, module: nn.Module) -> None:
    """The attention output projection at ``initializer_range / sqrt(2 L)`` (GPT-2's scaling of residual branches).

    Marked on the projection itself: transformers skips ``_init_weights`` for a remote-code module without parameters
    of its own (the attention module), so a branch on the attention would never run there."""
    if isinstance(module, nn.Linear) and getattr(module, "depth_scaled", False):
        init.normal_(module.weight, mean=0.0, std=config.initializer_range / (2 * config.num_hidden_layers) ** 0.5)


class AotPreTrainedModel(HubCardMixin, PreTrainedModel):
    config: AotConfig
    config_class = AotConfig
    base_model_prefix = "aot"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["AotEmbeddings", "AotLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    # hidden_states = Z^0 (the first block's input), then each block's output Z^l; attentions = each block's
    # attention probabilities (eager path)
    _can_record_outputs = {"hidden_states": AotLayer, "attentions": OutputRecorder(AotAttention, index=1)}

    def _init_weights(self, module):
        """Transformers' Linear/LayerNorm initialisation, depth-scaled output projections, trunc-normal CLS/positions."""
        super()._init_weights(module)
        init_depth_scaled(self.config, module)
        if isinstance(module, AotEmbeddings):
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=self.config.initializer_range)
            init.trunc_normal_(module.cls_token, mean=0.0, std=self.config.initializer_range)


class AotModel(AotPreTrainedModel):
    """Bare AoT vision encoder returning token states ``Z^L`` and the pooled token.

    ``output_hidden_states=True`` returns ``Z^0 ... Z^L``, ``output_attentions=True`` the attention probabilities
    (computed on the eager path for that call).
    """

    def __init__(self, config: AotConfig):
        super().__init__(config)
        self.config = config
        self.embeddings = AotEmbeddings(config)
        self.layer = nn.ModuleList([AotLayer(config, i) for i in range(config.num_hidden_layers)])
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> AotPatchEmbeddings:
        return self.embeddings.patch_embeddings

    @capture_outputs(tie_last_hidden_states=False)
    def forward(self, pixel_values: torch.Tensor | None = None, **kwargs: Unpack[TransformersKwargs]) -> AotModelOutput:
        if pixel_values is None:
            raise ValueError("AotModel.forward: pixel_values is required")
        if not isinstance(pixel_values, torch.Tensor):
            raise TypeError(f"pixel_values must be a torch.Tensor, got {type(pixel_values).__name__}")
        hidden = self.embeddings(pixel_values.to(self.embeddings.patch_embeddings.projection.weight.dtype))
        for layer in self.layer:
            hidden = layer(hidden, **kwargs)
        pooled = hidden[:, 0] if self.config.pooling == "cls" else hidden.mean(dim=1)
        return AotModelOutput(last_hidden_state=hidden, pooler_output=pooled)


class AotForImageClassification(AotPreTrainedModel):
    """AoT encoder with a LayerNorm + Linear head on the CLS token (or the token mean), as CRATE's."""

    def __init__(self, config: AotConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.aot = AotModel(config)
        self.classifier_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
        self.post_init()

    @can_return_tuple
    def forward(
        self, pixel_values: torch.Tensor | None = None, labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> ImageClassifierOutput:  # fmt: skip
        outputs: AotModelOutput = self.aot(pixel_values, **kwargs)
        logits = self.classifier(self.classifier_norm(outputs.pooler_output))
        loss = self.loss_function(labels, logits, self.config, **kwargs) if labels is not None else None
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


__all__ = [
    "AotModelOutput",
    "AotPreTrainedModel",
    "AotAttention",
    "AotLayer",
    "AotModel",
    "AotForImageClassification",
]
