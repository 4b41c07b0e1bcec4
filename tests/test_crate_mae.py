"""CRATE-MAE: the converter against a forward written from the authors' equations, masking, the encoder alone,
attention implementations and the convert-official command."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel

import hf_tdiag  # noqa: F401
from hf_tdiag.cli import main as cli_main
from hf_tdiag.models.crate_mae import CrateMAEConfig, CrateMAEForPreTraining, CrateMAEModel
from hf_tdiag.models.crate_mae.convert_official import convert_official_crate_mae

D, DEPTH, DEC, HEADS, P, IMG, C = 16, 2, 2, 2, 2, 8, 1


def _sincos(dim, grid):
    """MAE's get_2d_sincos_pos_embed written element by element (numpy meshgrid(w, h): first half = column)."""
    rows = [[0.0] * dim]
    for i in range(grid):
        for j in range(grid):
            row = []
            for pos in (j, i):
                half = dim // 2
                freqs = [1.0 / 10000 ** (m / (half / 2)) for m in range(half // 2)]
                row += [math.sin(pos * f) for f in freqs] + [math.cos(pos * f) for f in freqs]
            rows.append(row)
    return torch.tensor(rows).unsqueeze(0)


def _official_state_dict(seed=0, D=D, DEPTH=DEPTH, DEC=DEC):  # noqa: N803  (the module's names)
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.3):
        return scale * torch.randn(*shape, generator=g)

    n = (IMG // P) ** 2
    sd = {"patch_embed.proj.weight": r(D, C, P, P), "patch_embed.proj.bias": r(D), "cls_token": r(1, 1, D),
          "mask_token": r(1, 1, D), "pos_embed": _sincos(D, IMG // P), "decoder_pos_embed": _sincos(D, IMG // P),
          "norm.weight": 1 + r(D), "norm.bias": r(D), "decoder_embed.weight": r(D, D), "decoder_embed.bias": r(D),
          "decoder_norm.weight": 1 + r(D), "decoder_norm.bias": r(D), "decoder_pred.weight": r(P * P * C, D),
          "decoder_pred.bias": r(P * P * C)}  # fmt: skip
    assert sd["pos_embed"].shape == (1, n + 1, D)
    for i in range(DEPTH):
        p = f"blocks.{i}.layers.0"
        for part in ("0.norm", "1.norm"):
            sd[f"{p}.{part}.weight"], sd[f"{p}.{part}.bias"] = 1 + r(D), r(D)
        sd[f"{p}.0.fn.qkv.weight"], sd[f"{p}.1.fn.weight"] = r(D, D), r(D, D)
        sd[f"{p}.0.fn.to_out.0.weight"], sd[f"{p}.0.fn.to_out.0.bias"] = r(D, D), r(D)
    for i in range(DEC):
        p = f"decoder_blocks.{i}.layers.0"
        for part in ("0.norm", "1.norm"):
            sd[f"{p}.{part}.weight"], sd[f"{p}.{part}.bias"] = 1 + r(D), r(D)
        sd[f"{p}.0.fn.weight"], sd[f"{p}.1.fn.qkv.weight"] = r(D, D), r(D, D)
        sd[f"{p}.1.fn.to_out.0.weight"], sd[f"{p}.1.fn.to_out.0.bias"] = r(D, D), r(D)
    return sd


def _mssa(sd, p, y):
    w = F.linear(y, sd[f"{p}.fn.qkv.weight"]).reshape(*y.shape[:2], HEADS, -1).transpose(1, 2)
    a = torch.softmax(w @ w.transpose(-1, -2) / w.shape[-1] ** 0.5, -1)
    out = (a @ w).transpose(1, 2).reshape(y.shape)
    return F.linear(out, sd[f"{p}.fn.to_out.0.weight"], sd[f"{p}.fn.to_out.0.bias"])


def _equations_forward(sd, img, mask, lam=0.5, eta=0.1):
    """The authors' forward_encoder / forward_decoder / forward_loss with a given mask (1 = masked), float64."""
    sd = {k: v.double() for k, v in sd.items()}
    img = img.double()
    ln = lambda t, p, eps=1e-5: F.layer_norm(t, t.shape[-1:], sd[p + ".weight"], sd[p + ".bias"], eps)  # noqa: E731
    x = F.conv2d(img, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=P).flatten(2).transpose(1, 2)
    x = torch.where(mask.bool()[..., None], sd["mask_token"].expand_as(x), x)
    x = torch.cat([sd["cls_token"].expand(x.shape[0], -1, -1), x], 1) + sd["decoder_pos_embed"]
    for i in range(DEPTH):
        p = f"blocks.{i}.layers.0"
        x = x + _mssa(sd, p + ".0", ln(x, p + ".0.norm"))
        xin, W = ln(x, p + ".1.norm"), sd[p + ".1.fn.weight"]
        x = torch.relu(xin + eta * (F.linear(xin, W.t()) - F.linear(F.linear(xin, W), W.t())) - eta * lam)
    x = ln(x, "norm", 1e-6)
    latent = x
    for i in range(DEC):
        p = f"decoder_blocks.{i}.layers.0"
        y = F.linear(ln(x, p + ".0.norm"), sd[p + ".0.fn.weight"])
        x = y - _mssa(sd, p + ".1", ln(y, p + ".1.norm"))
    pred = F.linear(ln(x, "decoder_norm", 1e-6), sd["decoder_pred.weight"], sd["decoder_pred.bias"])[:, 1:]
    b, g = img.shape[0], IMG // P
    target = torch.einsum("nchpwq->nhwpqc", img.reshape(b, C, g, P, g, P)).reshape(b, g * g, P * P * C)
    loss = (((pred - target) ** 2).mean(-1) * mask).sum() / mask.sum()
    return latent, pred, loss


def _config():
    return CrateMAEConfig(image_size=IMG, patch_size=P, num_channels=C, hidden_size=D, num_hidden_layers=DEPTH,
                          num_attention_heads=HEADS, decoder_num_hidden_layers=DEC, decoder_num_attention_heads=HEADS,
                          mask_ratio=0.75)  # fmt: skip


def test_converter_matches_the_equations_and_masks_as_the_authors():
    sd = _official_state_dict()
    model = convert_official_crate_mae(sd, _config())
    img = torch.randn(3, C, IMG, IMG, generator=torch.Generator().manual_seed(1))
    noise = torch.rand(3, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(img, noise=noise)
    keep = int(16 * (1 - 0.75))
    expected_mask = torch.ones(3, 16)
    for b in range(3):
        expected_mask[b, torch.argsort(noise[b])[:keep]] = 0  # the smallest noise is kept
    assert torch.equal(out.mask, expected_mask)
    latent, pred, loss = _equations_forward(sd, img, expected_mask)
    torch.testing.assert_close(out.logits.double(), pred, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss.double(), loss, rtol=1e-5, atol=1e-5)
    # the encoder alone (no mask) is the same encoder
    with torch.no_grad():
        alone = model.crate_mae(img).last_hidden_state
    torch.testing.assert_close(alone.double(), _equations_forward(sd, img, torch.zeros(3, 16))[0], rtol=1e-5, atol=1e-5)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        torch.testing.assert_close(model(img, noise=noise).logits, out.logits, rtol=1e-5, atol=1e-5)


def test_converter_rejects_bad_state_dicts():
    sd = _official_state_dict()
    with pytest.raises(ValueError, match="missing"):
        convert_official_crate_mae({k: v for k, v in sd.items() if k != "norm.weight"}, _config())
    with pytest.raises(ValueError, match="sine-cosine"):
        convert_official_crate_mae({**sd, "pos_embed": torch.zeros_like(sd["pos_embed"])}, _config())


@pytest.mark.slow  # the command end to end
def test_cli_converts_and_the_encoder_loads_alone(tmp_path, capsys):
    torch.save(_official_state_dict(D=64, DEPTH=4, DEC=2), tmp_path / "mae.pth")  # the crate-mae-digits sizes
    rc = cli_main(["convert-official", str(tmp_path / "mae.pth"), "--preset", "crate-mae-digits", "--output-dir",
                   str(tmp_path / "out")])  # fmt: skip
    assert rc == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("max logit difference"))
    assert line.endswith("0 after reloading")
    encoder = AutoModel.from_pretrained(tmp_path / "out")
    assert isinstance(encoder, CrateMAEModel) and encoder.config.model_type == "crate-mae"


def test_sincos_positions_are_the_float64_formula_bit_for_bit():
    from hf_tdiag.models.crate_mae.modeling_crate_mae import sincos_position_embedding

    assert torch.equal(sincos_position_embedding(64, 14), _sincos(64, 14))  # 14x14 patches, as ViT-B/16 at 224


def test_unpatchify_inverts_patchify_in_the_documented_layout():
    """Patches row by row, the pixels of a patch row by row, channels last; three channels."""
    config = CrateMAEConfig(image_size=4, patch_size=2, num_channels=3, hidden_size=16, num_hidden_layers=1,
                            num_attention_heads=2, decoder_num_hidden_layers=1, decoder_num_attention_heads=2)  # fmt: skip
    model = CrateMAEForPreTraining(config)
    img = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    patches = model.patchify(img)
    assert patches.shape == (2, 4, 12)
    # patch 1 = rows 0-1, columns 2-3; its first entries: pixel (0, 2) in channels 0, 1, 2, then pixel (0, 3)
    assert patches[0, 1, :6].tolist() == [img[0, c, 0, col].item() for col in (2, 3) for c in range(3)]
    assert torch.equal(model.unpatchify(patches), img)


def test_the_loss_over_a_single_masked_patch_is_that_patchs_error():
    config = CrateMAEConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=16, num_hidden_layers=1,
                            num_attention_heads=2, decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
                            mask_ratio=1 / 16)  # fmt: skip
    torch.manual_seed(0)
    model = CrateMAEForPreTraining(config).eval()
    img = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(img, noise=torch.rand(1, 16, generator=torch.Generator().manual_seed(2)))
    assert float(out.mask.sum()) == 1.0
    n = int(out.mask[0].argmax())
    expected = ((out.logits[0, n] - model.patchify(img)[0, n]) ** 2).mean()
    torch.testing.assert_close(out.loss, expected)


def test_one_head_has_no_output_matrix():
    """As the authors' code: with K = 1 (p = d) the MSSA output is the head itself."""
    config = CrateMAEConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=16, num_hidden_layers=1,
                            num_attention_heads=1, decoder_num_hidden_layers=1, decoder_num_attention_heads=1)  # fmt: skip
    torch.manual_seed(0)
    attention = CrateMAEModel(config).encoder[0].attention
    assert attention.out_proj is None
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        out, _ = attention(x)
        w = attention.qkv(x)
        expected = torch.softmax(w @ w.transpose(-1, -2) / 4.0, -1) @ w
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_the_decoder_dictionary_starts_kaiming_uniform_as_the_authors():
    """Bound sqrt(6 / d) (Kaiming-uniform, fan-in d), not Xavier's sqrt(6 / 2d): a branch on the decoder layer was
    skipped by transformers (a remote-code module without parameters of its own), leaving Xavier."""
    config = CrateMAEConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=1,
                            num_attention_heads=2, decoder_num_hidden_layers=2, decoder_num_attention_heads=2)  # fmt: skip
    torch.manual_seed(0)
    model = CrateMAEForPreTraining(config)
    bound = math.sqrt(6 / 64)
    for layer in model.decoder.layer:
        w = layer.dictionary.weight
        assert float(w.abs().max()) <= bound and float(w.abs().max()) > 0.95 * bound
        assert float(w.std()) == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert float(model.decoder.decoder_pred.weight.abs().max()) <= math.sqrt(6 / (64 + 4))  # Xavier elsewhere
