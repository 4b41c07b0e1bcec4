"""ToST (Token Statistics Transformer, Wu et al. 2025) as a Transformers model.

Token Statistics Self-Attention (TSSA, the authors' ``AttentionTSSA``), per head ``k`` on ``x = LN1(z)``::

    w_k   = U_kᵀ x + b_k                                 (B, N, p)  one projection, no query/key/value split
    Π     = softmax_k( τ_k · Σ_i w_ki² / Σ_n w_ki(n)² )   (B, K, N)  soft membership of each token over the heads
    s_k   = Σ_n Π_k(n) w_k(n)² / Σ_n Π_k(n)              (B, K, p)  Π-weighted second moment of each coordinate
    out_k = −Π_k ⊙ w_k ⊙ 1 / (1 + s_k)                              = −N ∇_{w_k} R_c^var(w, Π) (Π held fixed)

concatenated over heads and mapped by the output projection; the cost is linear in N. The causal form replaces
both token sums by cumulative sums (the authors' language model, without its learned ``denom_bias``). A block is
``z½ = z + γ₁ ⊙ TSSA(LN1 z)``, ``z⁺ = z½ + γ₂ ⊙ MLP(LN2 z½)``; a CLS token is then appended and read by CaiT
class-attention blocks, a LayerNorm and the head (as in the authors' XCiT-based ``tost_vision/tost.py``).

This file imports only torch, transformers and its sibling ``configuration_tost`` so that ``save_pretrained`` can
ship it for ``trust_remote_code`` loading.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import ImageClassifierOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_tost import TostConfig


class TostKwargs(TransformersKwargs, total=False):
    """The keyword arguments of the forward passes: Transformers' own, and the family's recorded outputs.

    Attributes:
        output_mid_hidden_states: each block's mid state ``Z^{l-1/2}`` (after attention, before the sparse-coding step).
        output_memberships: each TSSA's membership ``Π`` (B, K, N).
    """

    output_mid_hidden_states: bool | None
    output_memberships: bool | None


@dataclass
class TostModelOutput(ModelOutput):
    """Output of :class:`TostModel`.

    Args:
        last_hidden_state: ``(B, N + 1, d)`` tokens after the class-attention blocks and the final LayerNorm
            (CLS first).
        pooler_output: ``(B, d)`` the normalized CLS token.
        hidden_states: ``L+1`` tensors ``(B, N, d)``: the embeddings output, then each TSSA block's output.
        mid_hidden_states: ``L`` tensors: each block's ``z½ = z + γ₁ ⊙ TSSA(LN1 z)``.
        memberships: ``L`` tensors ``(B, K, N)``: each TSSA's membership ``Π``.
        attentions: class-attention probabilities ``(B, K, 1, N + 1)``, one per class-attention block.
    """

    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    mid_hidden_states: tuple[torch.Tensor, ...] | None = None
    memberships: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class TostImageClassifierOutput(ImageClassifierOutput):
    """:class:`~transformers.modeling_outputs.ImageClassifierOutput` plus mid states and memberships."""

    mid_hidden_states: tuple[torch.Tensor, ...] | None = None
    memberships: tuple[torch.Tensor, ...] | None = None


class TostPatchEmbeddings(nn.Module):
    """``log2(patch)`` stride-2 3x3 convolutions (no bias) each with BatchNorm, GELU between them (XCiT's stem)."""

    def __init__(self, config: TostConfig):
        super().__init__()
        stages = int(math.log2(config.patch_size))
        widths = [config.num_channels] + [config.hidden_size // 2 ** (stages - 1 - i) for i in range(stages)]
        layers: list[nn.Module] = []
        for i in range(stages):
            conv = nn.Conv2d(widths[i], widths[i + 1], kernel_size=3, stride=2, padding=1, bias=False)
            layers.append(nn.Sequential(conv, nn.BatchNorm2d(widths[i + 1])))
            if i < stages - 1:
                layers.append(nn.GELU())
        self.proj = nn.Sequential(*layers)
        self.num_channels, self.patch_size = config.num_channels, config.patch_size

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        if pixel_values.ndim != 4 or pixel_values.shape[1] != self.num_channels:
            raise ValueError(
                f"pixel_values must have shape (batch, {self.num_channels}, height, width), got {tuple(pixel_values.shape)}"
            )
        if pixel_values.shape[-2] % self.patch_size or pixel_values.shape[-1] % self.patch_size:
            raise ValueError(
                f"pixel_values spatial size {tuple(pixel_values.shape[-2:])} must be divisible by patch_size {self.patch_size}"
            )
        x = self.proj(pixel_values)
        return x.flatten(2).transpose(1, 2), (x.shape[2], x.shape[3])


class TostPositionEncoding(nn.Module):
    """DETR/XCiT Fourier features of the normalized patch grid, mapped to ``d`` by a 1x1 convolution."""

    def __init__(self, config: TostConfig, temperature: float = 10000.0):
        super().__init__()
        self.hidden_dim = config.position_hidden_dim
        self.token_projection = nn.Conv2d(2 * self.hidden_dim, config.hidden_size, kernel_size=1)
        self.temperature = temperature

    def forward(self, batch: int, height: int, width: int, device: torch.device | None = None) -> torch.Tensor:
        # ``device``: the tokens' (an offloaded projection's weight sits on the meta device until its forward)
        device = self.token_projection.weight.device if device is None else device
        dtype = torch.float64 if self.token_projection.weight.dtype == torch.float64 else torch.float32
        ones = torch.ones(batch, height, width, device=device, dtype=dtype)
        scale, eps = 2 * math.pi, 1e-6
        y = ones.cumsum(1)
        x = ones.cumsum(2)
        y = y / (y[:, -1:, :] + eps) * scale
        x = x / (x[:, :, -1:] + eps) * scale
        dim_t = torch.arange(self.hidden_dim, dtype=dtype, device=device)
        dim_t = self.temperature ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / self.hidden_dim)
        pos_x, pos_y = x[..., None] / dim_t, y[..., None] / dim_t
        pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).flatten(3)
        pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).flatten(3)
        pos = torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2).to(self.token_projection.weight.dtype)
        return self.token_projection(pos).flatten(2).transpose(1, 2)  # (B, H*W, d)


def token_statistics_attention(
    w: torch.Tensor, temperature: torch.Tensor, causal: bool = False, dropout: nn.Module | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """TSSA on head projections ``w`` (B, K, N, p): returns ``(−Π ⊙ w ⊙ 1/(1+s), Π)``, Π of shape (B, K, N)."""
    w_sq = w * w
    if causal:
        normed = w_sq / w_sq.cumsum(dim=-2).clamp_min(1e-12)
    else:
        normed = w_sq / (
            w_sq.sum(dim=-2, keepdim=True).sqrt().clamp_min(1e-12) ** 2
        )  # F.normalize over tokens, squared
    pi = torch.softmax(normed.sum(dim=-1) * temperature, dim=1)  # over the heads
    if causal:
        second = (w_sq * pi.unsqueeze(-1)).cumsum(dim=-2) / (pi.cumsum(dim=-1) + 1e-8).unsqueeze(-1)
    else:
        second = torch.matmul((pi / (pi.sum(dim=-1, keepdim=True) + 1e-8)).unsqueeze(-2), w_sq)  # (B, K, 1, p)
    gain = 1.0 / (1.0 + second)
    if dropout is not None:
        gain = dropout(gain)
    return -(w * pi.unsqueeze(-1)) * gain, pi


class TostTSSA(nn.Module):
    """Token Statistics Self-Attention: one projection ``U_kᵀ`` (``qkv``), temperature ``τ`` per head, output map."""

    def __init__(self, config: TostConfig):
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.causal = bool(config.causal)
        self.qkv = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.temp = nn.Parameter(torch.ones(config.num_attention_heads, 1))
        self.attn_drop = nn.Dropout(config.attention_probs_dropout_prob)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.proj_drop = nn.Dropout(config.hidden_dropout_prob)

    def subspaces(self) -> torch.Tensor:
        """``U`` of shape ``(K, d, p)``: head ``k``'s columns are rows ``k·p … (k+1)·p − 1`` of ``qkv.weight``."""
        return self.qkv.weight.view(self.num_heads, self.head_dim, -1).transpose(1, 2)

    def head_projections(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``w = U_kᵀ x + b_k`` as (B, K, N, p)."""
        batch, tokens, _ = hidden_states.shape
        return self.qkv(hidden_states).view(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states: torch.Tensor, **kwargs: Unpack[TostKwargs]) -> tuple[torch.Tensor, torch.Tensor]:
        batch, tokens, _ = hidden_states.shape
        heads, pi = token_statistics_attention(
            self.head_projections(hidden_states), self.temp, self.causal, self.attn_drop if self.training else None
        )
        out = self.out_proj(heads.transpose(1, 2).reshape(batch, tokens, -1))
        return self.proj_drop(out), pi


class TostMLP(nn.Module):
    """``fc2(GELU(fc1 x))``, hidden size ``mlp_ratio · d``."""

    def __init__(self, config: TostConfig):
        super().__init__()
        hidden = int(config.hidden_size * config.mlp_ratio)
        self.fc1 = nn.Linear(config.hidden_size, hidden)
        self.fc2 = nn.Linear(hidden, config.hidden_size)
        self.drop = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(F.gelu(self.fc1(x)))))


class TostLayer(GradientCheckpointingLayer):
    """``z½ = z + γ₁ ⊙ TSSA(LN1 z)``, ``z⁺ = z½ + γ₂ ⊙ MLP(LN2 z½)``; returns ``(z⁺, z½)``."""

    def __init__(self, config: TostConfig):
        super().__init__()
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = TostTSSA(config)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = TostMLP(config)
        self.gamma1 = nn.Parameter(torch.full((config.hidden_size,), float(config.layer_scale_init_value)))
        self.gamma2 = nn.Parameter(torch.full((config.hidden_size,), float(config.layer_scale_init_value)))

    def forward(self, hidden_states: torch.Tensor, **kwargs: Unpack[TostKwargs]) -> tuple[torch.Tensor, torch.Tensor]:
        attn_out, _ = self.attention(self.layernorm_before(hidden_states))
        mid = hidden_states + self.gamma1 * attn_out
        return mid + self.gamma2 * self.mlp(self.layernorm_after(mid)), mid


def eager_attention_forward(
    module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs: Unpack[TostKwargs]
):
    """``softmax(q kᵀ · scaling) v``; returns ``(B, Nq, K, p)`` and the ``(B, K, Nq, N)`` probabilities."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    dropped = F.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(dropped, value).transpose(1, 2).contiguous(), probs


class TostClassAttention(nn.Module):
    """CaiT class attention: the CLS token's query against every token's key (softmax, attention interface)."""

    def __init__(self, config: TostConfig):
        super().__init__()
        self.config = config
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.qkv_bias)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_dropout = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, **kwargs: Unpack[TostKwargs]) -> tuple[torch.Tensor, torch.Tensor]:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        implementation = self.config._attn_implementation
        if kwargs.get("output_attentions") or implementation == "flex_attention":
            implementation = "eager"  # maps only on the eager path; flex needs more than one query
        interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        cls, probs = interface(
            self, q[:, :, :1].contiguous(), k, v, None, scaling=self.scaling,
            dropout=self.attention_dropout if self.training else 0.0, is_causal=False,
        )  # fmt: skip
        cls = self.proj(cls.reshape(batch, 1, dim))
        return torch.cat([cls, x[:, 1:]], dim=1), probs


class TostClassAttentionLayer(nn.Module):
    """CaiT block as the authors run it (``tokens_norm=True``): norm2 on every token, MLP on the CLS token only."""

    def __init__(self, config: TostConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attn = TostClassAttention(config)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = TostMLP(config)
        self.gamma1 = nn.Parameter(torch.full((config.hidden_size,), float(config.layer_scale_init_value)))
        self.gamma2 = nn.Parameter(torch.full((config.hidden_size,), float(config.layer_scale_init_value)))

    def forward(self, x: torch.Tensor, **kwargs: Unpack[TostKwargs]) -> torch.Tensor:
        attn_out, _ = self.attn(self.norm1(x), **kwargs)
        x = self.norm2(x + self.gamma1 * attn_out)
        cls = self.gamma2 * self.mlp(x[:, :1])
        return x + torch.cat([cls, x[:, 1:]], dim=1)  # the authors' residual: patch tokens are added to themselves


try:  # hf-tdiag's model card on save_pretrained / push_to_hub (hf_tdiag/_hub_card.py), in the package only
    if not __name__.startswith("hf_tdiag."):
        raise ImportError(f"{__name__} is a copy loaded as remote code")
    from hf_tdiag._hub_card import HubCardMixin
except ImportError:  # a copy loaded with trust_remote_code: transformers' own save_pretrained / push_to_hub

    class HubCardMixin:
        pass


class TostPreTrainedModel(HubCardMixin, PreTrainedModel):
    config: TostConfig
    config_class = TostConfig
    base_model_prefix = "tost"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["TostLayer", "TostClassAttentionLayer"]
    _supports_sdpa = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True  # torch.compile(fullgraph=True) and torch.export: tests/test_model_common.py
    _can_record_outputs = {
        "hidden_states": OutputRecorder(TostLayer, index=0),
        "mid_hidden_states": OutputRecorder(TostLayer, index=1),
        "memberships": OutputRecorder(TostTSSA, index=1),
        "attentions": OutputRecorder(TostClassAttention, index=1),
    }

    def _init_weights(self, module):
        """Truncated-normal Linear weights and zero biases, unit temperatures, layer scale at its initial value."""
        super()._init_weights(module)
        if isinstance(module, nn.Linear):
            init.trunc_normal_(module.weight, std=self.config.initializer_range)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, TostTSSA):
            init.ones_(module.temp)
        elif isinstance(module, (TostLayer, TostClassAttentionLayer)):
            init.constant_(module.gamma1, float(self.config.layer_scale_init_value))
            init.constant_(module.gamma2, float(self.config.layer_scale_init_value))
        elif isinstance(module, TostModel):
            init.trunc_normal_(module.cls_token, std=self.config.initializer_range)


class TostModel(TostPreTrainedModel):
    """ToST encoder: patch stem, Fourier positions, TSSA blocks, CLS token, class attention, final LayerNorm."""

    def __init__(self, config: TostConfig):
        super().__init__(config)
        self.config = config
        self.patch_embeddings = TostPatchEmbeddings(config)
        self.position_encoding = TostPositionEncoding(config) if config.use_position_encoding else None
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.layer = nn.ModuleList([TostLayer(config) for _ in range(config.num_hidden_layers)])
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.class_attention = nn.ModuleList(
            [TostClassAttentionLayer(config) for _ in range(config.num_class_attention_layers)]
        )
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.patch_embeddings

    def embed(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Patch tokens plus positions: the input ``Z⁰`` of the first TSSA block, (B, N, d)."""
        tokens, (height, width) = self.patch_embeddings(pixel_values)
        if self.position_encoding is not None:
            tokens = tokens + self.position_encoding(tokens.shape[0], height, width, tokens.device)
        return self.dropout(tokens)

    @capture_outputs(tie_last_hidden_states=False)
    def forward(self, pixel_values: torch.Tensor | None = None, **kwargs: Unpack[TostKwargs]) -> TostModelOutput:
        if pixel_values is None:
            raise ValueError("TostModel.forward: pixel_values is required")
        if not isinstance(pixel_values, torch.Tensor):
            raise TypeError(f"pixel_values must be a torch.Tensor, got {type(pixel_values).__name__}")
        hidden_states = self.embed(pixel_values.to(self.cls_token.dtype))
        for layer in self.layer:
            hidden_states, _ = layer(hidden_states, **kwargs)
        hidden_states = torch.cat((self.cls_token.expand(hidden_states.shape[0], -1, -1), hidden_states), dim=1)
        for block in self.class_attention:
            hidden_states = block(hidden_states, **kwargs)
        hidden_states = self.layernorm(hidden_states)
        return TostModelOutput(last_hidden_state=hidden_states, pooler_output=hidden_states[:, 0])


class TostForImageClassification(TostPreTrainedModel):
    """ToST with the authors' head: a linear map of the normalized CLS token."""

    def __init__(self, config: TostConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.tost = TostModel(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
        self.post_init()

    @can_return_tuple
    def forward(
        self, pixel_values: torch.Tensor | None = None, labels: torch.Tensor | None = None, **kwargs: Unpack[TostKwargs]
    ) -> TostImageClassifierOutput:
        outputs: TostModelOutput = self.tost(pixel_values, **kwargs)
        logits = self.classifier(outputs.pooler_output)
        loss = self.loss_function(labels, logits, self.config, **kwargs) if labels is not None else None
        return TostImageClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            mid_hidden_states=outputs.mid_hidden_states,
            memberships=outputs.memberships,
        )


__all__ = [
    "TostModelOutput",
    "TostImageClassifierOutput",
    "TostPreTrainedModel",
    "TostModel",
    "TostForImageClassification",
    "token_statistics_attention",
]
