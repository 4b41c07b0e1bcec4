"""CRATE-MAE beyond tests/test_crate_mae.py's equations: what the sampled mutation run of modeling_crate_mae.py found
untested — the embeddings' default mask token; the second sample: the embeddings' own shape check, the fixed positions,
both blocks' LayerNorm epsilon — against computations written here."""

from __future__ import annotations

import pytest
import torch

from hf_tdiag.models.crate_mae import CrateMAEConfig
from hf_tdiag.models.crate_mae.modeling_crate_mae import CrateMAEEmbeddings, sincos_position_embedding


def _config() -> CrateMAEConfig:
    return CrateMAEConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=8, num_hidden_layers=1,
                          num_attention_heads=2, decoder_num_hidden_layers=1, decoder_num_attention_heads=2)  # fmt: skip


def test_the_embeddings_alone_carry_a_mask_token_and_put_it_in_the_masked_patches():
    """By default (the pre-training encoder's) the embeddings hold a mask token: a masked patch's token is the mask
    token plus its position, an unmasked one the patch projection plus its position (CLS first)."""
    torch.manual_seed(0)
    emb = CrateMAEEmbeddings(_config())
    assert emb.mask_token is not None
    with torch.no_grad():
        emb.mask_token.copy_(torch.randn(1, 1, 8))
        emb.cls_token.copy_(torch.randn(1, 1, 8))
        emb.position_embeddings.copy_(sincos_position_embedding(8, 2))
        x = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(1))
        mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
        out = emb(x, mask)
    pos = emb.position_embeddings[0]
    # the patches row by row: patch (r, c) is x[..., 4r:4r+4, 4c:4c+4], projected by the 4x4 convolution
    for i, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        patch = x[0, 0, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4]
        projected = (emb.projection.weight[:, 0] * patch).sum((-1, -2)) + emb.projection.bias
        token = emb.mask_token[0, 0] if mask[0, i] else projected
        torch.testing.assert_close(out[0, 1 + i], token + pos[1 + i], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[0, 0], emb.cls_token[0, 0] + pos[0])


def test_the_normalized_pixel_loss_standardizes_each_target_patch():
    """norm_pix_loss (MAE's option): each target patch minus its mean over its p·p·C pixels, divided by
    sqrt(unbiased variance + 1e-6); the loss is the mean squared error over the masked patches only."""
    from hf_tdiag.models.crate_mae import CrateMAEForPreTraining

    config = _config()
    config.norm_pix_loss = True
    torch.manual_seed(0)
    model = CrateMAEForPreTraining(config).eval()
    g = torch.Generator().manual_seed(2)
    pixels = 2 + 3 * torch.randn(2, 1, 8, 8, generator=g, dtype=torch.float64)  # mean 2: the centring matters
    pred = torch.randn(2, 4, 16, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    total, count = 0.0, 0
    for b in range(2):
        for i, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
            if not mask[b, i]:
                continue
            patch = [float(v) for v in pixels[b, 0, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4].flatten()]
            mean = sum(patch) / 16
            var = sum((v - mean) ** 2 for v in patch) / 15
            target = [(v - mean) / (var + 1e-6) ** 0.5 for v in patch]
            total += sum((float(pred[b, i, j]) - target[j]) ** 2 for j in range(16)) / 16
            count += 1
    loss = model.forward_loss(pixels, pred, mask)
    assert abs(float(loss) - total / count) < 1e-10


def test_the_embeddings_alone_refuse_an_image_of_another_size():
    """CrateMAEEmbeddings called directly checks the whole shape, not only the number of dimensions: a 4-D 12x12
    image on an 8x8 model is refused with the expected shape named."""
    emb = CrateMAEEmbeddings(_config())
    with pytest.raises(ValueError, match=r"\(batch, 1, 8, 8\), got \(1, 1, 12, 12\)"):
        emb(torch.zeros(1, 1, 12, 12))
    with pytest.raises(ValueError, match=r"\(batch, 1, 8, 8\), got \(1, 2, 8, 8\)"):
        emb(torch.zeros(1, 2, 8, 8))


def _layernorm(x: torch.Tensor, eps: float) -> torch.Tensor:
    centred = x - x.mean(-1, keepdim=True)
    return centred / (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def test_the_decoder_block_normalizes_with_the_configured_epsilon():
    """The decoder block y = D·LN1(x), x⁺ = y − MSSA(LN2 y), both LayerNorms at layer_norm_eps (0.37, far from
    torch's 1e-5): LN and D written out here, on inputs of small spread (where the epsilon matters)."""
    from hf_tdiag.models.crate_mae.modeling_crate_mae import CrateMAEDecoderLayer

    config = CrateMAEConfig(**{**_config().to_dict(), "layer_norm_eps": 0.37})
    torch.manual_seed(0)
    layer = CrateMAEDecoderLayer(config).eval()
    x = 0.3 * torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = layer(x)
        y = _layernorm(x, 0.37) @ layer.dictionary.weight.T  # the LayerNorms start at weight 1, bias 0
        want = y - layer.attention(_layernorm(y, 0.37))[0]
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


def test_the_position_embeddings_are_fixed():
    """MAE's sine-cosine positions are a constant, not a parameter to train: no gradient, and out of the trainable
    parameters (the CLS token, beside them, is trained)."""
    emb = CrateMAEEmbeddings(_config())
    assert emb.position_embeddings.requires_grad is False
    trainable = {name for name, p in emb.named_parameters() if p.requires_grad}
    assert "position_embeddings" not in trainable and "cls_token" in trainable


def test_the_encoder_block_normalizes_with_the_configured_epsilon():
    """Z½ = Z + MSSA(LN1 Z), Z⁺ = ISTA(LN2 Z½), both LayerNorms at layer_norm_eps (0.37), written out here."""
    from hf_tdiag.models.crate_mae.modeling_crate_mae import CrateMAEEncoderLayer

    config = CrateMAEConfig(**{**_config().to_dict(), "layer_norm_eps": 0.37})
    torch.manual_seed(0)
    layer = CrateMAEEncoderLayer(config).eval()
    z = 0.3 * torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out, mid = layer(z)
        want_mid = z + layer.attention(_layernorm(z, 0.37))[0]
        want_out = layer.ista(_layernorm(want_mid, 0.37))
    torch.testing.assert_close(mid, want_mid, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)


# the full run of modeling_crate_mae.py (every mutant): the survivors' tests


def test_an_encoder_without_a_mask_token_loads_a_state_dict_that_has_none():
    """The classifier's embeddings (no mask token) drop a pre-training checkpoint's mask token if there is one, and
    load their own state dict, which has none, without a KeyError; the loaded values are the saved ones."""
    torch.manual_seed(0)
    source = CrateMAEEmbeddings(_config(), use_mask_token=False)
    with torch.no_grad():
        source.cls_token.copy_(torch.randn(1, 1, 8))
    target = CrateMAEEmbeddings(_config(), use_mask_token=False)
    state = source.state_dict()
    assert "mask_token" not in state
    target.load_state_dict(state)
    torch.testing.assert_close(target.cls_token, source.cls_token, rtol=0, atol=0)
    pretrained = CrateMAEEmbeddings(_config()).state_dict()  # with a mask token: dropped, strict loading holds
    target.load_state_dict(pretrained)
    assert target.mask_token is None


def test_the_random_mask_is_drawn_on_the_requested_device():
    """Without noise the uniform noise is drawn on the device asked for (the meta device here: a CPU draw would give a
    CPU mask); with noise given, the N·(1 − mask_ratio) smallest entries are kept (0) and the rest masked (1)."""
    emb = CrateMAEEmbeddings(_config()).to("meta")
    assert emb.random_mask(2, 4, torch.device("meta")).device.type == "meta"
    emb = CrateMAEEmbeddings(_config())
    noise = torch.tensor([[0.9, 0.1, 0.5, 0.3], [0.2, 0.8, 0.4, 0.6]])
    keep = int(4 * (1 - _config().mask_ratio))
    want = torch.zeros(2, 4)
    for b in range(2):
        order = sorted(range(4), key=lambda i: float(noise[b, i]))
        for i in order[keep:]:
            want[b, i] = 1.0
    torch.testing.assert_close(emb.random_mask(2, 4, None, noise), want, rtol=0, atol=0)


@pytest.mark.parametrize("num_labels", [0, 1, 3])
def test_the_classifier_head_is_a_linear_map_of_the_pooled_token_or_the_identity_without_labels(num_labels):
    """``num_labels`` labels: logits = W·pooled + b, a linear map to ``num_labels`` (one label: a regression head, a
    (d → 1) map); no labels: the head is the identity and the logits are the normalized CLS token itself. The model's
    ``num_labels`` is the config's (transformers' heads expose it)."""
    from hf_tdiag.models.crate_mae import CrateMAEForImageClassification

    config = CrateMAEConfig(**{**_config().to_dict(), "num_labels": num_labels})
    torch.manual_seed(0)
    model = CrateMAEForImageClassification(config).eval()
    assert model.num_labels == num_labels
    pixels = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pooled = model.crate_mae(pixels).pooler_output
        logits = model(pixels).logits
    if num_labels == 0:
        assert list(model.classifier.parameters()) == []
        torch.testing.assert_close(logits, pooled, rtol=0, atol=0)
    else:
        weight, bias = model.classifier.weight, model.classifier.bias
        assert weight.shape == (num_labels, 8)
        want = torch.stack([torch.stack([sum(pooled[b, j] * weight[i, j] for j in range(8)) + bias[i]
                                         for i in range(num_labels)]) for b in range(2)])  # fmt: skip
        torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-6)


def test_the_decoder_normalizes_at_the_final_epsilon_and_predicts_p_squared_c_pixels_per_patch():
    """CrateMAEDecoder: its blocks, then LayerNorm at final_layer_norm_eps (0.37 here, far from torch's 1e-5, on
    inputs of small spread), then a linear map to p·p·C = 16 pixels per patch (p = 4, C = 1: not p·2·C = 8), the CLS
    token dropped — the blocks' output and the map written out here."""
    from hf_tdiag.models.crate_mae.modeling_crate_mae import CrateMAEDecoder

    config = CrateMAEConfig(**{**_config().to_dict(), "final_layer_norm_eps": 0.37})
    torch.manual_seed(0)
    decoder = CrateMAEDecoder(config).eval()
    x = 0.3 * torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pred = decoder(x)
        hidden = decoder.layer[0](x)
        want = _layernorm(hidden, 0.37) @ decoder.decoder_pred.weight.T + decoder.decoder_pred.bias
    assert decoder.decoder_pred.weight.shape == (16, 8)
    assert pred.shape == (2, 4, 16)
    torch.testing.assert_close(pred, want[:, 1:], rtol=1e-5, atol=1e-6)


def test_under_autocast_the_mask_token_takes_the_patch_tokens_dtype():
    """Under CPU bfloat16 autocast the convolution gives bfloat16 patch tokens and the mask token is cast to their
    dtype before it replaces the masked ones: a masked token is the mask token rounded to bfloat16 (then promoted back
    by the concatenation with the float32 CLS token), plus its position — not the float32 mask token."""
    torch.manual_seed(0)
    emb = CrateMAEEmbeddings(_config())
    with torch.no_grad():
        emb.mask_token.copy_(torch.tensor([0.1, 0.2, 0.3, 0.7, -0.9, 1.1, 1.3, -0.01]).reshape(1, 1, 8))
        emb.position_embeddings.copy_(sincos_position_embedding(8, 2))
        mask = torch.tensor([[0.0, 1.0, 0.0, 1.0]])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = emb(torch.randn(1, 1, 8, 8), mask)
    rounded = emb.mask_token[0, 0].to(torch.bfloat16).float()
    assert not torch.equal(rounded, emb.mask_token[0, 0])  # the rounding is visible
    for i in (1, 3):
        torch.testing.assert_close(out[0, 1 + i].float(), rounded + emb.position_embeddings[0, 1 + i], rtol=0, atol=0)


def test_the_linear_maps_start_xavier_uniform_with_zero_biases_and_the_dictionaries_kaiming_uniform():
    """Every Linear but the decoder's dictionaries starts Xavier-uniform: inside ±sqrt(6 / (fan_in + fan_out)) and
    spread over it (its largest entry beyond 3/4 of the bound; transformers' default normal of std 0.02 stays far
    inside), with a zero bias; the dictionaries Kaiming-uniform at torch's default a = 0 (gain sqrt(2): bound sqrt(6 / fan_in))."""
    from hf_tdiag.models.crate_mae import CrateMAEForPreTraining

    torch.manual_seed(0)
    model = CrateMAEForPreTraining(_config())
    seen = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        fan_out, fan_in = module.weight.shape
        kaiming = name.endswith("dictionary")
        bound = (6 / fan_in) ** 0.5 if kaiming else (6 / (fan_in + fan_out)) ** 0.5
        largest = float(module.weight.abs().max())
        assert 0.75 * bound < largest <= bound, (name, largest, bound)
        if module.bias is not None:
            assert torch.count_nonzero(module.bias) == 0, name
        seen += 1
    assert seen >= 5  # qkv and out_proj of both blocks, the dictionary, the pixel map
