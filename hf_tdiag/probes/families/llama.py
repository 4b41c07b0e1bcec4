"""Llama family adapter: blocks with separate ``self_attn.q_proj / k_proj / v_proj / o_proj`` ``nn.Linear``
projections and an MLP of ``gate_proj / up_proj / down_proj`` (gated: ``down(act(gate x) ⊙ up x)``) or
``up_proj / down_proj`` (plain); RMSNorm, rotary position embedding (a parameter-free rotation of q and k, not a
weight), grouped-query attention with ``H_kv ≤ H`` K/V heads. Llama, Mistral, Qwen2/Qwen3, Gemma/Gemma2/Gemma3
(text) and models that copy the layout."""

from __future__ import annotations

from torch import nn

from ..decoders import (
    DecoderLayout,
    TensorRef,
    check_width,
    config_value,
    decoder_description,
    heads_layout,
    one_block_list,
    text_config,
)
from ..describe import Adapter, BlockHandles, block_lists, register

ROLES = {
    "query": ("self_attn.q_proj",),
    "key": ("self_attn.k_proj",),
    "value": ("self_attn.v_proj",),
    "attn_output": ("self_attn.o_proj",),
    "ffn_gate": ("mlp.gate_proj",),
    "ffn_in": ("mlp.up_proj",),
    "ffn_out": ("mlp.down_proj",),
    "attention_norm": ("input_layernorm",),
    "ffn_norm": ("pre_feedforward_layernorm", "post_attention_layernorm"),  # Gemma2/3 norm before the MLP, else
}
FINAL_NORM = ("norm",)  # the base model's norm after the blocks
_REQUIRED = ("query", "key", "value", "attn_output", "ffn_in", "ffn_out")
EXPECTED = (
    "blocks with nn.Linear 'self_attn.q_proj/k_proj/v_proj/o_proj' and 'mlp.gate_proj/up_proj/down_proj' or "
    "'mlp.up_proj/down_proj' (Llama, Mistral, Qwen, Gemma family)"
)


def _get(block: nn.Module, role: str):
    """The first of the role's names present in ``block`` (None when none is)."""
    for rel in ROLES[role]:
        module = block
        for part in rel.split("."):
            module = getattr(module, part, None)
            if module is None:
                break
        if module is not None:
            return rel, module
    return None, None


def _is_block(block: nn.Module) -> bool:
    return all(isinstance(_get(block, r)[1], nn.Linear) for r in _REQUIRED)


def _roles(block: nn.Module) -> dict[str, tuple[str, nn.Module]]:
    """role -> (relative name, module) of one block; ``ffn_gate`` only for a gated MLP."""
    found = {role: _get(block, role) for role in ROLES}
    if not isinstance(found["ffn_gate"][1], nn.Linear):
        del found["ffn_gate"]
    return {role: got for role, got in found.items() if got[1] is not None}


def _refs(prefix: str, roles: dict) -> dict[str, TensorRef]:
    return {
        role: TensorRef(f"{prefix}{rel}.weight", False, None, f"{prefix}{rel}.bias" if mod.bias is not None else None)
        for role, (rel, mod) in roles.items()
        if not role.endswith("norm")
    }


def _handles(i: int, block: nn.Module, prefix: str, roles: dict, layout: DecoderLayout) -> BlockHandles:
    mods = {role: mod for role, (_, mod) in roles.items()}
    return BlockHandles(
        index=i,
        block=block,
        path=prefix[:-1],
        num_heads=layout.num_heads,
        head_dim=layout.head_dim,
        num_kv_heads=layout.num_kv_heads,
        paths={role: f"{prefix}{rel}" for role, (rel, _) in roles.items()},
        **mods,
    )


def describe_llama(model: nn.Module):
    """The Llama family's description of ``model``, None when it has no Llama-style block list."""
    found = one_block_list(model, block_lists(model, _is_block))
    if found is None:
        return None
    path, blocks = found
    config = text_config(model)
    q, k = _get(blocks[0], "query")[1], _get(blocks[0], "key")[1]
    d = q.in_features
    H, H_kv, p = heads_layout(config, q.out_features, k.out_features, d, f"block 0 of {path}")
    check_width(config, d, path)
    prefixes = [f"{path}.{i}." if path else f"{i}." for i in range(len(blocks))]
    roles = [_roles(b) for b in blocks]
    attn = blocks[0].self_attn
    layout = DecoderLayout(
        family="llama",
        model_type=str(getattr(config, "model_type", "") or type(model).__name__),
        num_layers=len(blocks),
        hidden_size=d,
        num_heads=H,
        num_kv_heads=H_kv,
        head_dim=p,
        intermediate_size=_get(blocks[0], "ffn_in")[1].out_features,
        gated="ffn_gate" in roles[0],
        activation=str(config_value(config, "hidden_activation", "hidden_act") or "silu"),
        norm="layernorm" if isinstance(_get(blocks[0], "attention_norm")[1], nn.LayerNorm) else "rmsnorm",
        rotary=any(n.endswith("rotary_emb") for n, _ in model.named_modules()),
        qk_norm=any(getattr(attn, n, None) is not None for n in ("q_norm", "k_norm")),
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        layers_path=path,
        refs=[_refs(pre, r) for pre, r in zip(prefixes, roles)],
    )
    handles = [_handles(i, b, pre, r, layout) for i, (b, pre, r) in enumerate(zip(blocks, prefixes, roles))]
    return decoder_description(model, layout, handles, FINAL_NORM)


register(Adapter(name="llama", tables={"llama": ROLES}, describe=describe_llama, expected=EXPECTED, order=20))
