"""Decoder LLMs: the tensor-name layout of a decoder's blocks, read from a model or streamed from a checkpoint.

The decoder family adapters (:mod:`hf_tdiag.probes.families.gpt2`, :mod:`hf_tdiag.probes.families.llama`) find
the blocks and build a :class:`DecoderLayout` — per block, role (:data:`hf_tdiag.probes.describe.ROLES`) →
:class:`TensorRef` — which :func:`hf_tdiag.probes.describe.describe` returns as ``Description.decoder``. This
module holds the layout, the helpers the decoder adapters share, and :func:`model_getter`.

**Grouped-query attention.** Query head ``h`` reads K/V head ``g(h) = h // (H / H_kv)`` — what
Transformers' ``repeat_kv`` does: K/V head ``g`` serves query heads ``g·H/H_kv … (g+1)·H/H_kv − 1``.
:meth:`DecoderLayout.kv_head` and :meth:`DecoderLayout.query_heads` make this explicit, and
:meth:`DecoderLayout.head` returns one query head's ``W_Q``, the shared ``W_K`` / ``W_V`` rows and its
columns of ``W_O``.

A layout names tensors, it does not hold them: every accessor takes ``get(name) -> tensor`` (the model's
parameters, or one safetensors shard's tensors when streaming a checkpoint), so the same adapter serves
an instantiated model and a checkpoint read layer by layer. Weights come back in PyTorch ``(out, in)``
layout as views (a Conv1D's ``(in, out)`` weight transposed, a fused block sliced); no dtype or device
change. This module does no math.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from .._validation import integer

__all__ = [
    "TensorRef",
    "DecoderLayout",
    "DecoderHead",
    "decoder_description",
    "heads_layout",
    "model_getter",
    "not_a_decoder",
    "text_config",
    "DECODER_EXPECTED",
]

DECODER_EXPECTED = (
    "a decoder whose blocks have either a fused Conv1D 'attn.c_attn' with 'mlp.c_fc'/'mlp.c_proj' (GPT-2 family) or "
    "nn.Linear 'self_attn.q_proj/k_proj/v_proj/o_proj' with 'mlp.gate_proj/up_proj/down_proj' or "
    "'mlp.up_proj/down_proj' (Llama, Mistral, Qwen, Gemma family)"
)

ATTENTION_ROLES = ("query", "key", "value", "attn_output")
GATED_ROLES = ("ffn_gate", "ffn_in", "ffn_out")
PLAIN_ROLES = ("ffn_in", "ffn_out")


@dataclass(frozen=True)
class TensorRef:
    """Where one role's weight is: parameter ``name``; Conv1D-style ``(in, out)`` storage when ``transpose``;
    ``rows`` = the slice of the ``(out, in)`` rows that belong to this role (fused projections)."""

    name: str
    transpose: bool = False
    rows: tuple[int, int] | None = None
    bias: str | None = None

    def read(self, get: Callable[[str], torch.Tensor]) -> torch.Tensor:
        """The ``(out, in)`` weight (a view) from ``get``."""
        w = get(self.name)
        w = w.mT if self.transpose else w
        return w[self.rows[0] : self.rows[1]] if self.rows else w

    def read_bias(self, get: Callable[[str], torch.Tensor]) -> torch.Tensor | None:
        if self.bias is None:
            return None
        b = get(self.bias)
        return b[self.rows[0] : self.rows[1]] if self.rows else b


@dataclass
class DecoderHead:
    """One query head ``h`` of one block: ``W_Q (p, d)``, its shared K/V head ``kv_head`` (``W_K, W_V (p, d)``)
    and its columns of the output projection ``W_O (d, p)`` (``attn_output = Σ_h W_O,h · head_h``)."""

    layer: int
    head: int
    kv_head: int
    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor
    b_Q: torch.Tensor | None = None
    b_K: torch.Tensor | None = None
    b_V: torch.Tensor | None = None


@dataclass
class DecoderLayout:
    """What the diagnostics need to know about a decoder, with tensor names relative to the model it was read from."""

    family: str  # "gpt2" | "llama"
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    gated: bool
    activation: str
    norm: str  # "layernorm" | "rmsnorm"
    rotary: bool
    qk_norm: bool  # per-head RMSNorm on q and k (Qwen3, Gemma3)
    tied_embeddings: bool
    layers_path: str  # e.g. "model.layers" or "transformer.h"
    refs: list[dict[str, TensorRef]] = field(default_factory=list)

    @property
    def causal(self) -> bool:
        return True

    @property
    def ffn_roles(self) -> tuple[str, ...]:
        return GATED_ROLES if self.gated else PLAIN_ROLES

    @property
    def group_size(self) -> int:
        """Query heads per K/V head, ``H / H_kv``."""
        return self.num_heads // self.num_kv_heads

    def kv_head(self, head: int) -> int:
        """The K/V head query head ``head`` reads: ``head // (H / H_kv)``."""
        integer(head, "head", low=0, high=self.num_heads)
        return head // self.group_size

    def query_heads(self, kv_head: int) -> list[int]:
        """The query heads that share K/V head ``kv_head``."""
        integer(kv_head, "kv_head", low=0, high=self.num_kv_heads)
        return list(range(kv_head * self.group_size, (kv_head + 1) * self.group_size))

    def tensor_names(self, layer: int) -> list[str]:
        """Every tensor block ``layer``'s weights are read from (each once)."""
        integer(layer, "layer", low=0, high=self.num_layers)
        names = []
        for ref in self.refs[layer].values():
            for n in (ref.name, ref.bias):
                if n is not None and n not in names:
                    names.append(n)
        return names

    def weight(self, layer: int, role: str, get: Callable[[str], torch.Tensor]) -> torch.Tensor:
        """Block ``layer``'s ``(out, in)`` weight of ``role`` (query ``(H·p, d)``, key/value ``(H_kv·p, d)``,
        attn_output ``(d, H·p)``, ffn_gate/ffn_in ``(I, d)``, ffn_out ``(d, I)``)."""
        integer(layer, "layer", low=0, high=self.num_layers)
        if role not in self.refs[layer]:
            raise ValueError(f"role: expected one of {sorted(self.refs[layer])}, got {role!r}")
        return self.refs[layer][role].read(get)

    def bias(self, layer: int, role: str, get: Callable[[str], torch.Tensor]) -> torch.Tensor | None:
        """The bias of ``role`` in block ``layer`` (None when it has none)."""
        integer(layer, "layer", low=0, high=self.num_layers)
        return self.refs[layer][role].read_bias(get)

    def heads(
        self, layer: int, role: str, get: Callable[[str], torch.Tensor], *, by_query_head: bool = False
    ) -> torch.Tensor:
        """Per-head rows ``(K, p, d)``: W_Q,h (K = H), W_K,g / W_V,g (K = H_kv, or H with ``by_query_head``: row h is
        query head h's shared K/V head g(h)) or the rows of ``(W_O)ᵀ`` that belong to query head h (role attn_output)."""
        w = self.weight(layer, role, get)
        p, d = self.head_dim, self.hidden_size
        if role == "attn_output":
            return w.mT.reshape(self.num_heads, p, d)
        if role not in ("query", "key", "value"):
            raise ValueError(f"role: expected 'query', 'key', 'value' or 'attn_output', got {role!r}")
        per = w.reshape(-1, p, d)
        if by_query_head and role != "query":
            index = torch.tensor([self.kv_head(h) for h in range(self.num_heads)], device=per.device)
            per = per.index_select(0, index)
        return per

    def head(self, layer: int, head: int, get: Callable[[str], torch.Tensor]) -> DecoderHead:
        """Query head ``head`` of block ``layer`` with its shared K/V head (see :class:`DecoderHead`)."""
        integer(layer, "layer", low=0, high=self.num_layers)
        g = self.kv_head(head)
        p = self.head_dim
        q_rows, kv_rows = slice(head * p, (head + 1) * p), slice(g * p, (g + 1) * p)

        def bias(role, rows):
            b = self.bias(layer, role, get)
            return None if b is None else b[rows]

        return DecoderHead(
            layer=layer,
            head=head,
            kv_head=g,
            W_Q=self.weight(layer, "query", get)[q_rows],
            W_K=self.weight(layer, "key", get)[kv_rows],
            W_V=self.weight(layer, "value", get)[kv_rows],
            W_O=self.weight(layer, "attn_output", get)[:, q_rows],
            b_Q=bias("query", q_rows),
            b_K=bias("key", kv_rows),
            b_V=bias("value", kv_rows),
        )

    def layer_bytes(self, layer: int, get_nbytes: Callable[[str], int]) -> int:
        """Bytes of block ``layer``'s weight tensors as stored (``get_nbytes(name)`` per tensor)."""
        return sum(get_nbytes(n) for n in self.tensor_names(layer))

    def describe(self) -> dict:
        """The layout as a JSON-ready dict (no tensors)."""
        return {
            "family": self.family,
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "gated": self.gated,
            "activation": self.activation,
            "norm": self.norm,
            "rotary": self.rotary,
            "qk_norm": self.qk_norm,
            "tied_embeddings": self.tied_embeddings,
            "layers_path": self.layers_path,
            "kv_head_of_query_head": [self.kv_head(h) for h in range(self.num_heads)],
        }


def not_a_decoder(model: nn.Module, model_type) -> ValueError:
    """The error for a causal model no decoder adapter reads (or a model that is not a decoder at all)."""
    return ValueError(
        f"model: {type(model).__name__} (model_type {model_type!r}) is not a supported decoder; expected "
        f"{DECODER_EXPECTED}. Fused q/k/v ('qkv_proj', 'query_key_value'), mixture-of-experts MLPs and "
        "cross-attention decoders are not supported"
    )


def config_value(config, *names):
    """The first of ``config``'s attributes ``names`` that is set (None when none is)."""
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return None


def text_config(model: nn.Module):
    """The language model's config: ``config.get_text_config()`` (a multimodal model's text part) or ``config``."""
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"model: expected a Transformers model with a .config, got {type(model).__name__}")
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def heads_layout(config, q_out: int, k_out: int, hidden: int, where: str) -> tuple[int, int, int]:
    """``(H, H_kv, p)`` from the config's head count and the query / key projection widths, checked."""
    H = config_value(config, "num_attention_heads", "n_head")
    if not isinstance(H, int) or H < 1:
        raise ValueError(f"model: config has no number of attention heads (num_attention_heads / n_head); {where}")
    p = config_value(config, "head_dim")
    p = p if isinstance(p, int) and p > 0 else hidden // H
    if q_out != H * p:
        raise ValueError(f"model: {where} query projection has {q_out} outputs, expected {H} heads x {p} = {H * p}")
    if k_out % p:
        raise ValueError(f"model: {where} key projection has {k_out} outputs, not a multiple of head_dim {p}")
    H_kv = k_out // p
    cfg_kv = config_value(config, "num_key_value_heads")
    if (isinstance(cfg_kv, int) and cfg_kv != H_kv) or H % H_kv:
        raise ValueError(
            f"model: {where} has {H_kv} key/value heads (config.num_key_value_heads = {cfg_kv}) for {H} query heads; "
            "expected a divisor of the number of query heads"
        )
    return H, H_kv, p


def one_block_list(model: nn.Module, lists: list) -> tuple[str, nn.ModuleList] | None:
    """The one decoder block list among ``lists`` (None when empty; a ValueError when there are several)."""
    if len(lists) > 1:
        raise ValueError(
            f"model: found several decoder block lists {[name for name, _ in lists]} in {type(model).__name__}; "
            "pass the decoder sub-model itself"
        )
    return lists[0] if lists else None


def check_width(config, d: int, path: str) -> None:
    """The config's hidden size, when it has one, is the block width ``d`` read from the weights."""
    hidden = config_value(config, "hidden_size", "n_embd")
    if isinstance(hidden, int) and hidden != d:
        raise ValueError(f"model: config hidden size {hidden} differs from the block width {d} read from {path}.0")


def decoder_description(model: nn.Module, layout: DecoderLayout, handles: list, final_norms: tuple[str, ...]):
    """The :class:`~hf_tdiag.probes.describe.Description` of a decoder from its layout and block handles;
    ``final_norms``: the names the family gives the base model's norm after the blocks."""
    from .describe import Description

    base = getattr(model, "base_model", model)
    norms = [getattr(base, name, None) for name in final_norms]
    norms = [m for m in norms if isinstance(m, nn.Module) and getattr(m, "weight", None) is not None]
    return Description(
        family=layout.family,
        model_type=layout.model_type,
        hidden_size=layout.hidden_size,
        num_layers=layout.num_layers,
        num_heads=layout.num_heads,
        head_dim=layout.head_dim,
        pre_norm=True,
        layers=handles,
        encoder_layers=model.get_submodule(layout.layers_path),
        base_model=base,
        layers_path=layout.layers_path,
        projection_layout="fused" if layout.family == "gpt2" else "separate",
        attention="causal",
        rotary=layout.rotary,
        num_kv_heads=layout.num_kv_heads,
        decoder=layout,
        final_norm=norms[0] if norms else None,
    )


def model_getter(model: nn.Module) -> Callable[[str], torch.Tensor]:
    """``get(name)`` over ``model``'s parameters, detached (what a :class:`DecoderLayout` reads from). A parameter an
    Accelerate hook has offloaded (on ``meta`` between forward passes) is read from the offload store on each call,
    so a job holds only the tensors it asked for (:mod:`hf_tdiag.probes.offload`)."""
    from .offload import offload_index

    params: Mapping[str, torch.Tensor] = dict(model.named_parameters())
    offloaded = offload_index(model)

    def get(name: str) -> torch.Tensor:
        try:
            param = params[name]
        except KeyError:
            raise ValueError(f"model: {type(model).__name__} has no parameter {name!r}") from None
        if param.device.type == "meta" and name in offloaded:
            return offloaded[name].value().detach()
        return param.detach()

    return get
