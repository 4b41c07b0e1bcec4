"""ToST beyond tests/test_tost.py's equations: what the sampled mutation run of modeling_tost.py found untested —
the Fourier position features computed in float64 for a float64 model and cast to a bfloat16 model's dtype, the causal
second moment's constant, the subspaces ``U_k`` read from the projection; the second sample: TSSA's dropout of the gain in
training — against computations written here."""

from __future__ import annotations

import math

import pytest
import torch

from hf_tdiag.models.tost import TostConfig, TostModel, token_statistics_attention
from hf_tdiag.models.tost.modeling_tost import TostPositionEncoding


def _features(height: int, width: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """``(2·dim, H, W)`` in float64: row features then column features, each ``sin(t/T^(2⌊i/2⌋/dim))`` at even ``i``
    and ``cos`` at odd ``i``, where ``t`` is the 1-based row (column) index over ``H`` (``W``), times 2π."""
    out = torch.zeros(2 * dim, height, width, dtype=torch.float64)
    for r in range(height):
        for c in range(width):
            for axis, t in enumerate(((r + 1) / (height + 1e-6), (c + 1) / (width + 1e-6))):
                for i in range(dim):
                    angle = t * 2 * math.pi / temperature ** (2 * (i // 2) / dim)
                    out[axis * dim + i, r, c] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    return out


def _encoding(dtype: torch.dtype) -> TostPositionEncoding:
    config = TostConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, position_hidden_dim=6)  # fmt: skip
    torch.manual_seed(0)
    return TostPositionEncoding(config).to(dtype)


def _expected(enc: TostPositionEncoding, height: int, width: int) -> torch.Tensor:
    weight = enc.token_projection.weight.double()[:, :, 0, 0]
    feats = _features(height, width, enc.hidden_dim).reshape(2 * enc.hidden_dim, -1)  # patches row by row
    return (weight @ feats).T + enc.token_projection.bias.double()  # (H·W, d)


def test_a_float64_model_gets_the_features_in_float64():
    enc = _encoding(torch.float64)
    with torch.no_grad():
        pos = enc(2, 3, 5)
    assert pos.dtype == torch.float64 and pos.shape == (2, 15, 8)
    torch.testing.assert_close(pos[0], _expected(enc, 3, 5), rtol=1e-12, atol=1e-12)  # float32 features: ~1e-7 off
    torch.testing.assert_close(pos[1], pos[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_features_take_the_models_dtype(dtype):
    enc = _encoding(dtype)
    with torch.no_grad():
        pos = enc(1, 3, 5)
    assert pos.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(pos[0].double(), _expected(enc, 3, 5), rtol=tol, atol=tol)


def test_the_causal_second_moment_divides_by_the_membership_sum_plus_1e_8():
    """s_k(t) = Σ_{n<=t} Π_k(n) w_k(n)² / (Σ_{n<=t} Π_k(n) + 1e-8), the authors' constant, in float64 by loops; a
    large temperature on one head makes that head's membership tiny (about 1e-7), where the constant matters."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1, 2, 5, 3, generator=g, dtype=torch.float64)
    tau = torch.tensor([[8.0], [0.0]], dtype=torch.float64)
    out, pi = token_statistics_attention(w, tau, causal=True)
    for k in range(2):
        for t in range(5):
            weight = sum(float(pi[0, k, n]) for n in range(t + 1))
            for i in range(3):
                second = sum(float(pi[0, k, n]) * float(w[0, k, n, i]) ** 2 for n in range(t + 1)) / (weight + 1e-8)
                want = -float(pi[0, k, t]) * float(w[0, k, t, i]) / (1 + second)
                assert abs(float(out[0, k, t, i]) - want) <= 1e-12 * max(1.0, abs(want))
    assert float(pi[0, 1].min()) < 1e-5  # the regime where +1e-8 and -1e-8 differ


def test_the_subspaces_are_the_projection_rows_of_each_head():
    """U has shape (K, d, p): U_k's columns are rows k·p … (k+1)·p − 1 of qkv.weight, so U_kᵀ x + b_k is the head's w."""
    config = TostConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, qkv_bias=True)  # fmt: skip
    torch.manual_seed(0)
    tssa = TostModel(config).layer[0].attention
    u = tssa.subspaces()
    assert u.shape == (2, 8, 4)
    for k in range(2):
        for j in range(4):
            torch.testing.assert_close(u[k, :, j], tssa.qkv.weight[4 * k + j])
    x = torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        w = tssa.head_projections(x)
        for k in range(2):
            torch.testing.assert_close(w[0, k], x[0] @ u[k] + tssa.qkv.bias[4 * k : 4 * k + 4])


def test_tssa_drops_the_gain_in_training_only():
    """TSSA in training applies its attention dropout to the gain 1/(1+s) (written out here: squared projections
    normalised over tokens, Π = softmax over heads, s = Π-weighted second moment), the same draw; in eval no dropout."""
    config = TostConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=8, num_hidden_layers=1,
                        num_attention_heads=2, attention_probs_dropout_prob=0.5, hidden_dropout_prob=0.0)  # fmt: skip
    torch.manual_seed(0)
    tssa = TostModel(config).layer[0].attention
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        tssa.eval()
        ref, _ = tssa(x)
        tssa.train()
        torch.manual_seed(3)
        train, _ = tssa(x)
        w = tssa.qkv(x).view(2, 5, 2, 4).transpose(1, 2)  # (B, K, N, p)
        normed = (w * w) / (w * w).sum(dim=-2, keepdim=True)
        pi = torch.softmax(normed.sum(-1) * tssa.temp, dim=1)
        second = ((pi / pi.sum(-1, keepdim=True)).unsqueeze(-1) * w * w).sum(-2, keepdim=True)
        gain = 1 / (1 + second)
        torch.manual_seed(3)
        dropped = torch.nn.functional.dropout(gain, p=0.5, training=True)

        def out(g):
            heads = -(w * pi.unsqueeze(-1)) * g
            return tssa.out_proj(heads.transpose(1, 2).reshape(2, 5, 8))

        torch.testing.assert_close(ref, out(gain), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(train, out(dropped), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(train, ref)


# the full run of modeling_tost.py (every mutant): the survivors' tests


def _config(**overrides) -> TostConfig:
    return TostConfig(**{**dict(image_size=8, patch_size=4, num_channels=1, hidden_size=8, num_hidden_layers=1,
                                num_attention_heads=2, position_hidden_dim=6), **overrides})  # fmt: skip


def test_the_patch_stem_refuses_other_channels_and_sides_the_patch_does_not_divide():
    """TostPatchEmbeddings called directly: a 4-D image of 2 channels on a 1-channel stem is refused (not left to the
    convolution), and so is a height or a width alone that patch_size 4 does not divide (the stride-2 convolutions
    would pad and run); each message names the shape."""
    from hf_tdiag.models.tost.modeling_tost import TostPatchEmbeddings

    stem = TostPatchEmbeddings(_config())
    with pytest.raises(ValueError, match=r"\(batch, 1, height, width\), got \(1, 2, 8, 8\)"):
        stem(torch.zeros(1, 2, 8, 8))
    with pytest.raises(ValueError, match=r"spatial size \(6, 8\) must be divisible by patch_size 4"):
        stem(torch.zeros(1, 1, 6, 8))
    with pytest.raises(ValueError, match=r"spatial size \(8, 6\) must be divisible by patch_size 4"):
        stem(torch.zeros(1, 1, 8, 6))


def test_the_patch_stem_returns_a_rows_by_columns_grid_for_a_non_square_image():
    """An 8x16 image in 4x4 patches: 2 rows by 4 columns, the tokens the stem's output feature map read row by row."""
    from hf_tdiag.models.tost.modeling_tost import TostPatchEmbeddings

    torch.manual_seed(0)
    stem = TostPatchEmbeddings(_config()).eval()
    pixels = torch.randn(1, 1, 8, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        tokens, grid = stem(pixels)
        fmap = stem.proj(pixels)
    assert grid == (2, 4)
    assert fmap.shape == (1, 8, 2, 4)
    for r in range(2):
        for c in range(4):
            torch.testing.assert_close(tokens[0, 4 * r + c], fmap[0, :, r, c], rtol=0, atol=0)


@pytest.mark.parametrize("num_labels", [0, 1, 3])
def test_the_classifier_head_is_a_linear_map_of_the_pooled_token_or_the_identity_without_labels(num_labels):
    """``num_labels`` labels: logits = W·pooled + b, a (d → num_labels) map (one label: a regression head); no labels:
    the head is the identity and the logits are the normalized CLS token itself. The model's ``num_labels`` is the
    config's."""
    from hf_tdiag.models.tost import TostForImageClassification

    torch.manual_seed(0)
    model = TostForImageClassification(_config(num_labels=num_labels)).eval()
    assert model.num_labels == num_labels
    pixels = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pooled = model.tost(pixels).pooler_output
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


def test_the_position_features_are_built_on_the_projections_device_by_default():
    """Without a device argument the Fourier features are built where the 1x1 projection lives (the meta device
    here: features built on the CPU could not meet a meta weight)."""
    enc = TostPositionEncoding(_config()).to("meta")
    pos = enc(1, 2, 3)
    assert pos.device.type == "meta" and pos.shape == (1, 6, 8)


def test_a_causal_tssa_lets_no_token_see_a_later_one():
    """config.causal: the TSSA's output at tokens 0..2 does not change when token 3 does (cumulative statistics), and
    equals the causal formula on the head projections mapped by out_proj; the non-causal TSSA's does change."""
    from hf_tdiag.models.tost.modeling_tost import TostTSSA

    torch.manual_seed(0)
    causal = TostTSSA(_config(causal=True)).eval()
    x = torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[0, 3] += 1.0
    with torch.no_grad():
        out_x, out_y = causal(x)[0], causal(y)[0]
        heads, _ = token_statistics_attention(causal.head_projections(x), causal.temp, causal=True)
        want = causal.out_proj(heads.transpose(1, 2).reshape(1, 4, 8))
    torch.testing.assert_close(out_x[0, :3], out_y[0, :3], rtol=0, atol=0)
    torch.testing.assert_close(out_x, want, rtol=1e-6, atol=1e-6)
    full = TostTSSA(_config()).eval()
    full.load_state_dict(causal.state_dict())
    with torch.no_grad():
        assert not torch.allclose(full(x)[0][0, :3], full(y)[0][0, :3])


def test_tssa_in_eval_applies_no_dropout_to_the_gain():
    """attention_probs_dropout_prob = 0.5 in eval: the TSSA output is the dropout-free formula, the same on every call."""
    from hf_tdiag.models.tost.modeling_tost import TostTSSA

    torch.manual_seed(0)
    tssa = TostTSSA(_config(attention_probs_dropout_prob=0.5)).eval()
    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        heads, _ = token_statistics_attention(tssa.head_projections(x), tssa.temp)
        want = tssa.out_proj(heads.transpose(1, 2).reshape(2, 4, 8))
        torch.testing.assert_close(tssa(x)[0], want, rtol=1e-6, atol=1e-6)


def test_the_class_attention_drops_its_probabilities_in_training():
    """Eager class attention with attention_probs_dropout_prob = 0.5 in training: the CLS output is
    proj(dropout(softmax(q₀ kᵀ / sqrt(p))) v), dropout drawn with the same seed here; the probabilities it returns are
    undropped. In eval, no dropout."""
    import torch.nn.functional as F

    from hf_tdiag.models.tost.modeling_tost import TostClassAttention

    config = _config(attention_probs_dropout_prob=0.5)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    attn = TostClassAttention(config).train()
    x = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        q, k, v = attn.qkv(x).reshape(1, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)
        probs = torch.softmax(q[:, :, :1] @ k.transpose(-1, -2) / 2.0, dim=-1)  # sqrt(head_dim 4) = 2
        torch.manual_seed(7)
        dropped = F.dropout(probs, p=0.5, training=True)
        want = attn.proj((dropped @ v).transpose(1, 2).reshape(1, 1, 8))
        torch.manual_seed(7)
        out, got_probs = attn(x)
        assert not torch.allclose(dropped, probs)
        torch.testing.assert_close(out[:, :1], want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out[:, 1:], x[:, 1:], rtol=0, atol=0)
        torch.testing.assert_close(got_probs, probs, rtol=1e-5, atol=1e-6)
        attn.eval()
        undropped = attn.proj((probs @ v).transpose(1, 2).reshape(1, 1, 8))
        torch.testing.assert_close(attn(x)[0][:, :1], undropped, rtol=1e-5, atol=1e-6)


def test_the_second_moment_divides_by_the_membership_sum_plus_1e_8():
    """Non-causal: s_k = Σ_n Π_k(n) w_k(n)² / (Σ_n Π_k(n) + 1e-8), in float64 by loops; a large temperature on one
    head makes the other head's membership tiny (about 1e-11 per token), where the constant's sign matters."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1, 2, 5, 3, generator=g, dtype=torch.float64)
    w[0, 0] = w[0, 0].sign()  # head 0: every token's normalized statistic 3/5, so Π_1(n) = 1/(1 + e^(40·3/5))
    tau = torch.tensor([[40.0], [0.0]], dtype=torch.float64)
    out, pi = token_statistics_attention(w, tau)
    for k in range(2):
        weight = sum(float(pi[0, k, n]) for n in range(5))
        for i in range(3):
            second = sum(float(pi[0, k, n]) * float(w[0, k, n, i]) ** 2 for n in range(5)) / (weight + 1e-8)
            for t in range(5):
                want = -float(pi[0, k, t]) * float(w[0, k, t, i]) / (1 + second)
                assert abs(float(out[0, k, t, i]) - want) <= 1e-12 * max(1.0, abs(want))
    assert float(pi[0, 1].sum()) < 1e-9  # the regime where +1e-8 and -1e-8 differ


def test_the_patch_stem_is_log2_p_bias_free_3x3_stride_2_convolutions_widening_to_d():
    """XCiT's stem for p = 4: two 3x3 convolutions of stride 2 and padding 1, without bias (BatchNorm follows each),
    widths C = 1 → d/2 = 4 → d = 8."""
    from hf_tdiag.models.tost.modeling_tost import TostPatchEmbeddings

    convs = [m for m in TostPatchEmbeddings(_config()).modules() if isinstance(m, torch.nn.Conv2d)]
    assert [tuple(c.weight.shape) for c in convs] == [(4, 1, 3, 3), (8, 4, 3, 3)]
    for conv in convs:
        assert conv.bias is None and conv.stride == (2, 2) and conv.padding == (1, 1)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_the_tssa_projection_has_a_bias_only_if_configured(qkv_bias):
    """The TSSA projection U_kᵀ x + b_k carries b_k exactly when config.qkv_bias (not nn.Linear's default bias)."""
    from hf_tdiag.models.tost.modeling_tost import TostTSSA

    assert (TostTSSA(_config(qkv_bias=qkv_bias)).qkv.bias is not None) == qkv_bias


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_the_class_attention_projection_has_a_bias_only_if_configured(qkv_bias):
    """The class attention's q, k, v map (d → 3d) carries a bias exactly when config.qkv_bias."""
    from hf_tdiag.models.tost.modeling_tost import TostClassAttention

    qkv = TostClassAttention(_config(qkv_bias=qkv_bias)).qkv
    assert qkv.weight.shape == (24, 8) and (qkv.bias is not None) == qkv_bias


def test_the_mlp_widens_by_mlp_ratio_and_the_cls_token_is_one_token():
    """The MLP's hidden width is d · mlp_ratio (8 · 4 = 32, not 8 / 4); the CLS token a (1, 1, d) parameter (the
    authors' checkpoint shape)."""
    from hf_tdiag.models.tost.modeling_tost import TostMLP

    mlp = TostMLP(_config(mlp_ratio=4.0))
    assert mlp.fc1.weight.shape == (32, 8) and mlp.fc2.weight.shape == (8, 32)
    assert TostModel(_config()).cls_token.shape == (1, 1, 8)


def test_without_position_encoding_the_tokens_are_the_stems_alone():
    """use_position_encoding=False: no position module, and the first block's input is the stem's tokens."""
    torch.manual_seed(0)
    model = TostModel(_config(use_position_encoding=False)).eval()
    assert model.position_encoding is None
    pixels = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model.embed(pixels), model.patch_embeddings(pixels)[0], rtol=0, atol=0)


def test_a_model_without_projection_biases_initialises_with_every_other_bias_zero():
    """qkv_bias=False: the model builds (the initialisation skips the missing biases) and every Linear bias it has
    starts at zero."""
    torch.manual_seed(0)
    model = TostModel(_config(qkv_bias=False))
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert any(m.bias is None for m in linears)
    for m in linears:
        assert m.bias is None or torch.count_nonzero(m.bias) == 0


def test_a_fresh_model_is_not_checkpointing_until_asked():
    """A new TostModel reports no gradient checkpointing (transformers reads every module's flag) until enabled."""
    model = TostModel(_config())
    assert model.is_gradient_checkpointing is False
    model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing is True


def test_class_attention_maps_of_an_sdpa_model_take_the_eager_path_without_transformers_dispatch_warning():
    """output_attentions=True on an sdpa model asks the interface for "eager" by name: the class-attention maps exist,
    equal an eager model's, and transformers' warning about an attention implementation of None is not logged."""
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.get_logger("transformers.modeling_utils").warning_once.cache_clear()  # warning_once: once per process
    torch.manual_seed(0)
    sdpa = TostModel(_config(attn_implementation="sdpa")).eval()
    eager = TostModel(_config(attn_implementation="eager")).eval()
    eager.load_state_dict(sdpa.state_dict())
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    target = hf_logging.get_logger("transformers.modeling_utils")
    target.addHandler(handler)
    try:
        with torch.no_grad():
            got = sdpa(x, output_attentions=True).attentions
    finally:
        target.removeHandler(handler)
    assert not [r for r in records if "AttentionInterface" in r.getMessage()]
    with torch.no_grad():
        want = eager(x, output_attentions=True).attentions
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
