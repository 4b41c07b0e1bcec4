"""CRATE (Coding RAte reduction TransformEr, Yu et al. 2023) as a Transformers model.

One block maps ``Z`` to ``Z+``::

    Z_half = Z + MSSA(LN1(Z))
    Z_plus = ISTA(LN2(Z_half))            # no residual around ISTA

``MSSA`` projects each token onto K subspaces ``U_k`` (q = k = v = U_k^T z), runs
softmax self-attention inside each subspace and maps the concatenated heads back
with the *output matrix* that defines the variant (see ``CrateMSSA.output_matrix``).
``ISTA(z) = ReLU(z + eta * D^T (z - D z) - eta * lambda)`` with a square dictionary D.

This file imports only torch, transformers and its sibling ``configuration_crate``
so that ``save_pretrained`` can ship it for ``trust_remote_code`` loading.
"""

from __future__ import annotations

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
from transformers.utils import ModelOutput, TransformersKwargs, logging
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_crate import CrateConfig, size_pair

logger = logging.get_logger(__name__)


class CrateKwargs(TransformersKwargs, total=False):
    """The keyword arguments of the forward passes: Transformers' own, and the family's recorded outputs.

    Attributes:
        output_mid_hidden_states: each block's mid state ``Z^{l-1/2}`` (after attention, before the sparse-coding step).
    """

    output_mid_hidden_states: bool | None


@dataclass
class CrateModelOutput(ModelOutput):
    """Output of :class:`CrateModel`.

    Args:
        last_hidden_state: ``(B, N, d)`` output ``Z^L`` of the last block (CRATE has no final norm in the encoder).
        pooler_output: ``(B, d)`` CLS token (``pooling="cls"``) or token mean (``"mean"``) of ``Z^L``.
        hidden_states: ``L+1`` tensors ``(B, N, d)``: embeddings output ``Z^0``, then each block output ``Z^{l+1}``.
        mid_hidden_states: ``L`` tensors ``(B, N, d)``: ``Z^{l+1/2} = Z^l + MSSA(LN1(Z^l))`` of each block.
        attentions: ``L`` tensors ``(B, K, N, N)`` of attention probabilities (eager path only).
    """

    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    mid_hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class CrateImageClassifierOutput(ImageClassifierOutput):
    """:class:`~transformers.modeling_outputs.ImageClassifierOutput` plus the mid-block states ``Z^{l+1/2}``."""

    mid_hidden_states: tuple[torch.Tensor, ...] | None = None


class CratePatchEmbeddings(nn.Module):
    """Patchify channel-last ``b c (h p1) (w p2) -> b (h w) (p1 p2 c)``, then LayerNorm, Linear, LayerNorm."""

    def __init__(self, config: CrateConfig):
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
            raise ValueError(
                f"pixel_values has {channels} channels but the model was configured with num_channels={self.num_channels}"
            )
        ph, pw = self.patch_size
        if height % ph or width % pw:
            raise ValueError(
                f"pixel_values spatial size ({height}x{width}) must be divisible by patch_size ({ph}x{pw})"
            )
        gh, gw = height // ph, width // pw
        patches = pixel_values.reshape(batch, channels, gh, ph, gw, pw)
        patches = patches.permute(0, 2, 4, 3, 5, 1).reshape(batch, gh * gw, ph * pw * channels)
        return self.norm_out(self.projection(self.norm_in(patches)))


class CrateEmbeddings(nn.Module):
    """Patch embedding, CLS token and learned position embedding."""

    def __init__(self, config: CrateConfig):
        super().__init__()
        self.patch_embeddings = CratePatchEmbeddings(config)
        num_patches = self.patch_embeddings.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.position_embeddings = nn.Parameter(torch.zeros(1, num_patches + 1, config.hidden_size))
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def interpolate_pos_encoding(self, height: int, width: int) -> torch.Tensor:
        """Position embedding resized (bicubic) from the configured patch grid to the grid of a ``height x width`` input."""
        gh, gw = self.patch_embeddings.grid_size
        ph, pw = self.patch_embeddings.patch_size
        new_h, new_w = height // ph, width // pw
        if (new_h, new_w) == (gh, gw) and not torch.jit.is_tracing():
            return self.position_embeddings
        cls_pos = self.position_embeddings[:, :1]
        patch_pos = self.position_embeddings[:, 1:]
        dim = patch_pos.shape[-1]
        patch_pos = patch_pos.reshape(1, gh, gw, dim).permute(0, 3, 1, 2)
        patch_pos = F.interpolate(patch_pos.float(), size=(new_h, new_w), mode="bicubic", align_corners=False).to(
            self.position_embeddings.dtype
        )
        patch_pos = patch_pos.permute(0, 2, 3, 1).reshape(1, new_h * new_w, dim)
        return torch.cat((cls_pos, patch_pos), dim=1)

    def forward(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False) -> torch.Tensor:
        height, width = pixel_values.shape[-2:]
        if not interpolate_pos_encoding and (height, width) != self.patch_embeddings.image_size:
            ih, iw = self.patch_embeddings.image_size
            raise ValueError(
                f"Input image size ({height}x{width}) doesn't match the model ({ih}x{iw}); "
                "pass interpolate_pos_encoding=True to run at another resolution."
            )
        tokens = self.patch_embeddings(pixel_values)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        tokens = torch.cat((cls, tokens), dim=1)
        if interpolate_pos_encoding:
            tokens = tokens + self.interpolate_pos_encoding(height, width)
        else:
            tokens = tokens + self.position_embeddings
        return self.dropout(tokens) if self.dropout.p > 0 else tokens


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[CrateKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q k^T * scaling + mask) v`` in plain torch; returns ``(B, N, K, p)`` and the ``(B, K, N, N)`` probabilities."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    dropped = F.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(dropped, value).transpose(1, 2).contiguous(), probs


class CrateMSSA(nn.Module):
    """Multi-head subspace self-attention: heads ``softmax((U_k^T Z)^T (U_k^T Z)/sqrt(p)) U_k^T Z`` mixed by the output matrix."""

    def __init__(self, config: CrateConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.variant = config.variant
        self.hidden_size = config.hidden_size
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        self.is_causal = False
        inner = self.num_heads * self.head_dim
        self.qkv = nn.Linear(config.hidden_size, inner, bias=False)
        if self.variant == "crate":
            self.out_proj = nn.Linear(inner, config.hidden_size)
        else:
            self.out_proj = None
        if self.variant == "crate-fix":
            self.register_buffer("fixed_output", torch.zeros(config.hidden_size, inner), persistent=True)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def output_matrix(self) -> torch.Tensor:
        """Effective output matrix ``(d, K*p)`` in ``nn.Linear`` (out, in) layout for the configured variant."""
        if self.variant == "crate":
            return self.out_proj.weight
        if self.variant == "crate-c":
            return self.qkv.weight.t()
        if self.variant == "crate-n":
            return -self.qkv.weight.t()
        if self.variant == "crate-t":
            return self.qkv.weight
        if self.variant == "crate-fix":
            return self.fixed_output
        return torch.eye(self.hidden_size, device=self.qkv.weight.device, dtype=self.qkv.weight.dtype)

    def _project_out(self, heads: torch.Tensor) -> torch.Tensor:
        """Apply the output matrix to the concatenated heads ``(B, N, K*p)`` without materializing transposes."""
        if self.variant == "crate":
            return self.out_proj(heads)
        if self.variant == "crate-c":
            return heads @ self.qkv.weight
        if self.variant == "crate-n":
            return -(heads @ self.qkv.weight)
        if self.variant == "crate-t":
            return F.linear(heads, self.qkv.weight)
        if self.variant == "crate-fix":
            return F.linear(heads, self.fixed_output)
        return heads

    def forward(
        self, hidden_states: torch.Tensor, **kwargs: Unpack[CrateKwargs]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, tokens, _ = hidden_states.shape
        # (B, N, K*p) -> (B, K, N, p): w = U_k^T z, used as query, key and value
        w = self.qkv(hidden_states).view(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)
        implementation = self.config._attn_implementation
        if kwargs.get("output_attentions"):
            implementation = "eager"  # attention maps exist only on the eager path
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        heads, probs = attention_interface(
            self,
            w,
            w,
            w,
            None,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            is_causal=False,
        )
        # every interface returns (B, N, K, p)
        out = self._project_out(heads.reshape(batch, tokens, self.num_heads * self.head_dim))
        if self.dropout.p > 0:
            out = self.dropout(out)
        return out, probs


class CrateISTA(nn.Module):
    """One ISTA step on a square dictionary: ``ReLU(z + eta * D^T (z - D z) - eta * lambda)``."""

    def __init__(self, config: CrateConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(config.hidden_size, config.hidden_size))
        self.step_size = float(config.ista_step_size)
        self.lambd = float(config.ista_lambda)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # row-vector form of the official code, x + eta * (x D - (x D^T) D) - eta * lambda
        # = x + eta * (x - x D^T) D - eta * lambda, as two fused matmul-adds
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        weight = self.weight
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
            x, weight = x.to(dtype), weight.to(dtype)
        residual = torch.addmm(x, x, weight.t(), alpha=-1.0)
        out = torch.addmm(x, residual, weight, alpha=self.step_size)
        out = out.sub_(self.step_size * self.lambd).relu_()  # addmm does not keep its output for backward
        return out.view(shape)


class CrateLayer(GradientCheckpointingLayer):
    """One CRATE block: ``Z_half = Z + MSSA(LN1(Z))``, ``Z_plus = ISTA(LN2(Z_half))``; returns ``(Z_plus, Z_half)``."""

    def __init__(self, config: CrateConfig):
        super().__init__()
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = CrateMSSA(config)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ista = CrateISTA(config)

    def forward(self, hidden_states: torch.Tensor, **kwargs: Unpack[CrateKwargs]) -> tuple[torch.Tensor, torch.Tensor]:
        attn_out, _ = self.attention(self.layernorm_before(hidden_states), **kwargs)
        mid = hidden_states + attn_out
        return self.ista(self.layernorm_after(mid)), mid


class CrateEncoder(nn.Module):
    """The stack of L blocks (``encoder.layer.<i>``, the weight names of every saved CRATE checkpoint)."""

    def __init__(self, config: CrateConfig):
        super().__init__()
        self.config = config
        self.layer = nn.ModuleList([CrateLayer(config) for _ in range(config.num_hidden_layers)])
        self.gradient_checkpointing = False

    def forward(self, hidden_states: torch.Tensor, **kwargs: Unpack[CrateKwargs]) -> torch.Tensor:
        for layer in self.layer:
            hidden_states, _ = layer(hidden_states, **kwargs)
        return hidden_states


try:  # hf-tdiag's model card on save_pretrained / push_to_hub (hf_tdiag/_hub_card.py), in the package only
    if not __name__.startswith("hf_tdiag."):
        raise ImportError(f"{__name__} is a copy loaded as remote code")
    from hf_tdiag._hub_card import HubCardMixin
except ImportError:  # a copy loaded with trust_remote_code: transformers' own save_pretrained / push_to_hub

    class HubCardMixin:
        pass


class CratePreTrainedModel(HubCardMixin, PreTrainedModel):
    config: CrateConfig
    config_class = CrateConfig
    base_model_prefix = "crate"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["CrateEmbeddings", "CrateLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True  # torch.compile(fullgraph=True) and torch.export: tests/test_model_common.py
    # recorded by forward hooks (``capture_outputs``): hidden_states = Z^0 (first block's input), then each block's
    # output Z^l; mid_hidden_states = each block's Z^{l-1/2}; attentions = each MSSA's probabilities (eager path)
    _can_record_outputs = {
        "hidden_states": OutputRecorder(CrateLayer, index=0),
        "mid_hidden_states": OutputRecorder(CrateLayer, index=1),
        "attentions": OutputRecorder(CrateMSSA, index=1),
    }

    def _init_weights(self, module):
        """Linear/LayerNorm as Transformers does; trunc-normal CLS/positions; Kaiming-uniform dictionary as the official code."""
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, CrateEmbeddings):
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
            init.trunc_normal_(module.cls_token, mean=0.0, std=std)
        elif isinstance(module, CrateISTA):
            init.kaiming_uniform_(module.weight)
        elif isinstance(module, CrateMSSA) and module.variant == "crate-fix":
            # fixed random output matrix, scaled so that it roughly preserves the norm of the concatenated heads
            init.normal_(module.fixed_output, mean=0.0, std=(module.num_heads * module.head_dim) ** -0.5)


class CrateModel(CratePreTrainedModel):
    """Bare CRATE encoder returning token states ``Z^L`` and the pooled token.

    ``output_hidden_states=True`` returns ``Z^0 ... Z^L``, ``output_mid_hidden_states=True`` the mid states
    ``Z^{l-1/2}``, ``output_attentions=True`` the attention probabilities (computed on the eager path for that call).
    """

    def __init__(self, config: CrateConfig):
        super().__init__(config)
        self.config = config
        self.embeddings = CrateEmbeddings(config)
        self.encoder = CrateEncoder(config)
        self.post_init()

    def get_input_embeddings(self) -> CratePatchEmbeddings:
        return self.embeddings.patch_embeddings

    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        interpolate_pos_encoding: bool = False,
        **kwargs: Unpack[CrateKwargs],
    ) -> CrateModelOutput:
        if pixel_values is None:
            raise ValueError("CrateModel.forward: pixel_values is required")
        if not isinstance(pixel_values, torch.Tensor):
            raise TypeError(f"pixel_values must be a torch.Tensor, got {type(pixel_values).__name__}")
        expected_dtype = self.embeddings.patch_embeddings.projection.weight.dtype
        if pixel_values.dtype != expected_dtype:
            pixel_values = pixel_values.to(expected_dtype)
        hidden_states = self.embeddings(pixel_values, interpolate_pos_encoding=bool(interpolate_pos_encoding))
        hidden_states = self.encoder(hidden_states, **kwargs)
        pooled = hidden_states[:, 0] if self.config.pooling == "cls" else hidden_states.mean(dim=1)
        return CrateModelOutput(last_hidden_state=hidden_states, pooler_output=pooled)


class CrateForImageClassification(CratePreTrainedModel):
    """CRATE encoder with the official head: LayerNorm + Linear on the CLS token (or the token mean)."""

    def __init__(self, config: CrateConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.crate = CrateModel(config)
        self.classifier_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        interpolate_pos_encoding: bool = False,
        **kwargs: Unpack[CrateKwargs],
    ) -> CrateImageClassifierOutput:
        outputs: CrateModelOutput = self.crate(
            pixel_values, interpolate_pos_encoding=interpolate_pos_encoding, **kwargs
        )
        logits = self.classifier(self.classifier_norm(outputs.pooler_output))
        loss = None
        if labels is not None:
            loss = self.loss_function(labels, logits, self.config, **kwargs)
        return CrateImageClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            mid_hidden_states=outputs.mid_hidden_states,
        )


__all__ = [
    "CrateModelOutput",
    "CrateImageClassifierOutput",
    "CratePreTrainedModel",
    "CrateModel",
    "CrateForImageClassification",
]
