"""CRATE-MAE (Pai et al., ICLR 2024) as a Transformers model: masked autoencoding with white-box blocks.

As in the authors' code (CRATE repository, ``model/crate_ae/``)::

    encoder block   z½ = z + MSSA(LN1 z);   z⁺ = ReLU(x + η Dᵀ(x − D x) − ηλ),  x = LN2 z½      (CRATE, λ = 0.5)
    decoder block   y = D·LN1(x);           x⁺ = y − MSSA(LN2 y)                                  (inverts it)

The patch embedding is a convolution with bias; positions are fixed 2-D sine-cosine features (MAE's). In
pre-training a random ``mask_ratio`` of the patches is replaced by a learned mask token and the *whole* sequence
runs through the encoder (the authors' ``forward_encoder``), then its final LayerNorm, the decoder, the decoder's
LayerNorm and a linear map to pixels; the loss is the mean squared error on the masked patches.

This file imports only torch, transformers and its sibling ``configuration_crate_mae`` so that ``save_pretrained``
can ship it for ``trust_remote_code`` loading.
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

from .configuration_crate_mae import CrateMAEConfig


class CrateMAEKwargs(TransformersKwargs, total=False):
    """The keyword arguments of the forward passes: Transformers' own, and the family's recorded outputs.

    Attributes:
        output_mid_hidden_states: each block's mid state ``Z^{l-1/2}`` (after attention, before the sparse-coding step).
    """

    output_mid_hidden_states: bool | None


@dataclass
class CrateMAEModelOutput(ModelOutput):
    """Output of :class:`CrateMAEModel`.

    Args:
        last_hidden_state: ``(B, N + 1, d)`` the last block's output after the final LayerNorm.
        pooler_output: ``(B, d)`` its CLS token.
        mask: ``(B, N)`` 1 where a patch was masked (replaced by the mask token), 0 where kept; ``None`` unmasked.
        hidden_states: the embeddings output, then each encoder block's output.
        mid_hidden_states: each encoder block's ``z½``.
        attentions: ``(B, K, N + 1, N + 1)`` per encoder block (eager path).
    """

    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    mid_hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class CrateMAEForPreTrainingOutput(ModelOutput):
    """``loss`` (masked-patch MSE), ``logits`` ``(B, N, p²·C)`` predicted patches, ``mask`` ``(B, N)``, the encoder's
    states and its attention probabilities ``(B, K, N + 1, N + 1)`` per block (``output_attentions=True``)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    mid_hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def sincos_position_embedding(dim: int, grid: int) -> torch.Tensor:
    """MAE's fixed 2-D sine-cosine positions ``(1, 1 + grid², dim)``: a zero row for CLS, then the patches row by
    row; the first half of each row encodes the column index, the second half the row index."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    rows, cols = torch.meshgrid(torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64),
                                indexing="ij")  # fmt: skip

    def one_axis(pos):
        angles = pos.reshape(-1, 1) * omega
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    patches = torch.cat([one_axis(cols), one_axis(rows)], dim=1)
    return torch.cat([torch.zeros(1, dim, dtype=torch.float64), patches]).float().unsqueeze(0)


class CrateMAEEmbeddings(nn.Module):
    """Convolutional patches, CLS token, mask token (``use_mask_token``), fixed sine-cosine positions.

    Without a mask token (the classifier's encoder, which never masks) a ``mask_token`` in a loaded state dict, the
    pre-trained model's, is dropped: the classifier loads a pre-training checkpoint and every parameter it holds
    takes part in its forward (DDP without ``find_unused_parameters``)."""

    def __init__(self, config: CrateMAEConfig, use_mask_token: bool = True):
        super().__init__()
        self.config = config
        self.projection = nn.Conv2d(config.num_channels, config.hidden_size, config.patch_size, config.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size)) if use_mask_token else None
        self.position_embeddings = nn.Parameter(
            torch.zeros(1, config.num_patches + 1, config.hidden_size), requires_grad=False
        )

    def random_mask(self, batch: int, length: int, device, noise: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, N)`` mask, 1 = masked: the ``N·mask_ratio`` patches of largest ``noise`` (uniform when None)."""
        if noise is None:
            noise = torch.rand(batch, length, device=device)
        keep = int(length * (1 - self.config.mask_ratio))
        ranks = torch.argsort(torch.argsort(noise, dim=1), dim=1)
        return (ranks >= keep).to(self.projection.weight.dtype)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs: Unpack[CrateMAEKwargs]):
        if self.mask_token is None:
            state_dict.pop(prefix + "mask_token", None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, pixel_values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        c, size = self.config.num_channels, self.config.image_size
        if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != (c, size, size):
            raise ValueError(
                f"pixel_values must have shape (batch, {c}, {size}, {size}), got {tuple(pixel_values.shape)}"
            )
        tokens = self.projection(pixel_values).flatten(2).transpose(1, 2)
        if mask is not None:
            if self.mask_token is None:
                raise ValueError("this CRATE-MAE encoder has no mask token (a classifier's); pass no mask")
            tokens = torch.where(mask.bool().unsqueeze(-1), self.mask_token.to(tokens.dtype), tokens)
        tokens = torch.cat((self.cls_token.expand(tokens.shape[0], -1, -1), tokens), dim=1)
        return tokens + self.position_embeddings


def eager_attention_forward(
    module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs: Unpack[CrateMAEKwargs]
):
    """``softmax(q kᵀ · scaling) v``; returns ``(B, N, K, p)`` and the ``(B, K, N, N)`` probabilities."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


class CrateMAEMSSA(nn.Module):
    """CRATE's MSSA (``q = k = v = U_kᵀ x``) with a learned output matrix and bias (identity when K = 1, p = d)."""

    def __init__(self, config: CrateMAEConfig, num_heads: int):
        super().__init__()
        self.config = config
        self.num_heads, self.head_dim = num_heads, config.hidden_size // num_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        self.qkv = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size) if num_heads > 1 else None

    def forward(
        self, hidden_states: torch.Tensor, **kwargs: Unpack[CrateMAEKwargs]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, tokens, _ = hidden_states.shape
        w = self.qkv(hidden_states).view(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)
        implementation = "eager" if kwargs.get("output_attentions") else self.config._attn_implementation
        interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        heads, probs = interface(self, w, w, w, None, dropout=0.0, scaling=self.scaling, is_causal=False)
        out = heads.reshape(batch, tokens, -1)
        return (self.out_proj(out) if self.out_proj is not None else out), probs


class CrateMAEISTA(nn.Module):
    """One ISTA step on a square dictionary: ``ReLU(x + η Dᵀ(x − D x) − ηλ)`` (``D`` = ``weight``)."""

    def __init__(self, config: CrateMAEConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(config.hidden_size, config.hidden_size))
        self.step_size, self.lambd = float(config.ista_step_size), float(config.ista_lambda)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x - F.linear(x, self.weight)
        return F.relu(x + self.step_size * F.linear(residual, self.weight.t()) - self.step_size * self.lambd)


class CrateMAEEncoderLayer(GradientCheckpointingLayer):
    """Encoder block: ``z½ = z + MSSA(LN1 z)``, ``z⁺ = ISTA(LN2 z½)``; returns ``(z⁺, z½)``."""

    def __init__(self, config: CrateMAEConfig):
        super().__init__()
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = CrateMAEMSSA(config, config.num_attention_heads)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ista = CrateMAEISTA(config)

    def forward(
        self, hidden_states: torch.Tensor, **kwargs: Unpack[CrateMAEKwargs]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mid = hidden_states + self.attention(self.layernorm_before(hidden_states), **kwargs)[0]
        return self.ista(self.layernorm_after(mid)), mid


class CrateMAEDecoderLayer(GradientCheckpointingLayer):
    """Decoder block: ``y = D·LN1(x)``, ``x⁺ = y − MSSA(LN2 y)``."""

    def __init__(self, config: CrateMAEConfig):
        super().__init__()
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dictionary = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.dictionary.kaiming_dictionary = True  # Kaiming-uniform, as the authors (_init_weights)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = CrateMAEMSSA(config, config.decoder_num_attention_heads)

    def forward(self, hidden_states: torch.Tensor, **kwargs: Unpack[CrateMAEKwargs]) -> torch.Tensor:
        y = self.dictionary(self.layernorm_before(hidden_states))
        return y - self.attention(self.layernorm_after(y), **kwargs)[0]


try:  # hf-tdiag's model card on save_pretrained / push_to_hub (hf_tdiag/_hub_card.py), in the package only
    if not __name__.startswith("hf_tdiag."):
        raise ImportError(f"{__name__} is a copy loaded as remote code")
    from hf_tdiag._hub_card import HubCardMixin
except ImportError:  # a copy loaded with trust_remote_code: transformers' own save_pretrained / push_to_hub

    class HubCardMixin:
        pass


class CrateMAEPreTrainedModel(HubCardMixin, PreTrainedModel):
    config: CrateMAEConfig
    config_class = CrateMAEConfig
    base_model_prefix = "crate_mae"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["CrateMAEEmbeddings", "CrateMAEEncoderLayer", "CrateMAEDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True  # torch.compile(fullgraph=True) and torch.export: tests/test_model_common.py
    _can_record_outputs = {
        "hidden_states": OutputRecorder(CrateMAEEncoderLayer, index=0),
        "mid_hidden_states": OutputRecorder(CrateMAEEncoderLayer, index=1),
        "attentions": OutputRecorder(CrateMAEMSSA, index=1),
    }

    def _init_weights(self, module):
        """Xavier-uniform Linear and patch weights (the patch projection at ``patch_embedding_gain``), normal
        CLS/mask tokens (std ``initializer_range``, MAE's 0.02), sine-cosine positions, Kaiming dictionaries (the
        authors' initialization at gain 1)."""
        super()._init_weights(module)
        if isinstance(module, nn.Linear) and getattr(module, "kaiming_dictionary", False):
            # on the Linear itself: transformers skips _init_weights for a remote-code module without parameters of
            # its own (the decoder layer), so a branch on the layer never ran and the dictionary was Xavier-uniform
            init.kaiming_uniform_(module.weight)
        elif isinstance(module, nn.Linear) and module.weight.ndim == 2:
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        if isinstance(module, CrateMAEEmbeddings):
            grid = self.config.image_size // self.config.patch_size
            init.copy_(module.position_embeddings, sincos_position_embedding(self.config.hidden_size, grid))
            init.normal_(module.cls_token, std=self.config.initializer_range)
            if module.mask_token is not None:
                init.normal_(module.mask_token, std=self.config.initializer_range)
            init.xavier_uniform_(
                module.projection.weight.view(module.projection.weight.shape[0], -1),
                gain=self.config.patch_embedding_gain,
            )
            init.zeros_(module.projection.bias)
        elif isinstance(module, CrateMAEISTA):
            init.kaiming_uniform_(module.weight)


class CrateMAEModel(CrateMAEPreTrainedModel):
    """The CRATE-MAE encoder, usable alone: unmasked by default; ``mask=`` or ``apply_mask=True`` masks patches
    (with ``use_mask_token=False``, the classifier's encoder, it has no mask token and cannot mask)."""

    def __init__(self, config: CrateMAEConfig, use_mask_token: bool = True):
        super().__init__(config)
        self.config = config
        self.embeddings = CrateMAEEmbeddings(config, use_mask_token=use_mask_token)
        self.encoder = nn.ModuleList([CrateMAEEncoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.final_layer_norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.projection

    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        apply_mask: bool = False,
        noise: torch.Tensor | None = None,
        **kwargs: Unpack[CrateMAEKwargs],
    ) -> CrateMAEModelOutput:
        if not isinstance(pixel_values, torch.Tensor):
            raise TypeError(f"pixel_values must be a torch.Tensor, got {type(pixel_values).__name__}")
        pixel_values = pixel_values.to(self.embeddings.projection.weight.dtype)
        if mask is None and (apply_mask or noise is not None):
            mask = self.embeddings.random_mask(
                pixel_values.shape[0], self.config.num_patches, pixel_values.device, noise
            )
        hidden_states = self.embeddings(pixel_values, mask)
        for layer in self.encoder:
            hidden_states, _ = layer(hidden_states, **kwargs)
        hidden_states = self.layernorm(hidden_states)
        return CrateMAEModelOutput(last_hidden_state=hidden_states, pooler_output=hidden_states[:, 0], mask=mask)


class CrateMAEDecoder(nn.Module):
    """Decoder blocks, LayerNorm and the linear map to ``p²·C`` pixels per patch."""

    def __init__(self, config: CrateMAEConfig):
        super().__init__()
        self.layer = nn.ModuleList([CrateMAEDecoderLayer(config) for _ in range(config.decoder_num_hidden_layers)])
        self.decoder_norm = nn.LayerNorm(config.hidden_size, eps=config.final_layer_norm_eps)
        self.decoder_pred = nn.Linear(config.hidden_size, config.patch_size**2 * config.num_channels)

    def forward(self, hidden_states: torch.Tensor, **kwargs: Unpack[CrateMAEKwargs]) -> torch.Tensor:
        for layer in self.layer:
            hidden_states = layer(hidden_states, **kwargs)
        return self.decoder_pred(self.decoder_norm(hidden_states))[:, 1:]


class CrateMAEForPreTraining(CrateMAEPreTrainedModel):
    """CRATE-MAE with its masked-reconstruction objective (the MSE on masked patches, as ``ViTMAEForPreTraining``)."""

    def __init__(self, config: CrateMAEConfig):
        super().__init__(config)
        self.crate_mae = CrateMAEModel(config)
        self.decoder = CrateMAEDecoder(config)
        self.post_init()

    def patchify(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W) -> (B, N, p·p·C)``, patches row by row, pixels row by row, channels last."""
        p, c = self.config.patch_size, self.config.num_channels
        b, _, h, w = pixel_values.shape
        x = pixel_values.reshape(b, c, h // p, p, w // p, p)
        return torch.einsum("nchpwq->nhwpqc", x).reshape(b, (h // p) * (w // p), p * p * c)

    def unpatchify(self, patches: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`patchify` for square images."""
        p, c = self.config.patch_size, self.config.num_channels
        g = self.config.image_size // p
        x = patches.reshape(patches.shape[0], g, g, p, p, c)
        return torch.einsum("nhwpqc->nchpwq", x).reshape(patches.shape[0], c, g * p, g * p)

    def forward_loss(self, pixel_values: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean over masked patches of the per-patch mean squared error (pixels normalized per patch if asked)."""
        target = self.patchify(pixel_values)
        if self.config.norm_pix_loss:
            mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
            target = (target - mean) / (var + 1.0e-6) ** 0.5
        loss = ((pred - target) ** 2).mean(dim=-1)
        return (loss * mask).sum() / mask.sum().clamp_min(1.0)

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
        **kwargs: Unpack[CrateMAEKwargs],
    ) -> CrateMAEForPreTrainingOutput:
        outputs: CrateMAEModelOutput = self.crate_mae(pixel_values, apply_mask=True, noise=noise, **kwargs)
        pred = self.decoder(outputs.last_hidden_state)
        loss = self.forward_loss(pixel_values.to(pred.dtype), pred, outputs.mask)
        return CrateMAEForPreTrainingOutput(
            loss=loss, logits=pred, mask=outputs.mask, hidden_states=outputs.hidden_states,
            mid_hidden_states=outputs.mid_hidden_states, attentions=outputs.attentions,
        )  # fmt: skip


class CrateMAEForImageClassification(CrateMAEPreTrainedModel):
    """The CRATE-MAE encoder (unmasked, so without the mask token) with a linear head on its normalized CLS token, for
    fine-tuning; it loads a pre-training checkpoint (its decoder and mask token are left out)."""

    # the pre-trained encoder's mask token: in every pre-training checkpoint, never used by the classifier
    _keys_to_ignore_on_load_unexpected = [r"(^|\.)embeddings\.mask_token$"]

    def __init__(self, config: CrateMAEConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.crate_mae = CrateMAEModel(config, use_mask_token=False)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[CrateMAEKwargs],
    ) -> ImageClassifierOutput:
        outputs: CrateMAEModelOutput = self.crate_mae(pixel_values, **kwargs)
        logits = self.classifier(outputs.pooler_output)
        loss = self.loss_function(labels, logits, self.config, **kwargs) if labels is not None else None
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


__all__ = [
    "CrateMAEModelOutput",
    "CrateMAEForPreTrainingOutput",
    "CrateMAEPreTrainedModel",
    "CrateMAEModel",
    "CrateMAEForPreTraining",
    "CrateMAEForImageClassification",
    "sincos_position_embedding",
]
