"""CRATE-α beyond the converter's equations (tests/test_crate_alpha.py): what the full mutation run of
modeling_crate_alpha.py found untested — the head's attributes, dropout in training, mean pooling, the head without
labels, the loss (the second sample: a fresh model not checkpointing) — each against a computation written here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification, CrateAlphaModel


def _config(**kw) -> CrateAlphaConfig:
    fields = dict(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=2,
                  num_attention_heads=2, num_labels=3)  # fmt: skip
    return CrateAlphaConfig(**{**fields, **kw})


def _pixels(seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def test_the_classifier_carries_its_label_count():
    assert CrateAlphaForImageClassification(_config(num_labels=7)).num_labels == 7


def _dropout_pattern(train: torch.Tensor, ref: torch.Tensor, p: float) -> float:
    """Each entry of a dropout output is 0 or ref / (1 - p); returns the share of zeros."""
    zero = train == 0
    torch.testing.assert_close(train[~zero], ref[~zero] / (1 - p), rtol=1e-5, atol=1e-6)
    return zero.float().mean().item()


def test_the_embeddings_and_the_attention_output_drop_in_training_only():
    torch.manual_seed(0)
    model = CrateAlphaModel(_config(hidden_dropout_prob=0.5)).eval()
    x = _pixels()
    emb, layer = model.embeddings, model.encoder.layer[0]
    with torch.no_grad():
        ref = emb(x)
        assert torch.equal(emb(x), ref)  # eval: no dropout
        emb.train()
        share = _dropout_pattern(emb(x), ref, 0.5)
        assert 0.3 < share < 0.7
        h = layer.layernorm_before(ref)
        attn_ref, _ = layer.attention(h)
        layer.attention.train()
        attn_train, _ = layer.attention(h)
        share = _dropout_pattern(attn_train, attn_ref, 0.5)
        assert 0.3 < share < 0.7


def test_attention_dropout_drops_probabilities_in_training_only():
    torch.manual_seed(0)
    model = CrateAlphaModel(_config(attention_probs_dropout_prob=0.5, attn_implementation="eager"))
    attention = model.encoder.layer[0].attention
    h = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        attention.eval()
        ref, probs = attention(h)
        attention.train()
        torch.manual_seed(3)
        train, _ = attention(h)
    # by hand: the same dropout draw on the probabilities, then the heads' values and the output matrix
    w = attention.qkv(h).view(2, 5, 2, 8).transpose(1, 2)
    torch.manual_seed(3)
    dropped = F.dropout(probs, p=0.5, training=True)
    expected = attention.out_proj((dropped @ w).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(train, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(train, ref)


def test_mean_pooling_is_the_token_mean_and_cls_pooling_the_first_token():
    torch.manual_seed(0)
    x = _pixels()
    with torch.no_grad():
        for pooling in ("mean", "cls"):
            out = CrateAlphaModel(_config(pooling=pooling)).eval()(x)
            want = out.last_hidden_state.mean(dim=1) if pooling == "mean" else out.last_hidden_state[:, 0]
            torch.testing.assert_close(out.pooler_output, want)


def test_without_labels_the_head_returns_the_normed_pooled_token_with_the_configured_epsilon():
    torch.manual_seed(0)
    model = CrateAlphaForImageClassification(_config(num_labels=0, classifier_layer_norm_eps=0.5)).eval()
    x = _pixels()
    with torch.no_grad():
        pooled = model.crate_alpha(x).pooler_output
        logits = model(x).logits
    torch.testing.assert_close(logits, F.layer_norm(pooled, (16,), model.classifier_norm.weight,
                                                    model.classifier_norm.bias, model.config.classifier_layer_norm_eps))  # fmt: skip


def test_the_loss_is_the_cross_entropy_of_the_logits_and_float64_pixels_are_cast():
    torch.manual_seed(0)
    model = CrateAlphaForImageClassification(_config()).eval()
    x = _pixels()
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        out = model(x.double(), labels=labels)
        ref = model(x)
    assert out.logits.dtype == torch.float32
    torch.testing.assert_close(out.logits, ref.logits)
    torch.testing.assert_close(out.loss, F.cross_entropy(ref.logits, labels))


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_the_head_returns_every_recorded_state(impl):
    torch.manual_seed(0)
    model = CrateAlphaForImageClassification(_config(attn_implementation=impl)).eval()
    with torch.no_grad():
        out = model(_pixels(), output_hidden_states=True, output_attentions=True, output_mid_hidden_states=True)
        base = model.crate_alpha(_pixels(), output_hidden_states=True, output_mid_hidden_states=True)
    assert len(out.hidden_states) == 3 and len(out.mid_hidden_states) == 2 and len(out.attentions) == 2
    for a, b in zip(
        out.hidden_states + out.mid_hidden_states, base.hidden_states + base.mid_hidden_states, strict=True
    ):
        torch.testing.assert_close(a, b)
    for probs in out.attentions:
        torch.testing.assert_close(probs.sum(-1), torch.ones(2, 2, 5))


def test_one_label_is_a_regression_head_with_the_squared_error():
    torch.manual_seed(0)
    model = CrateAlphaForImageClassification(_config(num_labels=1)).eval()
    x = _pixels()
    target = torch.tensor([0.5, -1.0])
    with torch.no_grad():
        out = model(x, labels=target)
        pooled = model.classifier_norm(model.crate_alpha(x).pooler_output)
    assert out.logits.shape == (2, 1)
    torch.testing.assert_close(out.logits, pooled @ model.classifier.weight.t() + model.classifier.bias)
    torch.testing.assert_close(out.loss, ((out.logits.squeeze(-1) - target) ** 2).mean())


@pytest.mark.parametrize("field", ["image_size", "patch_size"])
def test_a_size_set_wrong_after_the_config_was_built_is_named_by_the_model(field):
    """A config attribute changed after construction is checked again when the model is built: the message names it."""
    config = _config()
    setattr(config, field, "eight")
    with pytest.raises(TypeError, match=rf"^{field}: expected an int or a \(height, width\) pair of ints, got 'eight'"):
        CrateAlphaModel(config)


def _layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def test_the_block_normalizes_with_the_configured_epsilon():
    """z½ = z + MSSA(LN1 z), z⁺ = z½ + code(LN2 z½), both LayerNorms at layer_norm_eps (0.37, far from torch's 1e-5)."""
    torch.manual_seed(0)
    layer = CrateAlphaModel(_config(layer_norm_eps=0.37)).eval().encoder.layer[0]
    z = 0.3 * torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))  # small spread: eps matters
    with torch.no_grad():
        out, mid = layer(z)
        ln1, ln2 = layer.layernorm_before, layer.layernorm_after
        want_mid = z + layer.attention(_layernorm(z, ln1.weight, ln1.bias, 0.37))[0]
        want_out = want_mid + layer.sparse_coding(_layernorm(want_mid, ln2.weight, ln2.bias, 0.37))
    torch.testing.assert_close(mid, want_mid, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)


def test_a_non_square_patch_makes_a_rows_by_columns_grid():
    """patch (2, 4) on an 8x8 image: a 4 x 2 grid, 8 patch tokens (rows from the patch height, columns from its width)."""
    torch.manual_seed(0)
    model = CrateAlphaModel(_config(patch_size=(2, 4))).eval()
    assert model.embeddings.grid_size == (4, 2)
    x = _pixels()
    with torch.no_grad():
        out = model(x)
    assert out.last_hidden_state.shape == (2, 1 + 8, 16)


def test_a_fresh_model_does_not_checkpoint_until_asked():
    """Activation checkpointing is off in a new model (the Trainer and transformers read it) until enabled."""
    model = CrateAlphaModel(_config())
    assert model.is_activation_checkpointing is False
    model.activation_checkpointing_enable()
    assert model.is_activation_checkpointing is True


def test_a_non_square_image_makes_a_rows_by_columns_grid():
    """The full run: an 8 x 16 image in 4 x 4 patches is a 2 x 4 grid (rows from the image height, columns from its
    width); the embeddings are the CLS token, then each patch's convolution in row-major order, plus the positions."""
    torch.manual_seed(0)
    emb = CrateAlphaModel(_config(image_size=(8, 16))).eval().embeddings
    assert emb.grid_size == (2, 4) and emb.position_embeddings.shape == (1, 9, 16)
    x = torch.randn(2, 1, 8, 16, generator=torch.Generator().manual_seed(1))
    weight = emb.projection.weight.reshape(16, -1)  # (d, channels * 4 * 4)
    patches = [x[:, :, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4].reshape(2, -1) for r in range(2) for c in range(4)]
    tokens = torch.stack([p @ weight.T + emb.projection.bias for p in patches], dim=1)
    want = torch.cat((emb.cls_token.expand(2, 1, 16), tokens), dim=1) + emb.position_embeddings
    with torch.no_grad():
        torch.testing.assert_close(emb(x), want, rtol=1e-5, atol=1e-6)


def test_the_cls_token_and_the_positions_start_as_zero_mean_normals_of_the_configured_spread():
    """_init_weights draws the CLS token and the position embeddings from N(0, initializer_range²) (truncated at ±2,
    far out at std 0.02): their sample means sit within 4 standard errors of 0 and their spreads near 0.02."""
    torch.manual_seed(0)
    emb = CrateAlphaModel(_config(hidden_size=64, initializer_range=0.02)).embeddings
    for name, param in (("cls_token", emb.cls_token), ("position_embeddings", emb.position_embeddings)):
        values = param.detach().flatten().double()
        assert abs(float(values.mean())) < 4 * 0.02 / values.numel() ** 0.5, name
        assert 0.015 < float(values.std()) < 0.025, name
