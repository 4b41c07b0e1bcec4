"""CRATE-α (Yang et al. 2024, "Scaling White-Box Transformers for Vision") as a Transformers model.

One block maps ``z`` to ``z⁺`` (the authors' ``torch_inference/model/crate_alpha.py``)::

    z_half = z + MSSA(LN1(z))                         # MSSA: q = k = v = U_k^T x, output matrix without bias
    x      = LN2(z_half)
    a1     = ReLU(eta * D^T x - eta * lambda)          # one ISTA step from the code 0
    a2     = ReLU(a1 - eta * D^T (D a1 - x) - eta * lambda)
    z_plus = z_half + D1 a2                            # decoupled decoder D1, with a residual

``D`` and ``D1`` are ``(d, r·d)`` (overcomplete, ``r = overcomplete_ratio``), stored in that layout as the
authors store them. The patch embedding is a convolution with bias; a CLS token and a learned position
embedding follow; the head is LayerNorm + Linear on the CLS token.

This file imports only torch, transformers and its sibling ``configuration_crate_alpha`` so that
``save_pretrained`` can ship it for ``trust_remote_code`` loading.
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
from transformers.utils import ModelOutput, TransformersKwargs
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_crate_alpha import CrateAlphaConfig, alpha_size_pair


class CrateAlphaKwargs(TransformersKwargs, total=False):
    """The keyword arguments of the forward passes: Transformers' own, and the family's recorded outputs.

    Attributes:
        output_mid_hidden_states: each block's mid state ``Z^{l-1/2}`` (after attention, before the sparse-coding step).
    """

    output_mid_hidden_states: bool | None


@dataclass
class CrateAlphaModelOutput(ModelOutput):
    """Output of :class:`CrateAlphaModel`.

    Args:
        last_hidden_state: ``(B, N, d)`` output of the last block (no final norm in the encoder).
        pooler_output: ``(B, d)`` CLS token (``pooling="cls"``) or the token mean.
        hidden_states: ``L+1`` tensors: the embeddings output, then each block's output ``z⁺``.
        mid_hidden_states: ``L`` tensors: each block's ``z½ = z + MSSA(LN1(z))``.
        attentions: ``L`` tensors ``(B, K, N, N)`` of attention probabilities (eager path only).
    """

    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    mid_hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class CrateAlphaImageClassifierOutput(ImageClassifierOutput):
    """:class:`~transformers.modeling_outputs.ImageClassifierOutput` plus the mid-block states ``z½``."""

    mid_hidden_states: tuple[torch.Tensor, ...] | None = None


class CrateAlphaEmbeddings(nn.Module):
    """Convolutional patch embedding (kernel = stride = patch, with bias), CLS token, learned positions."""

    def __init__(self, config: CrateAlphaConfig):
        super().__init__()
        self.image_size = alpha_size_pair(config.image_size, "image_size")
        self.patch_size = alpha_size_pair(config.patch_size, "patch_size")
        self.num_channels = config.num_channels
        self.grid_size = (self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1])
        num_patches = self.grid_size[0] * self.grid_size[1]
        self.projection = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=self.patch_size, stride=self.patch_size, bias=True
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.position_embeddings = nn.Parameter(torch.zeros(1, num_patches + 1, config.hidden_size))
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def _check(self, pixel_values: torch.Tensor) -> None:
        if pixel_values.ndim != 4:
            raise ValueError(
                f"pixel_values must have shape (batch, channels, height, width), got {tuple(pixel_values.shape)}"
            )
        if pixel_values.shape[1] != self.num_channels:
            raise ValueError(
                f"pixel_values has {pixel_values.shape[1]} channels but the model was configured with "
                f"num_channels={self.num_channels}"
            )
        if tuple(pixel_values.shape[-2:]) != self.image_size:
            raise ValueError(
                f"Input image size ({pixel_values.shape[-2]}x{pixel_values.shape[-1]}) doesn't match the model "
                f"({self.image_size[0]}x{self.image_size[1]}); resize the images (the image processor does)."
            )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        self._check(pixel_values)
        tokens = self.projection(pixel_values).flatten(2).transpose(1, 2)  # (B, d, h, w) -> (B, h*w, d)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        tokens = torch.cat((cls, tokens), dim=1) + self.position_embeddings
        return self.dropout(tokens) if self.dropout.p > 0 else tokens


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[CrateAlphaKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q kᵀ · scaling + mask) v``; returns ``(B, N, K, p)`` and the ``(B, K, N, N)`` probabilities."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    dropped = F.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(dropped, value).transpose(1, 2).contiguous(), probs


class CrateAlphaMSSA(nn.Module):
    """Multi-head subspace self-attention, ``q = k = v = U_kᵀ x``, output matrix ``W`` without bias.

    As in the authors' code the output matrix is the identity when ``K = 1`` and ``p = d``.
    """

    def __init__(self, config: CrateAlphaConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        self.is_causal = False
        inner = self.num_heads * self.head_dim
        self.qkv = nn.Linear(config.hidden_size, inner, bias=False)
        project = not (self.num_heads == 1 and self.head_dim == config.hidden_size)
        self.out_proj = nn.Linear(inner, config.hidden_size, bias=False) if project else None
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def subspaces(self) -> torch.Tensor:
        """``U`` of shape ``(K, d, p)``: head ``k``'s columns are rows ``k·p … (k+1)·p − 1`` of ``qkv.weight``."""
        return self.qkv.weight.view(self.num_heads, self.head_dim, -1).transpose(1, 2)

    def forward(
        self, hidden_states: torch.Tensor, **kwargs: Unpack[CrateAlphaKwargs]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, tokens, _ = hidden_states.shape
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
        out = heads.reshape(batch, tokens, self.num_heads * self.head_dim)
        if self.out_proj is not None:
            out = self.out_proj(out)
        return (self.dropout(out) if self.dropout.p > 0 else out), probs


class CrateAlphaSparseCoding(nn.Module):
    """Two ISTA steps on the overcomplete dictionary ``D`` from the code 0, decoded by ``D1``: returns ``D1 a2``."""

    def __init__(self, config: CrateAlphaConfig):
        super().__init__()
        self.D = nn.Parameter(torch.zeros(config.hidden_size, config.dictionary_size))
        self.D1 = nn.Parameter(torch.zeros(config.hidden_size, config.dictionary_size))
        self.step_size = float(config.ista_step_size)
        self.lambd = float(config.ista_lambda)

    def codes(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sparse codes ``(a1, a2)`` of ``x`` (..., d), each (..., r·d)."""
        eta, shrink = self.step_size, self.step_size * self.lambd
        a1 = F.relu(eta * (x @ self.D) - shrink)  # Dᵀx in row form
        residual = a1 @ self.D.t() - x  # D a1 − x
        a2 = F.relu(a1 - eta * (residual @ self.D) - shrink)
        return a1, a2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.codes(x)[1] @ self.D1.t()


class CrateAlphaLayer(GradientCheckpointingLayer):
    """One block: ``z½ = z + MSSA(LN1 z)``, ``z⁺ = z½ + D1·code(LN2 z½)``; returns ``(z⁺, z½)``."""

    def __init__(self, config: CrateAlphaConfig):
        super().__init__()
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = CrateAlphaMSSA(config)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.sparse_coding = CrateAlphaSparseCoding(config)

    def forward(
        self, hidden_states: torch.Tensor, **kwargs: Unpack[CrateAlphaKwargs]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        attn_out, _ = self.attention(self.layernorm_before(hidden_states), **kwargs)
        mid = hidden_states + attn_out
        return mid + self.sparse_coding(self.layernorm_after(mid)), mid


class CrateAlphaEncoder(nn.Module):
    """The stack of blocks (``encoder.layer.<i>``)."""

    def __init__(self, config: CrateAlphaConfig):
        super().__init__()
        self.config = config
        self.layer = nn.ModuleList([CrateAlphaLayer(config) for _ in range(config.num_hidden_layers)])
        self.gradient_checkpointing = False

    def forward(self, hidden_states: torch.Tensor, **kwargs: Unpack[CrateAlphaKwargs]) -> torch.Tensor:
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


class CrateAlphaPreTrainedModel(HubCardMixin, PreTrainedModel):
    config: CrateAlphaConfig
    config_class = CrateAlphaConfig
    base_model_prefix = "crate_alpha"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["CrateAlphaEmbeddings", "CrateAlphaLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True  # torch.compile(fullgraph=True) and torch.export: tests/test_model_common.py
    _can_record_outputs = {
        "hidden_states": OutputRecorder(CrateAlphaLayer, index=0),
        "mid_hidden_states": OutputRecorder(CrateAlphaLayer, index=1),
        "attentions": OutputRecorder(CrateAlphaMSSA, index=1),
    }

    def _init_weights(self, module):
        """Linear/LayerNorm as Transformers does; normal CLS/positions; Kaiming-uniform dictionaries (authors' code)."""
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, CrateAlphaEmbeddings):
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
            init.trunc_normal_(module.cls_token, mean=0.0, std=std)
        elif isinstance(module, CrateAlphaSparseCoding):
            init.kaiming_uniform_(module.D)
            init.kaiming_uniform_(module.D1)


class CrateAlphaModel(CrateAlphaPreTrainedModel):
    """Bare CRATE-α encoder returning the token states and the pooled token.

    ``output_hidden_states=True`` returns the block inputs/outputs, ``output_mid_hidden_states=True`` the states
    ``z½`` after each attention step, ``output_attentions=True`` the attention probabilities (eager path).
    """

    def __init__(self, config: CrateAlphaConfig):
        super().__init__(config)
        self.config = config
        self.embeddings = CrateAlphaEmbeddings(config)
        self.encoder = CrateAlphaEncoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.projection

    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self, pixel_values: torch.Tensor | None = None, **kwargs: Unpack[CrateAlphaKwargs]
    ) -> CrateAlphaModelOutput:
        if pixel_values is None:
            raise ValueError("CrateAlphaModel.forward: pixel_values is required")
        if not isinstance(pixel_values, torch.Tensor):
            raise TypeError(f"pixel_values must be a torch.Tensor, got {type(pixel_values).__name__}")
        pixel_values = pixel_values.to(self.embeddings.projection.weight.dtype)
        hidden_states = self.encoder(self.embeddings(pixel_values), **kwargs)
        pooled = hidden_states[:, 0] if self.config.pooling == "cls" else hidden_states.mean(dim=1)
        return CrateAlphaModelOutput(last_hidden_state=hidden_states, pooler_output=pooled)


class CrateAlphaForImageClassification(CrateAlphaPreTrainedModel):
    """CRATE-α encoder with the authors' head: LayerNorm + Linear on the CLS token (or the token mean)."""

    def __init__(self, config: CrateAlphaConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.crate_alpha = CrateAlphaModel(config)
        self.classifier_norm = nn.LayerNorm(config.hidden_size, eps=config.classifier_layer_norm_eps)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[CrateAlphaKwargs],
    ) -> CrateAlphaImageClassifierOutput:
        outputs: CrateAlphaModelOutput = self.crate_alpha(pixel_values, **kwargs)
        logits = self.classifier(self.classifier_norm(outputs.pooler_output))
        loss = None
        if labels is not None:
            loss = self.loss_function(labels, logits, self.config, **kwargs)
        return CrateAlphaImageClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            mid_hidden_states=outputs.mid_hidden_states,
        )


__all__ = [
    "CrateAlphaModelOutput",
    "CrateAlphaImageClassifierOutput",
    "CrateAlphaPreTrainedModel",
    "CrateAlphaModel",
    "CrateAlphaForImageClassification",
]
