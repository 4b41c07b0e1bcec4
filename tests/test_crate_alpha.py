"""CRATE-α: converter against an independent forward from the equations, attention implementations, save/reload."""

import json
import os

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageClassification

from hf_tdiag.cli import main as cli_main
from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification
from hf_tdiag.models.crate_alpha.convert_official import convert_official_crate_alpha, official_forward

ETA, LAM = 0.1, 0.1


def _official_state_dict(image=8, patch=2, channels=3, dim=16, depth=2, heads=2, classes=5, seed=0):
    """A state_dict in the authors' key layout, random weights (scaled so that the ReLUs are partly active)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.3):
        return scale * torch.randn(*shape, generator=g)

    n = (image // patch) ** 2
    sd = {
        "conv1.weight": r(dim, channels, patch, patch),
        "conv1.bias": r(dim),
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
        sd[f"{p}.0.fn.qkv.weight"] = r(dim, dim)
        sd[f"{p}.0.fn.to_out.0.weight"] = r(dim, dim)
        sd[f"{p}.1.norm.weight"], sd[f"{p}.1.norm.bias"] = 1 + r(dim), r(dim)
        sd[f"{p}.1.fn.D"] = r(dim, 4 * dim, scale=1.0)
        sd[f"{p}.1.fn.D1"] = r(dim, 4 * dim)
    return sd


def _layer_norm(v, weight, bias, eps):
    mean = v.mean()
    var = ((v - mean) ** 2).mean()
    return (v - mean) / torch.sqrt(var + eps) * weight + bias


def _equations_forward(sd, img, heads, patch, depth):
    """CRATE-α written token by token from the paper's equations (column vectors), float64."""
    sd = {k: v.double() for k, v in sd.items()}
    img = img.double()
    logits = []
    for b in range(img.shape[0]):
        tokens = [sd["cls_token"][0, 0]]
        for i in range(img.shape[2] // patch):
            for j in range(img.shape[3] // patch):
                block = img[b, :, i * patch : (i + 1) * patch, j * patch : (j + 1) * patch]
                tokens.append((sd["conv1.weight"] * block).sum(dim=(1, 2, 3)) + sd["conv1.bias"])
        Z = torch.stack(tokens, 1) + sd["pos_embedding"][0].T  # (d, N): columns are tokens
        d, N = Z.shape
        p = d // heads
        for layer in range(depth):
            pre = f"transformer.layers.{layer}"
            X = torch.stack(
                [_layer_norm(Z[:, t], sd[f"{pre}.0.norm.weight"], sd[f"{pre}.0.norm.bias"], 1e-6) for t in range(N)], 1
            )
            Uall = sd[f"{pre}.0.fn.qkv.weight"].T  # (d, K p): U = [U_1 ... U_K]
            heads_out = []
            for k in range(heads):
                W = Uall[:, k * p : (k + 1) * p].T @ X  # U_k^T X, (p, N)
                A = torch.softmax((W.T @ W) / p**0.5, dim=1)  # row t: token t attends over columns
                heads_out.append(W @ A.T)
            Z = Z + sd[f"{pre}.0.fn.to_out.0.weight"] @ torch.cat(heads_out, 0)
            D, D1 = sd[f"{pre}.1.fn.D"], sd[f"{pre}.1.fn.D1"]
            cols = []
            for t in range(N):
                x = _layer_norm(Z[:, t], sd[f"{pre}.1.norm.weight"], sd[f"{pre}.1.norm.bias"], 1e-6)
                a1 = torch.clamp(ETA * D.T @ x - ETA * LAM, min=0)
                a2 = torch.clamp(a1 - ETA * D.T @ (D @ a1 - x) - ETA * LAM, min=0)
                cols.append(Z[:, t] + D1 @ a2)
            Z = torch.stack(cols, 1)
        cls = _layer_norm(Z[:, 0], sd["mlp_head.0.weight"], sd["mlp_head.0.bias"], 1e-5)
        logits.append(sd["mlp_head.1.weight"] @ cls + sd["mlp_head.1.bias"])
    return torch.stack(logits)


def _config(**kw):
    fields = dict(
        image_size=8,
        patch_size=2,
        num_channels=3,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_labels=5,
    )
    fields.update(kw)
    return CrateAlphaConfig(**fields)


def test_converter_matches_the_equations():
    sd = _official_state_dict()
    img = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    model = convert_official_crate_alpha(sd, _config())
    reference = _equations_forward(sd, img, heads=2, patch=2, depth=2)
    with torch.no_grad():
        ours = model(img).logits
    torch.testing.assert_close(ours.double(), reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(official_forward(sd, img, model.config).double(), reference, rtol=1e-5, atol=1e-5)
    # both sparse codes are partly active: the ReLUs are exercised
    layer = model.crate_alpha.encoder.layer[0]
    with torch.no_grad():
        out = model(img, output_mid_hidden_states=True)
        a1, a2 = layer.sparse_coding.codes(layer.layernorm_after(out.mid_hidden_states[0]))
    for a in (a1, a2):
        assert 0.05 < float((a > 0).float().mean()) < 0.95


def test_converter_rejects_bad_state_dicts():
    sd = _official_state_dict()
    with pytest.raises(ValueError, match="missing"):
        convert_official_crate_alpha({k: v for k, v in sd.items() if k != "transformer.layers.1.1.fn.D1"}, _config())
    with pytest.raises(ValueError, match="unexpected"):
        convert_official_crate_alpha({**sd, "extra.weight": torch.zeros(1)}, _config())
    with pytest.raises(ValueError, match="shape"):
        convert_official_crate_alpha({**sd, "transformer.layers.0.1.fn.D": torch.zeros(16, 32)}, _config())


@pytest.mark.slow  # the command end to end
def test_cli_convert_official_prints_max_logit_difference(tmp_path, capsys):
    sd = _official_state_dict(channels=1, dim=64, depth=4, heads=4, classes=10)
    torch.save(sd, tmp_path / "crate_alpha.pth")
    out_dir = tmp_path / "converted"
    rc = cli_main(
        [
            "convert-official",
            str(tmp_path / "crate_alpha.pth"),
            "--preset",
            "crate-alpha-digits",
            "--output-dir",
            str(out_dir),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    line = next(s for s in text.splitlines() if s.startswith("max logit difference"))
    official, saved = (float(tok) for tok in line.replace(",", " ").split() if tok[0].isdigit())
    assert official < 1e-5 and saved == 0.0
    assert json.loads((out_dir / "config.json").read_text())["model_type"] == "crate-alpha"
    assert (out_dir / "preprocessor_config.json").is_file()


def test_config_presets_and_validation():
    base = CrateAlphaConfig.from_preset("crate-alpha-base-16")
    assert (base.hidden_size, base.num_hidden_layers, base.num_attention_heads, base.patch_size) == (768, 12, 12, 16)
    large = CrateAlphaConfig.from_preset("crate-alpha-large-14")
    assert (large.hidden_size, large.num_hidden_layers, large.num_attention_heads, large.head_dim) == (1024, 24, 16, 64)
    assert large.dictionary_size == 4096 and large.layer_norm_eps == 1e-6
    with pytest.raises(ValueError, match="divisible"):
        _config(image_size=9)
    with pytest.raises(ValueError, match="overcomplete_ratio"):
        _config(overcomplete_ratio=0)
    with pytest.raises(ValueError, match="unknown preset"):
        CrateAlphaConfig.from_preset("crate-alpha-giant")


# flex attention compiles its kernel (~30 s on CPU): the slow run
@pytest.mark.parametrize("impl", ["sdpa", pytest.param("flex_attention", marks=pytest.mark.slow)])
def test_attention_implementations_agree(impl):
    if impl == "flex_attention":
        try:
            from torch.nn.attention.flex_attention import flex_attention

            q = torch.randn(1, 1, 4, 4)
            flex_attention(q, q, q)
        except Exception:
            pytest.skip("this torch build has no CPU flex attention")
    model = convert_official_crate_alpha(_official_state_dict(), _config())
    x = torch.randn(2, 3, 8, 8)
    out = {}
    for name in ("eager", impl):
        model.set_attn_implementation(name)
        with torch.no_grad():
            out[name] = model(x, output_hidden_states=True, output_mid_hidden_states=True)
    torch.testing.assert_close(out[impl].logits, out["eager"].logits, rtol=1e-5, atol=1e-5)
    for a, b in zip(out[impl].mid_hidden_states, out["eager"].mid_hidden_states):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_save_reload_identical_logits(tmp_path):
    model = convert_official_crate_alpha(_official_state_dict(), _config())
    model.save_pretrained(tmp_path / "saved")
    files = set(os.listdir(tmp_path / "saved"))
    assert {"model.safetensors", "modeling_crate_alpha.py", "configuration_crate_alpha.py"} <= files
    assert isinstance(AutoConfig.from_pretrained(tmp_path / "saved"), CrateAlphaConfig)
    reloaded = AutoModelForImageClassification.from_pretrained(tmp_path / "saved").eval()
    assert isinstance(reloaded, CrateAlphaForImageClassification)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x).logits
        assert torch.equal(reloaded(x).logits, expected)


def test_subspaces_are_the_heads_rows_of_qkv():
    """``U_k`` (d, p) is ``qkv.weight[k·p:(k+1)·p]ᵀ``: the layout every diagnostic reads the subspaces in."""
    attention = CrateAlphaForImageClassification(_config()).crate_alpha.encoder.layer[0].attention
    U = attention.subspaces()
    assert U.shape == (2, 16, 8)
    for k in range(2):
        assert torch.equal(U[k], attention.qkv.weight[k * 8 : (k + 1) * 8].T)


@pytest.mark.parametrize(
    ("heads", "head_dim", "projected"), [(1, 16, False), (2, 8, True), (2, 16, True), (1, 8, True)]
)
def test_the_output_matrix_is_the_identity_only_for_one_head_of_full_width(heads, head_dim, projected):
    """As the authors' code: no output matrix when K = 1 and p = d (the heads already are the d coordinates)."""
    model = CrateAlphaForImageClassification(_config(num_attention_heads=heads, head_dim=head_dim)).eval()
    attention = model.crate_alpha.encoder.layer[0].attention
    assert (attention.out_proj is not None) == projected
    x = torch.randn(1, 16, 16)
    with torch.no_grad():
        out, _ = attention(x)
        w = attention.qkv(x).view(1, 16, heads, head_dim).transpose(1, 2)
        heads_out = (torch.softmax(w @ w.transpose(-1, -2) / head_dim**0.5, -1) @ w).transpose(1, 2).reshape(1, 16, -1)
    torch.testing.assert_close(out, attention.out_proj(heads_out) if projected else heads_out, rtol=1e-5, atol=1e-6)


def test_attention_maps_on_an_sdpa_model_come_from_the_eager_path():
    model = convert_official_crate_alpha(_official_state_dict(), _config())
    model.set_attn_implementation("sdpa")
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(x, output_attentions=True, output_mid_hidden_states=True, output_hidden_states=True)
    assert len(out.attentions) == 2
    layer = model.crate_alpha.encoder.layer[0]
    with torch.no_grad():
        w = layer.attention.qkv(layer.layernorm_before(out.hidden_states[0])).view(2, 17, 2, 8).transpose(1, 2)
    torch.testing.assert_close(out.attentions[0], torch.softmax(w @ w.transpose(-1, -2) / 8**0.5, -1))
