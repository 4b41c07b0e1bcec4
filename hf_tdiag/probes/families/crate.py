"""CRATE adapter (hf-tdiag's CRATE and its ablations ``crate-c``, ``crate-n``, ``crate-t``, ``crate-fix``): query, key
and value are the one shared projection ``U`` (``attention.qkv``), the attention output matrix is the variant's
``attention.output_matrix()``, the ISTA dictionary ``ista.weight`` takes the place of the FFN, and both
LayerNorms sit before their sub-layer (pre-norm)."""

from __future__ import annotations

import torch
from torch import nn

from ..describe import Adapter, BlockHandles, Description, block_lists, model_type, register

ROLES = {
    "query": ("attention.qkv",),
    "key": ("attention.qkv",),
    "value": ("attention.qkv",),
    "attn_output": ("attention",),
    "ista": ("ista",),
    "attention_norm": ("layernorm_before",),
    "ffn_norm": ("layernorm_after",),
}
EXPECTED = (
    "layers with attention.qkv (nn.Linear), attention.output_matrix(), attention.num_heads/head_dim and ista.weight"
)


def is_crate_block(layer: nn.Module) -> bool:
    """A CRATE block: ``attention.qkv`` (nn.Linear), ``attention.output_matrix()``, ``attention.num_heads`` and
    ``ista.weight``."""
    attn = getattr(layer, "attention", None)
    ista = getattr(layer, "ista", None)
    return (
        attn is not None
        and isinstance(getattr(attn, "qkv", None), nn.Linear)
        and callable(getattr(attn, "output_matrix", None))
        and isinstance(getattr(attn, "num_heads", None), int)
        and isinstance(getattr(ista, "weight", None), torch.Tensor)
    )


def _handles(i: int, block: nn.Module, path: str) -> BlockHandles:
    mods = {role: block.get_submodule(names[0]) for role, names in ROLES.items()}
    return BlockHandles(
        index=i,
        block=block,
        path=f"{path}.{i}",
        num_heads=mods["attn_output"].num_heads,
        head_dim=mods["attn_output"].head_dim,
        paths={role: f"{path}.{i}.{names[0]}" for role, names in ROLES.items()},
        **mods,
    )


def describe_crate(model: nn.Module) -> Description | None:
    """CRATE's description of ``model``, None when it is not a CRATE model."""
    lists = block_lists(model, is_crate_block)
    if model_type(model) != "crate" and not lists:
        return None
    if len(lists) != 1:
        names = [n for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m)]
        raise ValueError(
            f"model: CRATE model ({type(model).__name__}) without exactly one layer list of CRATE blocks; expected "
            f"{EXPECTED}; found layer lists {names}"
        )
    path, blocks = lists[0]
    handles = [_handles(i, b, path) for i, b in enumerate(blocks)]
    return Description(
        family="crate",
        model_type="crate",
        hidden_size=handles[0].query.in_features,
        num_layers=len(blocks),
        num_heads=handles[0].num_heads,
        head_dim=handles[0].head_dim,
        pre_norm=True,
        layers=handles,
        encoder_layers=blocks,
        base_model=getattr(model, "crate", model),
        layers_path=path,
        projection_layout="shared",
        attention="mssa",
    )


register(Adapter(name="crate", tables={"crate": ROLES}, describe=describe_crate, expected=EXPECTED, order=10))
