"""Adapters of the white-box families beyond CRATE: ToST (``TostLayer`` blocks: one projection ``U`` =
``attention.qkv`` serves as query, key and value of TSSA, ``attention.out_proj`` maps the heads back, a GELU MLP
follows, both norms pre-norm), CRATE-MAE's encoder (CRATE blocks: ``attention.qkv``, the learned
``attention.out_proj``, the ISTA dictionary ``ista.weight``) and CRATE-α (``U`` = ``attention.qkv``, the output
matrix ``attention.out_proj`` without bias, and its two-step overcomplete sparse coder ``sparse_coding``, which
plays two roles: ``sparse_dictionary``, its parameter ``D`` (d, r·d), and ``sparse_decoder``, its parameter
``D1`` (d, r·d)), and the attention-only transformer (``AotLayer`` blocks: one LayerNorm and the attention, no FFN;
MSSA's ``U`` = ``attention.qkv`` as query, key and value, or MHSA's ``attention.q_proj/k_proj/v_proj``; the output
matrix ``attention.output_matrix()``, the learned ``W_O`` or ``U`` itself). Blocks are recognised by class name, so
models loaded with ``trust_remote_code`` are described too."""

from __future__ import annotations

from torch import nn

from ..describe import Adapter, BlockHandles, Description, block_lists, model_type, register

TOST_ROLES = {
    "query": ("attention.qkv",),
    "key": ("attention.qkv",),
    "value": ("attention.qkv",),
    "attn_output": ("attention.out_proj",),
    "ffn_in": ("mlp.fc1",),
    "ffn_out": ("mlp.fc2",),
    "attention_norm": ("layernorm_before",),
    "ffn_norm": ("layernorm_after",),
}
CRATE_MAE_ROLES = {
    "query": ("attention.qkv",),
    "key": ("attention.qkv",),
    "value": ("attention.qkv",),
    "attn_output": ("attention.out_proj",),
    "ista": ("ista",),
    "attention_norm": ("layernorm_before",),
    "ffn_norm": ("layernorm_after",),
}
CRATE_ALPHA_ROLES = {
    "query": ("attention.qkv",),
    "key": ("attention.qkv",),
    "value": ("attention.qkv",),
    "attn_output": ("attention.out_proj",),
    "sparse_dictionary": ("sparse_coding",),
    "sparse_decoder": ("sparse_coding",),
    "attention_norm": ("layernorm_before",),
    "ffn_norm": ("layernorm_after",),
}
AOT_ROLES = {
    "query": ("attention.qkv",),
    "key": ("attention.qkv",),
    "value": ("attention.qkv",),
    "attn_output": ("attention",),
    "attention_norm": ("layernorm_before",),
}
AOT_MHSA_ROLES = {
    "query": ("attention.q_proj",),
    "key": ("attention.k_proj",),
    "value": ("attention.v_proj",),
    "attn_output": ("attention",),
    "attention_norm": ("layernorm_before",),
}
_FAMILIES = {
    # block class -> (family, role table, attention kind, base model class)
    "TostLayer": ("tost", TOST_ROLES, "tssa", "TostModel"),
    "CrateMAEEncoderLayer": ("crate-mae", CRATE_MAE_ROLES, "mssa", "CrateMAEModel"),
    "CrateAlphaLayer": ("crate-alpha", CRATE_ALPHA_ROLES, "mssa", "CrateAlphaModel"),
}
EXPECTED = "ToST (TostLayer), CRATE-MAE (CrateMAEEncoderLayer), CRATE-α (CrateAlphaLayer) or AoT (AotLayer) blocks"


def _handles(i: int, block: nn.Module, path: str, roles: dict) -> BlockHandles:
    mods = {role: block.get_submodule(names[0]) for role, names in roles.items()}
    if mods.get("attn_output", True) is None:  # CRATE-α with one head of width d: no output matrix
        raise ValueError("model: a CRATE-α block without an output matrix (one head of width d) is not described")
    return BlockHandles(
        index=i,
        block=block,
        path=f"{path}.{i}",
        num_heads=block.attention.num_heads,
        head_dim=block.attention.head_dim,
        paths={role: f"{path}.{i}.{names[0]}" for role, names in roles.items()},
        **mods,
    )


def _describe_aot(model: nn.Module) -> Description | None:
    """The attention-only transformer's description (vision or causal LM, MSSA or MHSA); None for another model."""
    lists = block_lists(model, lambda m: type(m).__name__ == "AotLayer")
    if not lists:
        return None
    if len(lists) != 1:
        raise ValueError(f"model: AoT model with {len(lists)} lists of AotLayer blocks; expected one")
    path, blocks = lists[0]
    attention = blocks[0].attention
    mssa = attention.kind == "mssa"
    family, roles = ("aot", AOT_ROLES) if mssa else ("aot-mhsa", AOT_MHSA_ROLES)
    handles = [_handles(i, b, path, roles) for i, b in enumerate(blocks)]
    causal = bool(attention.is_causal)
    base_class = "AotTextModel" if causal else "AotModel"
    base = next((m for m in model.modules() if type(m).__name__ == base_class), model)
    final_norm = getattr(base, "final_layernorm", None)
    return Description(
        family=family,
        model_type=model_type(model),
        hidden_size=handles[0].query.in_features,
        num_layers=len(blocks),
        num_heads=handles[0].num_heads,
        head_dim=handles[0].head_dim,
        pre_norm=True,
        layers=handles,
        encoder_layers=blocks,
        base_model=base,
        layers_path=path,
        projection_layout="shared" if mssa else "separate",
        attention="causal" if causal else ("mssa" if mssa else "softmax"),
        final_norm=final_norm,
    )


def describe_whitebox(model: nn.Module) -> Description | None:
    """ToST's, CRATE-MAE's, CRATE-α's or AoT's description of ``model``; None for any other model."""
    aot = _describe_aot(model)
    if aot is not None:
        return aot
    for block_class, (family, roles, attention, base_class) in _FAMILIES.items():
        lists = block_lists(model, lambda m, name=block_class: type(m).__name__ == name)
        if not lists:
            continue
        if len(lists) != 1:
            raise ValueError(f"model: {family} model with {len(lists)} lists of {block_class} blocks; expected one")
        path, blocks = lists[0]
        handles = [_handles(i, b, path, roles) for i, b in enumerate(blocks)]
        base = next((m for m in model.modules() if type(m).__name__ == base_class), model)
        return Description(
            family=family,
            model_type=model_type(model),
            hidden_size=handles[0].query.in_features,
            num_layers=len(blocks),
            num_heads=handles[0].num_heads,
            head_dim=handles[0].head_dim,
            pre_norm=True,
            layers=handles,
            encoder_layers=blocks,
            base_model=base,
            layers_path=path,
            projection_layout="shared",
            attention=attention,
        )
    return None


register(
    Adapter(
        name="whitebox",
        tables={
            "tost": TOST_ROLES,
            "crate-mae": CRATE_MAE_ROLES,
            "crate-alpha": CRATE_ALPHA_ROLES,
            "aot": AOT_ROLES,
            "aot-mhsa": AOT_MHSA_ROLES,
        },  # fmt: skip
        describe=describe_whitebox,
        expected=EXPECTED,
        order=5,
    )
)
