"""One description of a model's transformer blocks, in one role vocabulary, for every supported family.

:func:`describe` returns a :class:`Description`: the block list, and for every block the modules that play each
role of :data:`ROLES` (per-head query/key/value projections, the attention output matrix, the FFN or ISTA
weights, the two norms), with the head layout (heads, K/V heads, head width), where the norms sit and what kind
of attention the block computes. Every diagnostic reads models through it.

Each family is one adapter (a module of :mod:`hf_tdiag.probes.families`) that calls :func:`register` with its
role table — role → the module names a block of that family uses for it — and a function that returns the
family's :class:`Description` of a model, or ``None`` when the model is not of that family. :data:`ROLE_TABLE`
is the union of those tables, the only place role names are mapped to module names. Adapters are tried in
``order``; the first that recognises the model describes it.

This module only locates modules; it does no math.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = [
    "ROLES",
    "NORM_ROLES",
    "LAYER_SCALES",
    "ROLE_TABLE",
    "Adapter",
    "BlockHandles",
    "Description",
    "adapters",
    "block_lists",
    "describe",
    "find_role",
    "register",
]

#: the role vocabulary: role -> what the module playing it computes (weights in PyTorch ``(out, in)`` layout)
ROLES: dict[str, str] = {
    "query": "query projection (H·p, d); rows h·p:(h+1)·p are head h's W_Q,h",
    "key": "key projection (H_kv·p, d); rows g·p:(g+1)·p are K/V head g's W_K,g",
    "value": "value projection (H_kv·p, d); rows g·p:(g+1)·p are K/V head g's W_V,g",
    "attn_output": "attention output matrix W_O (d, H·p); columns h·p:(h+1)·p belong to query head h",
    "ffn_gate": "gated MLP: the gate matrix (I, d) of down(act(gate x) ⊙ up x)",
    "ffn_in": "first FFN matrix (I, d) (a gated MLP's up projection)",
    "ffn_out": "second FFN matrix (d, I) (a gated MLP's down projection)",
    "ista": "CRATE's ISTA dictionary D (d, d), in place of the FFN",
    "sparse_dictionary": "CRATE-α's overcomplete dictionary D (d, r·d), the module's parameter D: its two ISTA steps "
    "a₁ = ReLU(ηDᵀx − ηλ), a₂ = ReLU(a₁ − ηDᵀ(Da₁ − x) − ηλ), in place of the FFN's first matrix",
    "sparse_decoder": "CRATE-α's decoding dictionary D₁ (d, r·d), the module's parameter D1: z⁺ = z½ + D₁a₂, in place "
    "of the FFN's second matrix",
    "attention_norm": "pre-norm blocks: the norm of the attention input (the pre-attention LayerNorm / RMSNorm)",
    "ffn_norm": "pre-norm blocks: the norm of the FFN / ISTA input",
    "attention_post_norm": "post-norm blocks: the norm of the attention sub-layer's residual sum LN(z + attn(z))",
    "ffn_post_norm": "post-norm blocks: the norm of the FFN sub-layer's residual sum (the block output)",
}
NORM_ROLES = ("attention_norm", "ffn_norm", "attention_post_norm", "ffn_post_norm")
#: residual branch -> the names (relative to one block) its per-channel layer scale γ (d,) goes by, in
#: ``z + γ ⊙ f(z)``: DINOv2's ``LayerScale`` modules, BEiT's / Data2Vec's ``λ`` parameters, ToST's ``γ``
LAYER_SCALES: dict[str, tuple[str, ...]] = {
    "attention": ("layer_scale1.lambda1", "lambda_1", "gamma1", "ls1.gamma"),
    "ffn": ("layer_scale2.lambda1", "lambda_2", "gamma2", "ls2.gamma"),
}
MATRIX_ROLES = tuple(r for r in ROLES if r not in NORM_ROLES)

#: family -> role -> module names (relative to one block) accepted for that role; filled by :func:`register`
ROLE_TABLE: dict[str, dict[str, tuple[str, ...]]] = {}

_ADAPTERS: dict[str, Adapter] = {}
_LOADED = False


@dataclass(frozen=True)
class Adapter:
    """One family adapter: ``tables`` (family -> role -> accepted names), ``describe(model) -> Description | None``
    (None: not this family; a ValueError naming what is wrong for a model of this family that cannot be read),
    ``expected`` (one sentence on what the adapter accepts, for error messages) and ``order`` (lower tried first;
    the generic encoder adapter, which accepts any block list named by its role table, is tried last)."""

    name: str
    tables: Mapping[str, Mapping[str, tuple[str, ...]]]
    describe: Callable[[nn.Module], Description | None]
    expected: str
    order: int = 50


def register(adapter: Adapter) -> Adapter:
    """Add ``adapter`` and its role tables (an adapter module calls this once, at import)."""
    for fam, table in adapter.tables.items():
        unknown = sorted(set(table) - set(ROLES))
        if unknown:
            raise ValueError(f"adapter {adapter.name!r}: roles {unknown} are not in ROLES {sorted(ROLES)}")
        owner = next((a.name for a in _ADAPTERS.values() if fam in a.tables and a.name != adapter.name), None)
        if owner is not None:
            raise ValueError(f"adapter {adapter.name!r}: family {fam!r} is already registered by {owner!r}")
    _ADAPTERS[adapter.name] = adapter
    for fam, table in adapter.tables.items():
        ROLE_TABLE[fam] = {role: tuple(names) for role, names in table.items()}
    return adapter


def adapters() -> list[Adapter]:
    """Every registered adapter in the order :func:`describe` tries them (loads :mod:`hf_tdiag.probes.families`)."""
    global _LOADED
    if not _LOADED:
        from . import families

        for info in pkgutil.iter_modules(families.__path__):
            importlib.import_module(f"{families.__name__}.{info.name}")
        _LOADED = True
    return sorted(_ADAPTERS.values(), key=lambda a: (a.order, a.name))


@dataclass
class BlockHandles:
    """The modules of one transformer block, by role (:data:`ROLES`); ``None`` where the block has no such module.

    ``query``/``key``/``value`` expose ``.weight (out, in)`` and ``.bias`` (CRATE: all three are the shared
    projection ``U``; GPT-2: views of the fused ``c_attn``). ``paths`` maps each role to its module's qualified
    name in the model.
    """

    index: int
    block: nn.Module
    path: str
    num_heads: int
    head_dim: int
    query: nn.Module
    key: nn.Module
    value: nn.Module
    attn_output: nn.Module | None = None
    ffn_gate: nn.Module | None = None
    ffn_in: nn.Module | None = None
    ffn_out: nn.Module | None = None
    ista: nn.Module | None = None
    sparse_dictionary: nn.Module | None = None  # CRATE-α: the sparse coder holding D (parameter ``.D``)
    sparse_decoder: nn.Module | None = None  # CRATE-α: the sparse coder holding D₁ (parameter ``.D1``)
    attention_norm: nn.Module | None = None
    ffn_norm: nn.Module | None = None
    attention_post_norm: nn.Module | None = None
    ffn_post_norm: nn.Module | None = None
    num_kv_heads: int | None = None  # K/V heads (grouped-query attention: fewer than num_heads); None = num_heads
    paths: dict[str, str] = field(default_factory=dict)

    def module(self, role: str) -> nn.Module | None:
        """The module playing ``role`` (a name of :data:`ROLES`)."""
        if role not in ROLES:
            raise ValueError(f"role: expected one of {sorted(ROLES)}, got {role!r}")
        return getattr(self, role)

    def projection_weight(self, source: str) -> torch.Tensor:
        """Weight ``(H*dh, d)`` of the ``query``, ``key`` or ``value`` projection."""
        if source not in ("query", "key", "value"):
            raise ValueError(f"source: expected 'query', 'key' or 'value', got {source!r}")
        return getattr(self, source).weight

    def sparse_coding_weights(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """CRATE-α: ``(D, D₁)``, each ``(d, r·d)`` — the parameters ``.D`` of the ``sparse_dictionary`` module and
        ``.D1`` of the ``sparse_decoder`` module; None for a block without them."""
        if self.sparse_dictionary is None or self.sparse_decoder is None:
            return None
        return self.sparse_dictionary.D, self.sparse_decoder.D1

    def layer_scale(self, branch: str) -> torch.Tensor | None:
        """The layer scale γ (d,) multiplying the output of the block's ``branch`` (``"attention"`` or ``"ffn"``)
        residual branch, ``z + γ ⊙ f(z)`` (a parameter named as in :data:`LAYER_SCALES`); None where there is none."""
        if branch not in LAYER_SCALES:
            raise ValueError(f"branch: expected one of {sorted(LAYER_SCALES)}, got {branch!r}")
        params = dict(self.block.named_parameters())
        for name in LAYER_SCALES[branch]:
            if name in params and params[name].ndim == 1:
                return params[name]
        return None

    def output_weight(self) -> torch.Tensor | None:
        """Attention output matrix ``(d, H*dh)`` (CRATE: the variant's effective output matrix)."""
        if self.attn_output is None:
            return None
        if hasattr(self.attn_output, "output_matrix"):
            return self.attn_output.output_matrix()
        return self.attn_output.weight


@dataclass
class Description:
    """What a diagnostic needs to know about a model's transformer blocks.

    ``family`` is the role-table key of the adapter's family (``"crate"``, ``"vit"``, ``"bert"``, ``"gpt2"``,
    ``"llama"``, …); ``projection_layout`` how the per-head projections are stored (``"shared"``: one ``U`` serves
    as query, key and value; ``"separate"``: three matrices; ``"fused"``: one matrix whose row blocks are q, k, v);
    ``attention`` the attention kind (``"mssa"``: CRATE's subspace self-attention, ``"softmax"``: bidirectional,
    ``"causal"``: causal softmax); ``decoder`` the decoders' tensor-name layout (for streaming), None otherwise;
    ``final_norm`` a decoder's norm after its last block.
    """

    family: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    pre_norm: bool
    layers: list[BlockHandles]
    encoder_layers: nn.ModuleList
    base_model: nn.Module
    layers_path: str = ""
    projection_layout: str = "separate"
    attention: str = "softmax"
    rotary: bool = False
    num_kv_heads: int | None = None  # grouped-query attention: K/V heads (None = num_heads)
    decoder: object = None  # :class:`hf_tdiag.probes.decoders.DecoderLayout` of a decoder, None for encoders
    final_norm: nn.Module | None = None  # decoders: the norm after the last block (what the LM head reads)

    @property
    def blocks(self) -> nn.ModuleList:
        """The block list (same as ``encoder_layers``)."""
        return self.encoder_layers

    @property
    def causal(self) -> bool:
        """Token t attends to tokens <= t only."""
        return self.attention == "causal"

    def decoder_layout(self):
        """The :class:`~hf_tdiag.probes.decoders.DecoderLayout`; a ValueError for a model that is not a decoder."""
        if self.decoder is None:
            from .decoders import not_a_decoder

            raise not_a_decoder(self.base_model, self.model_type)
        return self.decoder


def _matches(rel_name: str, pattern: str) -> bool:
    return rel_name == pattern or rel_name.endswith("." + pattern)


def find_role(
    block: nn.Module, names: tuple[str, ...], accept: Callable[[nn.Module], bool], taken: set[str] | None = None
) -> tuple[str, list[str]]:
    """The one module of ``block`` named by ``names`` (a name matches when it equals one of them or ends with
    ``"." + name``) that ``accept`` takes and ``taken`` does not hold: ``(relative name, [])``, or ``("", hits)``
    when none or several match (``hits`` the several)."""
    taken = taken or set()
    hits = [
        n for n, m in block.named_modules() if n and n not in taken and accept(m) and any(_matches(n, p) for p in names)
    ]
    return (hits[0], []) if len(hits) == 1 else ("", hits)


def block_lists(model: nn.Module, is_block: Callable[[nn.Module], bool]) -> list[tuple[str, nn.ModuleList]]:
    """Every non-empty ``nn.ModuleList`` of ``model`` (with its qualified name) whose every element ``is_block``."""
    return [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, nn.ModuleList) and len(mod) > 0 and all(is_block(b) for b in mod)
    ]


def config_int(config, *names: str) -> int | None:
    """The first of ``config``'s attributes ``names`` that is an int (None when none is)."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def model_type(model: nn.Module) -> str:
    """``config.model_type``, or the class name of a module without one."""
    config = getattr(model, "config", None)
    return str(getattr(config, "model_type", "") or type(model).__name__)


def is_causal(model: nn.Module) -> bool:
    """Some module of ``model`` declares ``is_causal = True`` (Transformers' decoders' attention)."""
    return any(getattr(m, "is_causal", False) is True for m in model.modules())


def describe(model: nn.Module) -> Description:
    """The :class:`Description` of ``model`` from the first registered adapter that recognises it; a clear error
    naming what each family expects when none does."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module (a Transformers model), got {type(model).__name__}")
    for adapter in adapters():
        found = adapter.describe(model)
        if found is not None:
            return found
    if is_causal(model):
        from .decoders import not_a_decoder

        raise not_a_decoder(model, model_type(model))
    expected = "; ".join(f"{a.name}: {a.expected}" for a in adapters())
    raise ValueError(f"model: unsupported architecture {model_type(model)!r} ({type(model).__name__}); {expected}")
