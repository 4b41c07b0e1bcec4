"""Per-layer, per-head weight matrices of BERT-like / ViT-like encoders and CRATE, for spectral analysis.

Discovery is structural, not per model class: the encoder is the ``nn.ModuleList``
whose every element holds ``nn.Linear`` sub-modules matching the roles below
(relative names inside one layer; a name matches when it equals the pattern or
ends with ``"." + pattern``):

============  =========================================================================
role          accepted names
============  =========================================================================
query         ``query`` · ``q_lin`` · ``q_proj``
key           ``key`` · ``k_lin`` · ``k_proj``
value         ``value`` · ``v_lin`` · ``v_proj``
attn_output   ``attention.output.dense`` · ``out_lin`` · ``out_proj`` · ``o_proj``
ffn_in        ``intermediate.dense`` · ``ffn.lin1`` · ``fc1``
ffn_out       ``output.dense`` (not the attention one) · ``ffn.lin2`` · ``fc2``
============  =========================================================================

This covers BERT, RoBERTa, ELECTRA, DistilBERT (``attention.q_lin`` …, ``ffn.lin1/2``),
ViT and DeiT (older Transformers: ``attention.attention.query`` …; Transformers 5:
``attention.q_proj`` … ``attention.o_proj``, ``mlp.fc1/fc2``) and models that copy
their layout. CRATE (``config.model_type == "crate"``) has its own adapter:
Q = K = V = the shared projection ``attention.qkv`` split by head, the output
matrix is ``attention.output_matrix()`` (every variant), and the ISTA dictionary
``ista.weight`` takes the place of the first FFN matrix with no second one.

Everything returned is a detached view of the model's parameters in PyTorch
``(out, in)`` layout (no copies, no dtype or device change); per-head splits
are reshapes only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

ROLE_PATTERNS: dict[str, tuple[str, ...]] = {
    "query": ("query", "q_lin", "q_proj"),
    "key": ("key", "k_lin", "k_proj"),
    "value": ("value", "v_lin", "v_proj"),
    "attn_output": ("attention.output.dense", "out_lin", "out_proj", "o_proj"),
    "ffn_in": ("intermediate.dense", "ffn.lin1", "fc1"),
    "ffn_out": ("output.dense", "ffn.lin2", "fc2"),
}

CRATE_EXPECTED = (
    "layers with attention.qkv (nn.Linear), attention.output_matrix(), attention.num_heads/head_dim and ista.weight"
)


def _expected_text() -> str:
    return "; ".join(f"{role}: {' | '.join(p)}" for role, p in ROLE_PATTERNS.items())


@dataclass
class LayerWeights:
    """One encoder layer's matrices, PyTorch ``(out, in)`` layout.

    ``query/key/value``: ``(H·d_h, N)``; ``attn_output``: ``(N, H·d_h)``;
    ``ffn_in``: ``(I, N)`` (CRATE: the ISTA dictionary ``D``, ``(N, N)``);
    ``ffn_out``: ``(N, I)``, or ``None`` where the block has no second FFN matrix (CRATE).
    ``names`` maps each role to the module path it was read from.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_output: torch.Tensor
    ffn_in: torch.Tensor
    ffn_out: torch.Tensor | None
    names: dict[str, str] = field(default_factory=dict)


@dataclass
class EncoderWeights:
    """The encoder's layers plus the shapes the bound needs.

    ``family`` is ``"bert-like"`` (BERT/RoBERTa/ELECTRA/DistilBERT/ViT/DeiT layout) or ``"crate"``;
    ``ffn_in_type`` names the role of ``ffn_in`` in reports (``"m_in"``, or ``"ista"`` for CRATE).
    """

    family: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    ffn_in_type: str
    layers: list[LayerWeights]
    layer_paths: list[str]

    def heads(self, layer: int, role: str) -> torch.Tensor:
        """Per-head rows ``(H, d_h, N)``: W_Q,h / W_K,h / W_V,h (role query/key/value) or the rows of (W_O)ᵀ (role attn_output)."""
        lw = self.layers[layer]
        if role in ("query", "key", "value"):
            w = getattr(lw, role)
        elif role == "attn_output":
            w = lw.attn_output.mT
        else:
            raise ValueError(f"role: expected one of 'query', 'key', 'value', 'attn_output', got {role!r}")
        return w.reshape(self.num_heads, self.head_dim, self.hidden_size)


def _model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "model_type", "") or type(model).__name__)


def _layer_lists(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    return [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.ModuleList) and len(mod) > 0]


def _matches(rel_name: str, pattern: str) -> bool:
    return rel_name == pattern or rel_name.endswith("." + pattern)


def _linears(layer: nn.Module) -> dict[str, nn.Linear]:
    return {name: mod for name, mod in layer.named_modules() if isinstance(mod, nn.Linear) and name}


def _assign_roles(linears: dict[str, nn.Linear]) -> tuple[dict[str, str], list[str]]:
    """Map role -> relative name; also return the roles that matched zero or several modules."""
    found: dict[str, str] = {}
    problems: list[str] = []
    taken: set[str] = set()
    for role, patterns in ROLE_PATTERNS.items():
        hits = [n for n in linears if n not in taken and any(_matches(n, p) for p in patterns)]
        if role == "ffn_out":  # "output.dense" must not be the attention output
            hits = [n for n in hits if "attention" not in n.split(".")]
        if len(hits) == 1:
            found[role] = hits[0]
            taken.add(hits[0])
        else:
            problems.append(f"{role}: {'none' if not hits else 'several ' + str(hits)}")
    return found, problems


def _num_heads(model: nn.Module, query_out: int) -> int:
    config = getattr(model, "config", None)
    for attr in ("num_attention_heads", "n_heads", "num_heads"):
        h = getattr(config, attr, None)
        if isinstance(h, int) and h > 0:
            if query_out % h:
                raise ValueError(f"model: query projection width {query_out} is not divisible by config.{attr} = {h}")
            return h
    raise ValueError(
        "model: expected config.num_attention_heads (or n_heads) to split the projections by head; none found"
    )


def _w(linear: nn.Module) -> torch.Tensor:
    return linear.weight.detach()


def _bert_like(model: nn.Module) -> EncoderWeights:
    candidates = []
    report = []
    for path, mlist in _layer_lists(model):
        per_layer = []
        for layer in mlist:
            roles, problems = _assign_roles(_linears(layer))
            if problems:
                per_layer = None
                report.append((path, problems, sorted(_linears(layer))))
                break
            per_layer.append((layer, roles))
        if per_layer:
            candidates.append((path, per_layer))
    if not candidates:
        detail = ""
        if report:
            path, problems, names = max(report, key=lambda r: len(r[2]))
            detail = (
                f" Closest match: layers at {path!r} with Linear modules {names}; missing/ambiguous roles: {problems}."
            )
        raise ValueError(
            f"model: unsupported architecture {_model_type(model)!r} ({type(model).__name__}): expected an encoder "
            f"nn.ModuleList whose layers hold nn.Linear modules named by role ({_expected_text()}), or a CRATE model "
            f"({CRATE_EXPECTED}).{detail}"
        )
    if len(candidates) > 1:
        raise ValueError(
            f"model: found several encoder layer lists {[c[0] for c in candidates]}; pass the encoder sub-model itself"
        )
    path, per_layer = candidates[0]
    layers = []
    first_q = per_layer[0][0].get_submodule(per_layer[0][1]["query"])
    num_heads = _num_heads(model, first_q.out_features)
    for i, (layer, roles) in enumerate(per_layer):
        mods = {role: layer.get_submodule(name) for role, name in roles.items()}
        layers.append(
            LayerWeights(
                query=_w(mods["query"]),
                key=_w(mods["key"]),
                value=_w(mods["value"]),
                attn_output=_w(mods["attn_output"]),
                ffn_in=_w(mods["ffn_in"]),
                ffn_out=_w(mods["ffn_out"]),
                names={role: f"{path}.{i}.{name}" for role, name in roles.items()},
            )
        )
    return _finish("bert-like", model, layers, [f"{path}.{i}" for i in range(len(layers))], num_heads, "m_in")


def _is_crate_layer(layer: nn.Module) -> bool:
    attn = getattr(layer, "attention", None)
    ista = getattr(layer, "ista", None)
    return (
        attn is not None
        and isinstance(getattr(attn, "qkv", None), nn.Linear)
        and callable(getattr(attn, "output_matrix", None))
        and isinstance(getattr(attn, "num_heads", None), int)
        and isinstance(getattr(ista, "weight", None), torch.Tensor)
    )


def _crate(model: nn.Module) -> EncoderWeights:
    lists = [(p, m) for p, m in _layer_lists(model) if all(_is_crate_layer(x) for x in m)]
    if len(lists) != 1:
        raise ValueError(
            f"model: CRATE model ({type(model).__name__}) without exactly one layer list of CRATE blocks; expected "
            f"{CRATE_EXPECTED}; found layer lists {[p for p, _ in _layer_lists(model)]}"
        )
    path, mlist = lists[0]
    layers = []
    num_heads = None
    for i, layer in enumerate(mlist):
        attn = layer.attention
        qkv = _w(attn.qkv)
        num_heads = int(attn.num_heads)
        out = attn.output_matrix().detach()
        layers.append(
            LayerWeights(
                query=qkv,
                key=qkv,
                value=qkv,
                attn_output=out,
                ffn_in=layer.ista.weight.detach(),
                ffn_out=None,
                names={
                    "query": f"{path}.{i}.attention.qkv",
                    "key": f"{path}.{i}.attention.qkv",
                    "value": f"{path}.{i}.attention.qkv",
                    "attn_output": f"{path}.{i}.attention.output_matrix()",
                    "ffn_in": f"{path}.{i}.ista.weight",
                },
            )
        )
    return _finish("crate", model, layers, [f"{path}.{i}" for i in range(len(layers))], num_heads, "ista")


def _finish(family, model, layers, paths, num_heads, ffn_in_type) -> EncoderWeights:
    q = layers[0].query
    n = q.shape[1]
    inner = q.shape[0]
    if inner % num_heads:
        raise ValueError(f"model: projection width {inner} is not divisible by the number of heads {num_heads}")
    inter = layers[0].ffn_in.shape[0]
    for i, lw in enumerate(layers):
        expect = {
            "query": (inner, n),
            "key": (inner, n),
            "value": (inner, n),
            "attn_output": (n, inner),
            "ffn_in": (inter, n),
        }
        if lw.ffn_out is not None:
            expect["ffn_out"] = (n, inter)
        for role, shape in expect.items():
            got = tuple(getattr(lw, role).shape)
            if got != shape:
                raise ValueError(
                    f"model: layer {i} {role} ({lw.names.get(role, role)}) has shape {got}, expected {shape} "
                    "(all layers must share hidden size, head layout and FFN width)"
                )
    return EncoderWeights(
        family=family,
        model_type=_model_type(model),
        num_layers=len(layers),
        hidden_size=n,
        num_heads=num_heads,
        head_dim=inner // num_heads,
        intermediate_size=inter,
        ffn_in_type=ffn_in_type,
        layers=layers,
        layer_paths=paths,
    )


def encoder_weights(model: nn.Module) -> EncoderWeights:
    """Find the encoder layers of ``model`` and return their Q, K, V, O and FFN weights (see module docstring)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module (a Transformers model), got {type(model).__name__}")
    if _model_type(model) == "crate" or any(_is_crate_layer(m) for _, ml in _layer_lists(model) for m in ml[:1]):
        return _crate(model)
    return _bert_like(model)


__all__ = ["ROLE_PATTERNS", "EncoderWeights", "LayerWeights", "encoder_weights"]
