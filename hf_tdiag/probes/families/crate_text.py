"""Text-CRATE adapter (model type ``crate_text``: CRATE-LM / CRATE-GPT causal models, the masked CRATE and their
heads): query, key and value are the one shared projection ``U`` (``attention.qkv``), the attention output is the
learned ``attention.out_proj``, and both LayerNorms sit before their sub-layer. The ISTA module ``ista`` takes the
place of the FFN: for ``block="crate"`` its ``weight`` is the square dictionary ``D`` (role ``ista``, as in CRATE);
for CRATE-LM's overcomplete block (``weight = Dᵀ``, ``(m, d)``) the block is ``x ↦ D z₁(Dᵀx)``, a two-matrix FFN
whose first matrix is ``weight`` (role ``ffn_in``, the map ``x ↦ Dᵀx``) and whose second is the same parameter
transposed (role ``ffn_out``, the decoding ``z ↦ D z``; its module is a view, :class:`TiedDecoder`). Causal models
(``config.is_decoder``) report ``attention="causal"``."""

from __future__ import annotations

import torch
from torch import nn

from ..describe import Adapter, BlockHandles, Description, block_lists, register

ROLES = {
    "query": ("attention.qkv",),
    "key": ("attention.qkv",),
    "value": ("attention.qkv",),
    "attn_output": ("attention.out_proj",),
    "ista": ("ista",),  # the square one-step block
    "ffn_in": ("ista",),  # CRATE-LM's overcomplete block: x ↦ Dᵀx (weight Dᵀ) ...
    "ffn_out": ("ista",),  # ... and the decoding z ↦ D z (the same parameter, transposed)
    "attention_norm": ("layernorm_before",),
    "ffn_norm": ("layernorm_after",),
}
_SQUARE = ("ista",)
_OVERCOMPLETE = ("ffn_in", "ffn_out")
EXPECTED = "layers with attention.qkv and attention.out_proj (nn.Linear), attention.num_heads/head_dim and ista.weight"
CONCEPTS_REFUSAL = (
    "model: concept fidelity does not cover text CRATE models (crate_text): its decoder path splits GPT-2 / "
    "Llama-family blocks through their tensor layout and its encoder path needs a BERT-like pooler with a linear "
    "head, and the bound's certified constants are derived for full softmax attention and CRATE's square one-step "
    "ISTA, not for causal masks or CRATE-LM's overcomplete two-step block; layer_srr, objective_ledger, "
    "schatten_bounds and attention_svm_diagnostic do apply"
)


def is_crate_text_block(layer: nn.Module) -> bool:
    """A text-CRATE block: ``attention.qkv`` and ``attention.out_proj`` (nn.Linear), ``attention.num_heads``,
    ``ista.weight`` and ``ista.sparse_code``."""
    attn = getattr(layer, "attention", None)
    ista = getattr(layer, "ista", None)
    return (
        attn is not None
        and isinstance(getattr(attn, "qkv", None), nn.Linear)
        and isinstance(getattr(attn, "out_proj", None), nn.Linear)
        and isinstance(getattr(attn, "num_heads", None), int)
        and isinstance(getattr(ista, "weight", None), torch.Tensor)
        and callable(getattr(ista, "sparse_code", None))
    )


class TiedDecoder(nn.Module):
    """The decoding ``z ↦ D z`` of CRATE-LM's overcomplete block as a module with ``weight = D`` (d, m): a view of the
    ISTA module's own parameter (``ista.weight.T``), holding no parameter of its own."""

    def __init__(self, ista: nn.Module):
        super().__init__()
        object.__setattr__(self, "_ista", ista)  # not a submodule: the parameter stays the ISTA module's
        self.bias = None

    @property
    def weight(self) -> torch.Tensor:
        return self._ista.weight.T


def _roles(block: nn.Module, base: str) -> tuple[dict, dict]:
    """``(modules, paths)`` of one block's roles (the square or the overcomplete reading of its ISTA)."""
    ista = block.get_submodule("ista")
    square = not (hasattr(ista, "codes") or type(ista).__name__ == "CrateTextOvercompleteISTA")
    skip = _OVERCOMPLETE if square else _SQUARE
    names = {role: names[0] for role, names in ROLES.items() if role not in skip}
    mods = {role: block.get_submodule(name) for role, name in names.items()}
    paths = {role: f"{base}.{name}" for role, name in names.items()}
    if not square:
        mods["ffn_out"] = TiedDecoder(ista)
        paths["ffn_in"] = f"{base}.ista.weight"
        paths["ffn_out"] = f"{base}.ista.weight.T"
    return mods, paths


def describe_crate_text(model: nn.Module) -> Description | None:
    """The text-CRATE description of ``model``, None when it is not a ``crate_text`` model."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "crate_text":
        return None
    lists = block_lists(model, is_crate_text_block)
    if len(lists) != 1:
        raise ValueError(
            f"model: crate_text model ({type(model).__name__}) without exactly one layer list of text-CRATE blocks; "
            f"expected {EXPECTED}"
        )
    path, blocks = lists[0]
    handles = []
    for i, block in enumerate(blocks):
        mods, paths = _roles(block, f"{path}.{i}")
        attention = block.get_submodule("attention")
        handles.append(
            BlockHandles(
                index=i,
                block=block,
                path=f"{path}.{i}",
                num_heads=attention.num_heads,
                head_dim=attention.head_dim,
                paths=paths,
                **mods,
            )
        )
    return Description(
        family="crate_text",
        model_type="crate_text",
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
        attention="causal" if getattr(config, "is_decoder", False) else "mssa",
        num_kv_heads=handles[0].num_heads,  # one shared U per head: every head its own key/value head
    )


register(
    Adapter(name="crate_text", tables={"crate_text": ROLES}, describe=describe_crate_text, expected=EXPECTED, order=5)
)
