"""SimDINO / SimDINOv2 checkpoint conversion (hf_tdiag.models.simdino) against a forward written from the equations.

The checkpoints are built here in the authors' layouts (RobinWu218/SimDINO: ``simdino/main_dino.py`` saves
``{"student": DDP(MultiCropWrapper), "teacher": MultiCropWrapper, ...}``, ``simdinov2/train/train.py`` saves
``{"teacher": {"backbone.*", "dino_head.*", "ibot_head.*"}}`` with chunked blocks ``blocks.{c}.{i}``), with random
tensors of the official names and shapes.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from hf_tdiag.models.simdino.convert_official import convert_simdino, split_simdino_checkpoint

D, HEADS, PATCH, IMAGE, CH = 32, 4, 4, 8, 3


def _backbone(
    layout,
    *,
    layers=2,
    registers=0,
    layer_scale=False,
    swiglu=False,
    chunks=0,
    seed=0,
    grid=2,
    dim=D,
    qkv_bias=True,
    ratio=4,
):
    """A backbone state dict of the authors' ViT (``simdino``) or DinoVisionTransformer (``simdinov2``)."""
    g, D = torch.Generator().manual_seed(seed), dim  # noqa: N806  (the width, as the module constant)

    def r(*shape, scale=0.3):
        return scale * torch.randn(*shape, generator=g)

    sd = {
        "cls_token": r(1, 1, D),
        "pos_embed": r(1, 1 + grid * grid, D),
        "patch_embed.proj.weight": r(D, CH, PATCH, PATCH, scale=0.15),
        "patch_embed.proj.bias": r(D),
        "norm.weight": 1 + r(D),
        "norm.bias": r(D),
    }
    if layout == "simdinov2":
        sd["mask_token"] = r(1, D)
        if registers:
            sd["register_tokens"] = r(1, registers, D)
    per_chunk = layers // chunks if chunks else None
    for i in range(layers):
        p = f"blocks.{i // per_chunk}.{i}" if chunks else f"blocks.{i}"
        sd[f"{p}.norm1.weight"], sd[f"{p}.norm1.bias"] = 1 + r(D), r(D)
        sd[f"{p}.attn.qkv.weight"] = r(3 * D, D, scale=0.2)
        if qkv_bias:
            sd[f"{p}.attn.qkv.bias"] = r(3 * D)
        sd[f"{p}.attn.proj.weight"], sd[f"{p}.attn.proj.bias"] = r(D, D, scale=0.2), r(D)
        sd[f"{p}.norm2.weight"], sd[f"{p}.norm2.bias"] = 1 + r(D), r(D)
        if swiglu:
            hidden = (int(ratio * D * 2 / 3) + 7) // 8 * 8  # SwiGLUFFNFused's width for this mlp_ratio
            sd[f"{p}.mlp.w12.weight"], sd[f"{p}.mlp.w12.bias"] = r(2 * hidden, D, scale=0.2), r(2 * hidden)
            sd[f"{p}.mlp.w3.weight"], sd[f"{p}.mlp.w3.bias"] = r(D, hidden, scale=0.2), r(D)
        else:
            sd[f"{p}.mlp.fc1.weight"], sd[f"{p}.mlp.fc1.bias"] = r(ratio * D, D, scale=0.2), r(ratio * D)
            sd[f"{p}.mlp.fc2.weight"], sd[f"{p}.mlp.fc2.bias"] = r(D, ratio * D, scale=0.2), r(D)
        if layer_scale:
            sd[f"{p}.ls1.gamma"], sd[f"{p}.ls2.gamma"] = 0.5 + r(D), 0.5 + r(D)
    return sd


def _v1_checkpoint(student, teacher):
    """``main_dino.py``'s save_dict: DDP's ``module.`` on the student, MultiCropWrapper's ``backbone.``/``head.``."""
    head = {"head.mlp.0.weight": torch.randn(16, D), "head.mlp.0.bias": torch.zeros(16)}
    return {
        "student": {
            **{f"module.backbone.{k}": v for k, v in student.items()},
            **{f"module.{k}": v for k, v in head.items()},
        },
        "teacher": {**{f"backbone.{k}": v for k, v in teacher.items()}, **head},
        "epoch": 100,
        "args": {"arch": "vit_small"},
    }


def _v2_checkpoint(teacher):
    heads = {"dino_head.mlp.0.weight": torch.randn(16, D), "ibot_head.mlp.0.weight": torch.randn(16, D)}
    return {"teacher": {**{f"backbone.{k}": v for k, v in teacher.items()}, **heads}}


# ----------------------------------------------------------------------------------- the forward from the equations


def _ln(x, w, b, eps=1e-6):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def _gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _block_keys(sd, i):
    """``blocks.{i}`` or the chunked ``blocks.{c}.{i}`` prefix of layer i."""
    for key in sd:
        parts = key.split(".")
        if parts[0] == "blocks" and parts[2].isdigit() and int(parts[2]) == i:
            return f"blocks.{parts[1]}.{i}"
    return f"blocks.{i}"


def _reference(sd, x, heads=HEADS, v2_interp=False):
    """The authors' forward in float64, written from the equations: non-overlapping p×p patches times the
    convolution's weight, [CLS] + patches + positions (bicubic-resized to the input's grid when it differs), the
    registers after [CLS], pre-LN blocks z += γ₁·proj(softmax(QKᵀ/√d_h)V), z += γ₂·FFN(LN z), a final LN."""
    sd = {k: v.double() for k, v in sd.items()}
    x, D = x.double(), sd["cls_token"].shape[-1]  # noqa: N806
    b, c, h, w = x.shape
    p = sd["patch_embed.proj.weight"].shape[-1]
    gh, gw = h // p, w // p
    patches = x.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c * p * p)
    z = patches @ sd["patch_embed.proj.weight"].reshape(D, -1).T + sd["patch_embed.proj.bias"]
    pos = sd["pos_embed"]
    g0 = math.isqrt(pos.shape[1] - 1)
    if (gh, gw) != (g0, g0):
        grid = pos[:, 1:].reshape(1, g0, g0, D).permute(0, 3, 1, 2)
        if v2_interp:  # simdinov2's configs: interpolate_offset 0 (an output size), interpolate_antialias True
            grid = F.interpolate(grid, size=(gh, gw), mode="bicubic", antialias=True)
        else:  # simdino's ViT: scale factors (g + 0.1) / g0
            grid = F.interpolate(grid, scale_factor=((gh + 0.1) / g0, (gw + 0.1) / g0), mode="bicubic")
        pos = torch.cat([pos[:, :1], grid.permute(0, 2, 3, 1).reshape(1, gh * gw, D)], dim=1)
    z = torch.cat([sd["cls_token"].expand(b, 1, D), z], dim=1) + pos
    if "register_tokens" in sd:
        z = torch.cat([z[:, :1], sd["register_tokens"].expand(b, -1, D), z[:, 1:]], dim=1)
    dh = D // heads
    layer = 0
    while any(k.startswith(f"{_block_keys(sd, layer)}.") for k in sd):
        pre = _block_keys(sd, layer)
        n = z.shape[1]
        qkv = _ln(z, sd[f"{pre}.norm1.weight"], sd[f"{pre}.norm1.bias"]) @ sd[f"{pre}.attn.qkv.weight"].T
        qkv = (qkv + sd.get(f"{pre}.attn.qkv.bias", 0.0)).reshape(b, n, 3, heads, dh)
        q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))  # (b, heads, n, dh)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, n, D) @ sd[f"{pre}.attn.proj.weight"].T + sd[f"{pre}.attn.proj.bias"]
        z = z + y * sd.get(f"{pre}.ls1.gamma", 1.0)
        u = _ln(z, sd[f"{pre}.norm2.weight"], sd[f"{pre}.norm2.bias"])
        if f"{pre}.mlp.w12.weight" in sd:
            a, gate = (u @ sd[f"{pre}.mlp.w12.weight"].T + sd[f"{pre}.mlp.w12.bias"]).chunk(2, dim=-1)
            f = (a * torch.sigmoid(a) * gate) @ sd[f"{pre}.mlp.w3.weight"].T + sd[f"{pre}.mlp.w3.bias"]
        else:
            f = _gelu(u @ sd[f"{pre}.mlp.fc1.weight"].T + sd[f"{pre}.mlp.fc1.bias"])
            f = f @ sd[f"{pre}.mlp.fc2.weight"].T + sd[f"{pre}.mlp.fc2.bias"]
        z = z + f * sd.get(f"{pre}.ls2.gamma", 1.0)
        layer += 1
    assert layer > 0
    return _ln(z, sd["norm.weight"], sd["norm.bias"]).float()


def _hidden(model, x):
    with torch.no_grad():
        return model(pixel_values=x).last_hidden_state


def _images(n=2, size=IMAGE, seed=1):
    return torch.randn(n, CH, size, size, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------------- tests


def test_simdino_teacher_and_student_convert_to_vit_equal_to_the_equations():
    teacher, student = _backbone("simdino", seed=0), _backbone("simdino", seed=1)
    ckpt = _v1_checkpoint(student, teacher)
    backbone, heads = split_simdino_checkpoint(ckpt)
    assert set(heads) == {"head.mlp.0.weight", "head.mlp.0.bias"}
    assert all(torch.equal(heads[k], ckpt["teacher"][k]) for k in heads)
    model = convert_simdino(backbone, "simdino", num_heads=HEADS)
    assert type(model).__name__ == "ViTModel" and model.pooler is None
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.patch_size, cfg.image_size) == (
        D, 2, 4 * D, PATCH, IMAGE
    )  # fmt: skip
    x = _images()
    torch.testing.assert_close(_hidden(model, x), _reference(teacher, x), rtol=0, atol=1e-5)
    # --student takes the DDP-wrapped student, a different network
    s_backbone, _ = split_simdino_checkpoint(ckpt, student=True)
    s_model = convert_simdino(s_backbone, "simdino", num_heads=HEADS)
    torch.testing.assert_close(_hidden(s_model, x), _reference(student, x), rtol=0, atol=1e-5)
    assert (_hidden(s_model, x) - _hidden(model, x)).abs().max() > 0.1
    # a torch.compile'd run's keys (_orig_mod.) and a plain backbone state dict convert the same
    compiled = {f"_orig_mod.{k}": v for k, v in ckpt["teacher"].items()}
    assert split_simdino_checkpoint({"teacher": compiled})[0].keys() == teacher.keys()
    torch.testing.assert_close(_hidden(convert_simdino(teacher, "simdino", num_heads=HEADS), x), _hidden(model, x))


def test_simdinov2_chunked_blocks_registers_layer_scale_equal_to_the_equations():
    teacher = _backbone("simdinov2", layers=4, registers=2, layer_scale=True, chunks=2, seed=2)
    backbone, heads = split_simdino_checkpoint(_v2_checkpoint(teacher))
    assert sorted(heads) == ["dino_head.mlp.0.weight", "ibot_head.mlp.0.weight"]
    model = convert_simdino(backbone, "simdinov2", num_heads=HEADS)
    assert type(model).__name__ == "Dinov2WithRegistersModel" and model.config.num_register_tokens == 2
    assert model.config.num_hidden_layers == 4
    assert torch.equal(model.embeddings.mask_token, teacher["mask_token"])
    x = _images()
    out = _hidden(model, x)
    assert out.shape == (2, 1 + 2 + 4, D)  # [CLS], 2 registers, 2×2 patches
    torch.testing.assert_close(out, _reference(teacher, x), rtol=0, atol=1e-5)
    # another resolution: the positions are resized as the authors' simdinov2 configs do (size, antialias)
    big = _images(size=12)
    torch.testing.assert_close(_hidden(model, big), _reference(teacher, big, v2_interp=True), rtol=0, atol=1e-5)


def test_simdinov2_swiglu_without_registers_or_layer_scale_is_a_dinov2_model():
    teacher = _backbone("simdinov2", swiglu=True, seed=3, grid=3)  # a 3×3 grid: 12-px images
    model = convert_simdino(split_simdino_checkpoint(_v2_checkpoint(teacher))[0], "simdinov2", num_heads=HEADS)
    assert type(model).__name__ == "Dinov2Model" and model.config.use_swiglu_ffn and model.config.image_size == 12
    assert all(torch.equal(m.lambda1, torch.ones(D)) for m in model.modules() if hasattr(m, "lambda1"))
    x = _images(size=12)
    torch.testing.assert_close(_hidden(model, x), _reference(teacher, x), rtol=0, atol=1e-5)


def test_without_qkv_bias_and_at_mlp_ratio_1_and_3():
    x = _images()
    for layout, kw in [
        ("simdino", dict(ratio=3)),
        ("simdinov2", dict(ratio=1)),
        ("simdinov2", dict(swiglu=True, ratio=1)),
    ]:
        sd = _backbone(layout, qkv_bias=False, **kw)
        model = convert_simdino(sd, layout, num_heads=HEADS)
        assert model.config.qkv_bias is False
        torch.testing.assert_close(_hidden(model, x), _reference(sd, x), rtol=0, atol=1e-5)
    assert model.config.mlp_ratio == 1 and model.encoder.layer[0].mlp.up_proj.out_features == 24


def test_heads_default_to_the_authors_width_of_64():
    sd = _backbone("simdino", layers=1, dim=128)
    model = convert_simdino(sd, "simdino")
    assert model.config.num_attention_heads == 2
    torch.testing.assert_close(_hidden(model, _images()), _reference(sd, _images(), heads=2), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="--num-heads"):
        convert_simdino(_backbone("simdino", layers=1), "simdino")  # width 32: not a multiple of 64
    for bad in (5, 0, True, 2.0):
        with pytest.raises(ValueError, match=f"num_heads: expected a positive divisor of the width 32, got {bad}"):
            convert_simdino(_backbone("simdino", layers=1), "simdino", num_heads=bad)
    one = _backbone("simdino", layers=1)
    model = convert_simdino(one, "simdino", num_heads=1)  # one head of width 32
    torch.testing.assert_close(_hidden(model, _images()), _reference(one, _images(), heads=1), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda sd: sd.pop("backbone.blocks.1.mlp.fc2.bias"), r"missing keys \['blocks.1.mlp.fc2.bias'\]"),
        (lambda sd: sd.pop("backbone.norm.weight"), r"missing keys \['norm.weight'\]"),
        (lambda sd: sd.update({"backbone.blocks.0.ls1.gamma": torch.ones(D)}), r"unexpected keys \['blocks.0.ls1"),
        (lambda sd: sd.update({"backbone.fc_norm.weight": torch.ones(D)}), r"unexpected keys \['fc_norm.weight'\]"),
        (lambda sd: sd.update({"predictor.weight": torch.ones(D)}), r"unexpected keys \['predictor.weight'\]"),
        (lambda sd: sd.update({"backbone.blocks.0.attn.proj.bias": torch.ones(D + 1)}), r"'blocks.0.attn.proj.bias'"),
        (
            lambda sd: sd.update({"backbone.pos_embed": torch.ones(1, 6, D)}),
            "'pos_embed' holds 5 patch positions, not a",
        ),
    ],
)
def test_a_missing_extra_or_misshaped_key_is_named(change, message):
    ckpt = _v1_checkpoint(_backbone("simdino"), _backbone("simdino"))
    change(ckpt["teacher"])
    with pytest.raises(ValueError, match=message) as err:
        convert_simdino(split_simdino_checkpoint(ckpt)[0], "simdino", num_heads=HEADS)
    assert "\n" not in str(err.value)


def test_a_checkpoint_of_the_other_layout_is_named_as_such():
    v2 = _backbone("simdinov2", chunks=2)
    with pytest.raises(ValueError, match="'mask_token' is a SimDINOv2 key; .*'simdinov2'"):
        convert_simdino(v2, "simdino", num_heads=HEADS)
    del v2["mask_token"]
    with pytest.raises(ValueError, match="'blocks.0.0.attn.proj.bias' is a SimDINOv2 key"):
        convert_simdino(v2, "simdino", num_heads=HEADS)
    with pytest.raises(ValueError, match="no 'mask_token'.*'simdino'"):
        convert_simdino(_backbone("simdino"), "simdinov2", num_heads=HEADS)


def test_the_network_is_chosen_as_asked():
    teacher = _backbone("simdino")
    with pytest.raises(ValueError, match="no 'student' network"):
        split_simdino_checkpoint({f"backbone.{k}": v for k, v in teacher.items()}, student=True)
    with pytest.raises(ValueError, match="pass --student"):
        split_simdino_checkpoint({"student": {f"module.backbone.{k}": v for k, v in teacher.items()}})
    with pytest.raises(ValueError, match="layout: expected one of"):
        convert_simdino(teacher, "dino")
    with pytest.raises(TypeError, match="mapping"):
        split_simdino_checkpoint([1, 2])
    # SimDINOv2's full training checkpoint: {"model": {"student.backbone.*", "teacher.backbone.*", ...}}
    full = {
        "model": {
            **{f"teacher.backbone.{k}": v for k, v in teacher.items()},
            "student.backbone.x": teacher["norm.bias"],
        }
    }
    assert split_simdino_checkpoint(full)[0].keys() == teacher.keys()
    assert list(split_simdino_checkpoint(full, student=True)[0]) == ["x"]
