"""Encoder adapter, tried last: any model with one ``nn.ModuleList`` of blocks whose ``nn.Linear`` modules are named
by role (relative names inside one block; a name matches when it equals the accepted name or ends with
``"." + name``). Pre-norm blocks (a LayerNorm named as in :data:`VIT_ROLES` before attention) are family ``vit``
(ViT, DeiT, …), the others ``bert`` (BERT, RoBERTa, ELECTRA, MiniLM, DistilBERT, …)."""

from __future__ import annotations

from torch import nn

from ..describe import (
    Adapter,
    BlockHandles,
    Description,
    block_lists,
    config_int,
    find_role,
    is_causal,
    model_type,
    register,
)
from .crate import EXPECTED as CRATE_EXPECTED

_LINEARS = {
    "query": ("query", "q_lin", "q_proj"),
    "key": ("key", "k_lin", "k_proj"),
    "value": ("value", "v_lin", "v_proj"),
    "attn_output": ("attention.output.dense", "out_lin", "out_proj", "o_proj"),
    "ffn_in": ("intermediate.dense", "ffn.lin1", "fc1"),
    "ffn_out": ("output.dense", "ffn.lin2", "fc2"),
}
VIT_ROLES = {
    **_LINEARS,
    "attention_norm": ("layernorm_before", "layer_norm1", "ln_1", "norm1", "attention_norm"),
    "ffn_norm": ("layernorm_after", "layer_norm2", "ln_2", "norm2", "ffn_norm"),
}
BERT_ROLES = {
    **_LINEARS,
    "attention_post_norm": ("attention.output.LayerNorm", "sa_layer_norm"),
    "ffn_post_norm": ("output.LayerNorm", "output_layer_norm"),
}
_PROJECTIONS = ("query", "key", "value")
_FFN_ROLES = ("ffn_in", "ffn_out", "ffn_norm", "ffn_post_norm")  # never a module under an 'attention' segment


def expected_text() -> str:
    """The accepted names of every linear role, for error messages."""
    return "; ".join(f"{role}: {' | '.join(p)}" for role, p in _LINEARS.items())


def _accept(role: str):
    kind = nn.LayerNorm if role.endswith("norm") else nn.Linear
    return lambda m: isinstance(m, kind)


def find_roles(block: nn.Module, table: dict) -> tuple[dict[str, str], list[str]]:
    """role -> relative module name in ``block`` by ``table``; also the roles that matched none or several modules."""
    found, problems, taken = {}, [], set()
    for role, names in table.items():
        skip = taken | (
            {n for n, _ in block.named_modules() if "attention" in n.split(".")} if role in _FFN_ROLES else set()
        )
        name, hits = find_role(block, names, _accept(role), skip)
        if name:
            found[role] = name
            taken.add(name)
        else:
            problems.append(f"{role}: {'none' if not hits else 'several ' + str(hits)}")
    return found, problems


def _is_block(block: nn.Module) -> bool:
    found, _ = find_roles(block, {r: _LINEARS[r] for r in _PROJECTIONS})
    return len(found) == 3


def _no_blocks(model: nn.Module) -> ValueError:
    report = []
    for path, mlist in block_lists(model, lambda b: True):
        linears = sorted(n for n, m in mlist[0].named_modules() if n and isinstance(m, nn.Linear))
        report.append((path, find_roles(mlist[0], _LINEARS)[1], linears))
    detail = ""
    if report:
        path, problems, names = max(report, key=lambda r: len(r[2]))
        detail = f" Closest match: layers at {path!r} with Linear modules {names}; missing/ambiguous roles: {problems}."
    return ValueError(
        f"model: unsupported architecture {model_type(model)!r} ({type(model).__name__}): expected an encoder "
        f"nn.ModuleList whose layers hold nn.Linear modules named by role ({expected_text()}), or a CRATE model "
        f"({CRATE_EXPECTED}).{detail}"
    )


def _block_list(model: nn.Module, config) -> tuple[str, nn.ModuleList]:
    candidates = block_lists(model, _is_block)
    num_layers = config_int(config, "num_hidden_layers", "n_layers", "num_layers")
    if len(candidates) > 1 and num_layers is not None:
        candidates = [c for c in candidates if len(c[1]) == num_layers] or candidates
    if not candidates:
        raise _no_blocks(model)
    if len(candidates) > 1:
        raise ValueError(
            f"model: found several encoder layer lists {[c[0] for c in candidates]}; pass the encoder sub-model itself"
        )
    return candidates[0]


def _num_heads(model: nn.Module, config) -> int:
    if config is None:
        raise TypeError(f"model: expected a Transformers model with a .config, got {type(model).__name__}")
    num_heads = config_int(config, "num_attention_heads", "n_heads", "num_heads")
    if num_heads is None or num_heads < 1:
        raise ValueError(
            f"model: config of type {model_type(model)!r} has no number of heads (num_attention_heads / n_heads)"
        )
    return num_heads


def _handles(i: int, block: nn.Module, path: str, table: dict, num_heads: int) -> BlockHandles:
    roles, _ = find_roles(block, table)
    q = block.get_submodule(roles["query"])
    if q.out_features % num_heads:
        raise ValueError(
            f"model: query projection of block {i + 1} has {q.out_features} outputs, not divisible by {num_heads} heads"
        )
    return BlockHandles(
        index=i,
        block=block,
        path=f"{path}.{i}",
        num_heads=num_heads,
        head_dim=q.out_features // num_heads,
        paths={role: f"{path}.{i}.{rel}" for role, rel in roles.items()},
        **{role: block.get_submodule(rel) for role, rel in roles.items()},
    )


def describe_encoder(model: nn.Module) -> Description | None:
    """The encoder description of ``model`` (None for a causal model: decoders are read by their own adapters)."""
    if is_causal(model):
        return None
    config = getattr(model, "config", None)
    path, blocks = _block_list(model, config)
    num_heads = _num_heads(model, config)
    pre_norm = "attention_norm" in find_roles(blocks[0], {"attention_norm": VIT_ROLES["attention_norm"]})[0]
    table = VIT_ROLES if pre_norm else BERT_ROLES
    handles = [_handles(i, b, path, table, num_heads) for i, b in enumerate(blocks)]
    hidden = config_int(config, "hidden_size", "dim", "d_model") or handles[0].query.in_features
    return Description(
        family="vit" if pre_norm else "bert",
        model_type=model_type(model),
        hidden_size=hidden,
        num_layers=len(blocks),
        num_heads=num_heads,
        head_dim=handles[0].head_dim,
        pre_norm=pre_norm,
        layers=handles,
        encoder_layers=blocks,
        base_model=getattr(model, "base_model", model),
        layers_path=path,
    )


register(
    Adapter(
        name="encoders",
        tables={"vit": VIT_ROLES, "bert": BERT_ROLES},
        describe=describe_encoder,
        expected=f"an encoder whose blocks name their nn.Linear modules by role ({expected_text()})",
        order=1000,
    )
)
