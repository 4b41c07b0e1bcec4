"""Load checkpoints of the authors' SimDINO code (``RobinWu218/SimDINO``) into Transformers' ViT / Dinov2 classes.

Layouts (read from the authors' code):

* ``simdino`` — ``simdino/main_dino.py`` saves ``{"student": ..., "teacher": ..., "optimizer": ..., "epoch": ...}``.
  The student is wrapped in DistributedDataParallel (``module.``), both in ``MultiCropWrapper`` (``backbone.``,
  ``head.``), and with ``--compile`` in ``torch.compile`` (``_orig_mod.``). The backbone is DINO's ViT
  (``simdino/vision_transformer.py``): ``cls_token (1, 1, d)``, ``pos_embed (1, 1 + g², d)``,
  ``patch_embed.proj`` (a p×p convolution of stride p), ``blocks.{i}.norm1``, ``.attn.qkv`` (rows q | k | v, heads
  of width d/h inside each), ``.attn.proj``, ``.norm2``, ``.mlp.fc1``, ``.mlp.fc2`` (exact GELU), ``norm``; every
  LayerNorm ε = 1e-6, pre-LN blocks without layer scale. Its heads keep width 64 (``vit_tiny/small/base``: 192/3,
  384/6, 768/12; ViT-L 1024/16).
* ``simdinov2`` — ``simdinov2/train/train.py`` saves ``{"teacher": ...}`` (``eval/N/teacher_checkpoint.pth``) with
  ``backbone.``, ``dino_head.`` and ``ibot_head.`` keys. The backbone (``simdinov2/models/vision_transformer.py``)
  adds ``mask_token (1, d)``, optional ``register_tokens (1, R, d)`` (4 in the released configs), layer scale
  ``blocks.{i}.ls1.gamma`` / ``.ls2.gamma``, an optional SwiGLU FFN (``mlp.w12``, ``mlp.w3``) and chunked blocks
  ``blocks.{c}.{i}.*`` (FSDP wrapping; ``i`` stays the global block index).

The teacher (the EMA network the authors evaluate and release) is taken by default. The projection heads are not
part of the Transformers model; :func:`split_simdino_checkpoint` returns them separately (the command line saves
them as ``simdino_head.safetensors``). A key left over or missing is a ``ValueError`` naming it.

Imports only torch and transformers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

SIMDINO_LAYOUTS = ("simdino", "simdinov2")
HEAD_PREFIXES = ("head.", "dino_head.", "ibot_head.")
_WRAPPERS = ("_orig_mod.", "module.")
_CHUNKED = re.compile(r"^blocks\.(\d+)\.(\d+)\.(.+)$")
_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")


def _strip_wrappers(name: str) -> str:
    while name.startswith(_WRAPPERS):
        name = name.split(".", 1)[1]
    return name


def _pick_network(checkpoint: Mapping, student: bool) -> Mapping:
    """The state dict of the teacher (default) or the student inside a checkpoint dict, or the dict itself."""
    which = "student" if student else "teacher"
    if isinstance(checkpoint.get(which), Mapping):
        return checkpoint[which]
    model = checkpoint.get("model")
    if isinstance(model, Mapping) and any(str(k).startswith(f"{which}.") for k in model):
        return {str(k)[len(which) + 1 :]: v for k, v in model.items() if str(k).startswith(f"{which}.")}
    if student:
        raise ValueError(
            "checkpoint: no 'student' network in it (top-level keys "
            f"{sorted(map(str, checkpoint))[:5]}); drop --student to convert the weights it holds"
        )
    if isinstance(checkpoint.get("student"), Mapping):
        raise ValueError("checkpoint: it has a 'student' but no 'teacher' network; pass --student to convert it")
    return checkpoint


def split_simdino_checkpoint(
    checkpoint: Mapping, *, student: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(backbone, heads)`` of a SimDINO / SimDINOv2 checkpoint: the teacher's (or, with ``student=True``, the
    student's) backbone state dict with the ``_orig_mod.``, ``module.`` and ``backbone.`` prefixes removed, and its
    projection heads under their own names (``head.*``, ``dino_head.*``, ``ibot_head.*``). A plain backbone state dict
    (no ``backbone.`` keys) is returned as it is."""
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f"checkpoint must be a mapping of names to tensors, got {type(checkpoint).__name__}")
    network = _pick_network(checkpoint, student)
    names = {str(k): _strip_wrappers(str(k)) for k in network}
    wrapped = any(n.startswith("backbone.") for n in names.values())
    backbone: dict[str, torch.Tensor] = {}
    heads: dict[str, torch.Tensor] = {}
    stray = []
    for key, value in network.items():
        name = names[str(key)]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"checkpoint[{str(key)!r}] must be a torch.Tensor, got {type(value).__name__}")
        if wrapped and name.startswith("backbone."):
            backbone[name[len("backbone.") :]] = value
        elif name.startswith(HEAD_PREFIXES):
            heads[name] = value
        elif wrapped:
            stray.append(str(key))
        else:
            backbone[name] = value
    if stray:
        raise ValueError(
            f"checkpoint: unexpected keys {sorted(stray)[:5]} ({len(stray)} in all) beside the backbone and heads"
        )
    if not backbone:
        raise ValueError(f"checkpoint: no backbone weights found among its {len(network)} keys")
    return backbone, heads


def _canonical_blocks(sd: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Canonical name (``blocks.{i}.rest``) -> the key in ``sd``; SimDINOv2's chunked ``blocks.{c}.{i}`` unfolded
    (:func:`_check_layout` has refused chunked keys under the ``simdino`` layout)."""
    out: dict[str, str] = {}
    for key in sd:
        match = _CHUNKED.match(key)
        name = f"blocks.{match.group(2)}.{match.group(3)}" if match else key
        if name in out:
            raise ValueError(f"checkpoint: keys {out[name]!r} and {key!r} both hold {name!r}")
        out[name] = key
    return out


def _check_layout(sd: Mapping[str, torch.Tensor], layout: str) -> None:
    """The other layout's tell-tale keys: SimDINOv2's ``mask_token`` and chunked blocks, which SimDINO lacks."""
    chunked = sorted(k for k in sd if _CHUNKED.match(k))
    if layout == "simdino" and ("mask_token" in sd or chunked):
        found = "mask_token" if "mask_token" in sd else chunked[0]
        raise ValueError(f"checkpoint: {found!r} is a SimDINOv2 key; convert it with layout (--preset) 'simdinov2'")
    if layout == "simdinov2" and "mask_token" not in sd:
        raise ValueError(
            "checkpoint: no 'mask_token', which every SimDINOv2 backbone has; a SimDINO checkpoint converts with "
            "layout (--preset) 'simdino'"
        )


def _num_layers(names) -> int:
    indices = {int(m.group(1)) for m in map(_BLOCK.match, names) if m}
    if not indices:
        raise ValueError("checkpoint: no 'blocks.{i}.*' keys; is it a SimDINO ViT checkpoint?")
    return max(indices) + 1


def _shape(sd, canon, name, ndim):
    key = canon.get(name)
    if key is None:
        raise ValueError(f"checkpoint: missing key {name!r}, which sets the architecture")
    if sd[key].ndim != ndim:
        raise ValueError(f"checkpoint: {key!r} has shape {tuple(sd[key].shape)}; expected {ndim} dimensions")
    return tuple(sd[key].shape)


def _heads(hidden: int, num_heads: int | None) -> int:
    if num_heads is None:
        if hidden % 64:
            raise ValueError(
                f"num_heads: the checkpoint's width {hidden} is not a multiple of 64 (the authors' head width); "
                "give the number of heads (--num-heads)"
            )
        return hidden // 64
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1 or hidden % num_heads:
        raise ValueError(f"num_heads: expected a positive divisor of the width {hidden}, got {num_heads!r}")
    return num_heads


def _grid(pos_tokens: int, key: str) -> int:
    side = round(pos_tokens**0.5)
    if side * side != pos_tokens:
        raise ValueError(f"checkpoint: {key!r} holds {pos_tokens} patch positions, not a square grid")
    return side


def _config(sd, canon, layout, num_heads):
    """The Transformers config the shapes of ``sd`` imply."""
    from transformers import Dinov2Config, Dinov2WithRegistersConfig, ViTConfig

    hidden, channels, patch, _ = _shape(sd, canon, "patch_embed.proj.weight", 4)
    pos = _shape(sd, canon, "pos_embed", 3)
    common = dict(
        hidden_size=hidden,
        num_hidden_layers=_num_layers(canon),
        num_attention_heads=_heads(hidden, num_heads),
        num_channels=channels,
        patch_size=patch,
        image_size=_grid(pos[1] - 1, "pos_embed") * patch,
        qkv_bias="blocks.0.attn.qkv.bias" in canon,
        layer_norm_eps=1e-6,
    )  # the configs' defaults are the authors': exact (erf) GELU as nn.GELU, no dropout or drop path
    if layout == "simdino":
        return ViTConfig(**common, intermediate_size=_shape(sd, canon, "blocks.0.mlp.fc1.weight", 2)[0])
    swiglu = "blocks.0.mlp.w12.weight" in canon
    ffn = _shape(sd, canon, "blocks.0.mlp.w12.weight" if swiglu else "blocks.0.mlp.fc1.weight", 2)[0]
    if swiglu:  # SwiGLU keeps (int(2/3 · d·ratio) + 7) // 8 · 8 of the MLP width: any ratio giving that width
        fits = [r for r in range(1, 65) if 2 * ((int(hidden * r * 2 / 3) + 7) // 8 * 8) == ffn]
    else:
        fits = [ffn // hidden] if ffn % hidden == 0 else []
    if not fits:  # Transformers' Dinov2 configs take a whole mlp_ratio
        raise ValueError(
            f"checkpoint: an FFN of width {ffn} for d={hidden} needs a fractional mlp_ratio, which Transformers' "
            "Dinov2 cannot express (vit_so150m/so400m-style shapes are not convertible)"
        )
    ratio = fits[0]
    v2 = dict(common, mlp_ratio=ratio, use_swiglu_ffn=swiglu)
    if "register_tokens" in canon:
        registers = _shape(sd, canon, "register_tokens", 3)[1]
        return Dinov2WithRegistersConfig(**v2, num_register_tokens=registers)
    return Dinov2Config(**v2)


def _block_map(i: int, config, layout: str) -> dict[str, tuple[str, ...] | str]:
    """Canonical official name -> Transformers name (a tuple: the official tensor is split along dim 0)."""
    src = f"blocks.{i}"
    att = f"layers.{i}.attention" if layout == "simdino" else f"encoder.layer.{i}.attention"
    out: dict[str, tuple[str, ...] | str] = {
        f"{src}.attn.qkv.weight": tuple(f"{att}.{p}_proj.weight" for p in "qkv"),
        f"{src}.attn.proj.weight": f"{att}.o_proj.weight",
        f"{src}.attn.proj.bias": f"{att}.o_proj.bias",
    }
    if config.qkv_bias:
        out[f"{src}.attn.qkv.bias"] = tuple(f"{att}.{p}_proj.bias" for p in "qkv")
    if layout == "simdino":
        dst, norms = f"layers.{i}", {"norm1": "layernorm_before", "norm2": "layernorm_after"}
    else:
        dst, norms = f"encoder.layer.{i}", {"norm1": "norm1", "norm2": "norm2"}
    for ours, theirs in norms.items():
        for p in ("weight", "bias"):
            out[f"{src}.{ours}.{p}"] = f"{dst}.{theirs}.{p}"
    if getattr(config, "use_swiglu_ffn", False):
        for p in ("weight", "bias"):  # w12 rows: the gate (through SiLU) first, then the linear half
            out[f"{src}.mlp.w12.{p}"] = (f"{dst}.mlp.gate_proj.{p}", f"{dst}.mlp.up_proj.{p}")
            out[f"{src}.mlp.w3.{p}"] = f"{dst}.mlp.down_proj.{p}"
    else:
        for fc in ("fc1", "fc2"):
            for p in ("weight", "bias"):
                out[f"{src}.mlp.{fc}.{p}"] = f"{dst}.mlp.{fc}.{p}"
    return out


def _key_map(config, layout: str, layer_scale: bool) -> dict[str, tuple[str, ...] | str]:
    out: dict[str, tuple[str, ...] | str] = {
        "cls_token": "embeddings.cls_token",
        "pos_embed": "embeddings.position_embeddings",
        "patch_embed.proj.weight": "embeddings.patch_embeddings.projection.weight",
        "patch_embed.proj.bias": "embeddings.patch_embeddings.projection.bias",
        "norm.weight": "layernorm.weight",
        "norm.bias": "layernorm.bias",
    }
    if layout == "simdinov2":
        out["mask_token"] = "embeddings.mask_token"
        if config.model_type == "dinov2_with_registers":
            out["register_tokens"] = "embeddings.register_tokens"
    for i in range(config.num_hidden_layers):
        out.update(_block_map(i, config, layout))
        if layer_scale:
            out[f"blocks.{i}.ls1.gamma"] = f"encoder.layer.{i}.layer_scale1.lambda1"
            out[f"blocks.{i}.ls2.gamma"] = f"encoder.layer.{i}.layer_scale2.lambda1"
    return out


def _check_keys(canon: Mapping[str, str], expected: Mapping) -> None:
    missing = sorted(set(expected) - set(canon))
    extra = sorted(canon[n] for n in set(canon) - set(expected))
    if missing:
        raise ValueError(f"checkpoint: missing keys {missing[:5]} ({len(missing)} in all)")
    if extra:
        raise ValueError(f"checkpoint: unexpected keys {extra[:5]} ({len(extra)} in all) for this layout")


def convert_simdino(backbone: Mapping[str, torch.Tensor], layout: str, *, num_heads: int | None = None):
    """A ``ViTModel`` (``layout="simdino"``) or ``Dinov2Model`` / ``Dinov2WithRegistersModel`` (``"simdinov2"``;
    the latter when the checkpoint has register tokens) holding ``backbone`` (from :func:`split_simdino_checkpoint`),
    its config inferred from the shapes. ``num_heads`` defaults to width / 64, the authors' convention."""
    if layout not in SIMDINO_LAYOUTS:
        raise ValueError(f"layout: expected one of {list(SIMDINO_LAYOUTS)}, got {layout!r}")
    if not isinstance(backbone, Mapping):
        raise TypeError(f"backbone must be a mapping of names to tensors, got {type(backbone).__name__}")
    from transformers import Dinov2Model, Dinov2WithRegistersModel, ViTModel

    _check_layout(backbone, layout)
    canon = _canonical_blocks(backbone)
    config = _config(backbone, canon, layout, num_heads)
    layer_scale = layout == "simdinov2" and "blocks.0.ls1.gamma" in canon
    key_map = _key_map(config, layout, layer_scale)
    _check_keys(canon, key_map)
    if layout == "simdino":
        model = ViTModel(config, add_pooling_layer=False)
    else:
        model = (Dinov2WithRegistersModel if config.model_type == "dinov2_with_registers" else Dinov2Model)(config)
    ours = model.state_dict()
    new: dict[str, torch.Tensor] = {}
    for name, target in key_map.items():
        tensor = backbone[canon[name]]
        parts = target if isinstance(target, tuple) else (target,)
        want = (sum(ours[p].shape[0] for p in parts), *ours[parts[0]].shape[1:])
        if tuple(tensor.shape) != want:
            raise ValueError(
                f"checkpoint: {canon[name]!r} has shape {tuple(tensor.shape)}, but the architecture its other keys "
                f"imply needs {want}"
            )
        chunks = tensor.chunk(len(parts))  # along the rows
        for k, part in enumerate(parts):
            new[part] = chunks[k]
    for name in ours:  # a checkpoint without layer scale: Dinov2's scale of 1 leaves the residuals as they are
        if name.endswith(".lambda1") and name not in new:
            new[name] = torch.ones_like(ours[name])
    model.load_state_dict(new)  # strict: every parameter of the model set
    return model.eval()


__all__ = ["SIMDINO_LAYOUTS", "HEAD_PREFIXES", "split_simdino_checkpoint", "convert_simdino"]
