"""Official CRATE checkpoint conversion against a reference forward written from the official layout."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForImageClassification

import hf_tdiag  # noqa: F401
from hf_tdiag import CrateConfig, convert_official_crate
from hf_tdiag.cli import main as cli_main


def _official_state_dict(image=8, patch=2, channels=3, dim=24, depth=2, heads=3, dim_head=8, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.3):
        return scale * torch.randn(*shape, generator=g)

    patch_dim = patch * patch * channels
    n = (image // patch) ** 2
    sd = {
        "to_patch_embedding.1.weight": 1 + r(patch_dim),
        "to_patch_embedding.1.bias": r(patch_dim),
        "to_patch_embedding.2.weight": r(dim, patch_dim),
        "to_patch_embedding.2.bias": r(dim),
        "to_patch_embedding.3.weight": 1 + r(dim),
        "to_patch_embedding.3.bias": r(dim),
        "pos_embedding": r(1, n + 1, dim, scale=1.0),
        "cls_token": r(1, 1, dim, scale=1.0),
        "mlp_head.0.weight": 1 + r(dim),
        "mlp_head.0.bias": r(dim),
        "mlp_head.1.weight": r(classes, dim),
        "mlp_head.1.bias": r(classes),
    }
    for i in range(depth):
        p = f"transformer.layers.{i}"
        sd[f"{p}.0.norm.weight"], sd[f"{p}.0.norm.bias"] = 1 + r(dim), r(dim)
        sd[f"{p}.0.fn.qkv.weight"] = r(heads * dim_head, dim)
        sd[f"{p}.0.fn.to_out.0.weight"], sd[f"{p}.0.fn.to_out.0.bias"] = r(dim, heads * dim_head), r(dim)
        sd[f"{p}.1.norm.weight"], sd[f"{p}.1.norm.bias"] = 1 + r(dim), r(dim)
        sd[f"{p}.1.fn.weight"] = r(dim, dim)
    return sd


def _official_forward(sd, img, heads, patch, eta=0.1, lam=0.1, pool="cls", variant="crate"):
    """The official CRATE forward, transcribed from the layout description (row-vector form)."""
    b, c, H, W = img.shape
    patches = []
    for i in range(H // patch):  # b c (h p1) (w p2) -> b (h w) (p1 p2 c)
        for j in range(W // patch):
            block = img[:, :, i * patch : (i + 1) * patch, j * patch : (j + 1) * patch]
            patches.append(block.permute(0, 2, 3, 1).reshape(b, -1))
    x = torch.stack(patches, 1)

    def ln(t, prefix):
        return F.layer_norm(t, t.shape[-1:], sd[prefix + ".weight"], sd[prefix + ".bias"], eps=1e-5)

    x = ln(x, "to_patch_embedding.1")
    x = F.linear(x, sd["to_patch_embedding.2.weight"], sd["to_patch_embedding.2.bias"])
    x = ln(x, "to_patch_embedding.3")
    n = x.shape[1]
    x = torch.cat([sd["cls_token"].expand(b, -1, -1), x], 1) + sd["pos_embedding"][:, : n + 1]
    depth = 1 + max(int(k.split(".")[2]) for k in sd if k.startswith("transformer.layers."))
    for i in range(depth):
        p = f"transformer.layers.{i}"
        y = ln(x, f"{p}.0.norm")
        qkv = sd[f"{p}.0.fn.qkv.weight"]
        w = F.linear(y, qkv)
        dh = w.shape[-1] // heads
        w = w.reshape(b, n + 1, heads, dh).permute(0, 2, 1, 3)  # b n (h d) -> b h n d
        attn = torch.softmax(w @ w.transpose(-1, -2) * dh**-0.5, -1)
        out = (attn @ w).permute(0, 2, 1, 3).reshape(b, n + 1, heads * dh)  # b h n d -> b n (h d)
        if variant == "crate":
            out = F.linear(out, sd[f"{p}.0.fn.to_out.0.weight"], sd[f"{p}.0.fn.to_out.0.bias"])
        elif variant == "crate-c":
            out = out @ qkv
        elif variant == "crate-n":
            out = -(out @ qkv)
        elif variant == "crate-t":
            out = out @ qkv.T
        elif variant == "crate-fix":
            out = F.linear(out, sd[f"{p}.0.fn.to_out.0.weight"])
        x = x + out
        y = ln(x, f"{p}.1.norm")
        D = sd[f"{p}.1.fn.weight"]
        x1 = F.linear(y, D)
        grad_1 = F.linear(x1, D.t())
        grad_2 = F.linear(y, D.t())
        x = F.relu(y + eta * (grad_2 - grad_1) - eta * lam)
    x = x[:, 0] if pool == "cls" else x.mean(1)
    return F.linear(ln(x, "mlp_head.0"), sd["mlp_head.1.weight"], sd["mlp_head.1.bias"])


def _config(**kw):
    fields = dict(
        image_size=8,
        patch_size=2,
        num_channels=3,
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=3,
        head_dim=8,
        num_labels=5,
    )
    fields.update(kw)
    return CrateConfig(**fields)


def _wrapped(sd):
    return {"state_dict": {f"module.{k}": v for k, v in sd.items()}, "epoch": 3}


@pytest.mark.parametrize(
    "variant, pool",
    [
        ("crate", "cls"),
        ("crate", "mean"),
        ("crate-c", "cls"),
        ("crate-n", "cls"),
        ("crate-t", "cls"),
        ("crate-identity", "cls"),
    ],
)
def test_conversion_matches_official_forward(variant, pool):
    sd = _official_state_dict()
    model = convert_official_crate(_wrapped(sd), _config(variant=variant, pooling=pool, ista_step_size=0.2))
    img = torch.randn(4, 3, 8, 8)
    expected = _official_forward(sd, img, heads=3, patch=2, eta=0.2, pool=pool, variant=variant)
    with torch.no_grad():
        torch.testing.assert_close(model(img).logits, expected, rtol=1e-4, atol=1e-5)


def test_conversion_crate_fix_uses_to_out_weight_as_fixed_matrix():
    sd = _official_state_dict()
    for i in range(2):
        sd[f"transformer.layers.{i}.0.fn.to_out.0.bias"] = torch.zeros(24)
    model = convert_official_crate(sd, _config(variant="crate-fix"))
    img = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(
            model(img).logits, _official_forward(sd, img, 3, 2, variant="crate-fix"), rtol=1e-4, atol=1e-5
        )
    torch.testing.assert_close(
        model.crate.encoder.layer[1].attention.fixed_output, sd["transformer.layers.1.0.fn.to_out.0.weight"]
    )
    sd["transformer.layers.0.0.fn.to_out.0.bias"] = torch.ones(24)
    with pytest.raises(ValueError, match=r"transformer\.layers\.0\.0\.fn\.to_out\.0\.bias"):
        convert_official_crate(sd, _config(variant="crate-fix"))


def test_missing_key_is_named():
    sd = _official_state_dict()
    del sd["transformer.layers.1.1.fn.weight"]
    with pytest.raises(ValueError, match=r"missing .*transformer\.layers\.1\.1\.fn\.weight"):
        convert_official_crate(sd, _config())


def test_misshaped_key_is_named():
    sd = _official_state_dict()
    sd["transformer.layers.0.0.fn.qkv.weight"] = torch.randn(20, 24)
    with pytest.raises(ValueError, match=r"transformer\.layers\.0\.0\.fn\.qkv\.weight.*\(20, 24\)"):
        convert_official_crate(sd, _config())


def test_unexpected_layers_and_bad_values():
    sd = _official_state_dict(depth=3)
    with pytest.raises(ValueError, match=r"unexpected .*transformer\.layers\.2.*3 layers"):
        convert_official_crate(sd, _config())
    sd = _official_state_dict()
    sd["cls_token"][0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="cls_token.*NaN"):
        convert_official_crate(sd, _config())
    with pytest.raises(TypeError, match="epoch"):
        convert_official_crate({**_official_state_dict(), "epoch": 3}, _config())
    with pytest.raises(TypeError, match="config"):
        convert_official_crate(_official_state_dict(), 42)


def test_cli_convert_official_writes_loadable_folder(tmp_path, capsys):
    # the crate-digits preset: 8 px grayscale, patch 2, d=64, 4 layers, 4 heads of 16
    sd = _official_state_dict(image=8, patch=2, channels=1, dim=64, depth=4, heads=4, dim_head=16, classes=10)
    ckpt = tmp_path / "crate_official.pth"
    torch.save(_wrapped(sd), ckpt)
    out = tmp_path / "converted"
    assert cli_main(["convert-official", str(ckpt), "--preset", "crate-digits", "--output", str(out)]) == 0
    assert "10 classes" in capsys.readouterr().out
    model = AutoModelForImageClassification.from_pretrained(out).eval()
    img = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(img).logits, _official_forward(sd, img, 4, 2), rtol=1e-4, atol=1e-5)
    assert (out / "preprocessor_config.json").is_file()
    # a wrong preset is reported, with the offending key, as a CLI error
    assert cli_main(["convert-official", str(ckpt), "--preset", "crate-32", "--output", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert "missing" in err and "transformer.layers.4.0.norm.weight" in err and "checkpoint has 4 layers" in err
    # same depth, wrong width: the first mis-shaped key is named
    assert (
        cli_main(
            [
                "convert-official",
                str(ckpt),
                "--preset",
                "crate-digits",
                "--image-size",
                "16",
                "--output",
                str(tmp_path / "y"),
            ]
        )
        == 1
    )
    assert "pos_embedding" in capsys.readouterr().err
