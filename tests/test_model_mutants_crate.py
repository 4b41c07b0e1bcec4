"""CRATE (vision) beyond tests/test_crate_blocks.py and tests/test_model_equations_crate.py: what the sampled mutation
run of modeling_crate.py found untested — the attention dropout in training; the second sample: a size field set wrong
after the config was built, the one-label regression head, the output dropout, the block's LayerNorm epsilon —
against computations written here."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from hf_tdiag.models.crate import CrateConfig, CrateModel


def _config(**kw) -> CrateConfig:
    fields = dict(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1,
                  num_attention_heads=2, num_labels=3, attn_implementation="eager")  # fmt: skip
    return CrateConfig(**{**fields, **kw})


def test_attention_dropout_drops_probabilities_in_training_only():
    """MSSA in training: out_proj(dropout(softmax(w wᵀ/√p)) w) with the same dropout draw; in eval no dropout."""
    torch.manual_seed(0)
    model = CrateModel(_config(attention_probs_dropout_prob=0.5))
    mssa = model.encoder.layer[0].attention
    h = 3 * torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mssa.eval()
        ref, probs = mssa(h, output_attentions=True)
        mssa.train()
        torch.manual_seed(3)
        train, _ = mssa(h, output_attentions=True)
    w = (h.double() @ mssa.qkv.weight.double().T).view(2, 5, 2, 8).transpose(1, 2)
    want_probs = (w @ w.transpose(-1, -2) / 8**0.5).softmax(-1)
    torch.testing.assert_close(probs.double(), want_probs, rtol=1e-5, atol=1e-6)

    def out_proj(p):
        heads = (p.double() @ w).transpose(1, 2).reshape(2, 5, 16)
        return heads @ mssa.out_proj.weight.double().T + mssa.out_proj.bias.double()

    torch.manual_seed(3)
    dropped = F.dropout(probs, p=0.5, training=True)  # the same draw on the eval probabilities
    torch.testing.assert_close(train.double(), out_proj(dropped), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref.double(), out_proj(want_probs), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(train, ref)


def test_the_embeddings_alone_refuse_another_resolution_unless_asked_to_interpolate():
    """CrateEmbeddings called directly keeps the model's contract: a 12x12 image on an 8x8 model is refused (the
    message names the switch), and with interpolate_pos_encoding=True it gets the resized positions."""
    torch.manual_seed(0)
    embeddings = CrateModel(_config()).eval().embeddings
    x = torch.randn(1, 1, 12, 12, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with pytest.raises(ValueError, match="12x12.*interpolate_pos_encoding=True"):
            embeddings(x)
        out = embeddings(x, interpolate_pos_encoding=True)
        tokens = embeddings.patch_embeddings(x)
        want = torch.cat((embeddings.cls_token, tokens), dim=1) + embeddings.interpolate_pos_encoding(12, 12)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("field", ["image_size", "patch_size"])
def test_a_size_set_wrong_after_the_config_was_built_is_named_by_the_model(field):
    """A config attribute changed after construction is checked again when the model is built: the message names it."""
    config = _config()
    setattr(config, field, "eight")
    with pytest.raises(TypeError, match=rf"^{field}: expected an int or a \(height, width\) pair of ints, got 'eight'"):
        CrateModel(config)


def test_one_label_is_a_regression_head_with_the_squared_error():
    """num_labels=1: a linear head to one output (not the identity), logits = W·LN(pooled) + b, loss the MSE."""
    from hf_tdiag.models.crate import CrateForImageClassification

    torch.manual_seed(0)
    model = CrateForImageClassification(_config(num_labels=1)).eval()
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    target = torch.tensor([0.5, -1.0])
    with torch.no_grad():
        out = model(x, labels=target)
        pooled = model.classifier_norm(model.crate(x).pooler_output)
    assert out.logits.shape == (2, 1)
    torch.testing.assert_close(out.logits, pooled @ model.classifier.weight.t() + model.classifier.bias)
    torch.testing.assert_close(out.loss, ((out.logits.squeeze(-1) - target) ** 2).mean())


def test_the_attention_output_drops_in_training_only():
    """hidden_dropout_prob on MSSA's output: in training each entry is 0 or the eval output / (1 − p), the same draw
    as F.dropout on the eval output; in eval nothing is dropped."""
    torch.manual_seed(0)
    mssa = CrateModel(_config(hidden_dropout_prob=0.5)).encoder.layer[0].attention
    h = 3 * torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mssa.eval()
        ref, _ = mssa(h)
        mssa.train()
        torch.manual_seed(3)
        train, _ = mssa(h)
    torch.manual_seed(3)
    torch.testing.assert_close(train, F.dropout(ref, p=0.5, training=True))
    assert not torch.allclose(train, ref)


def _layernorm(x: torch.Tensor, eps: float) -> torch.Tensor:
    centred = x - x.mean(-1, keepdim=True)
    return centred / (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def test_the_block_normalizes_with_the_configured_epsilon():
    """Z½ = Z + MSSA(LN1 Z), Z⁺ = ISTA(LN2 Z½), both LayerNorms at layer_norm_eps (0.37, far from torch's 1e-5),
    written out here on inputs of small spread (where the epsilon matters); the LayerNorms start at weight 1, bias 0."""
    torch.manual_seed(0)
    layer = CrateModel(_config(layer_norm_eps=0.37)).eval().encoder.layer[0]
    z = 0.3 * torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out, mid = layer(z)
        want_mid = z + layer.attention(_layernorm(z, 0.37))[0]
        want_out = layer.ista(_layernorm(want_mid, 0.37))
    torch.testing.assert_close(mid, want_mid, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)


# the full run of modeling_crate.py (2026-12-07): the survivors of the mutants the two samples had not drawn


def test_the_classifier_carries_its_label_count():
    from hf_tdiag.models.crate import CrateForImageClassification

    assert CrateForImageClassification(_config(num_labels=7)).num_labels == 7


def test_without_labels_the_head_returns_the_normed_pooled_token_with_the_configured_epsilon():
    """num_labels=0: no linear map (the identity, not a Linear to 0 outputs); the logits are LN(pooled) at
    layer_norm_eps (0.5 here, far from torch's 1e-5), written out."""
    from hf_tdiag.models.crate import CrateForImageClassification

    torch.manual_seed(0)
    model = CrateForImageClassification(_config(num_labels=0, layer_norm_eps=0.5)).eval()
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pooled = model.crate(x).pooler_output
        logits = model(x).logits
    assert logits.shape == (2, 16)
    norm = model.classifier_norm
    torch.testing.assert_close(logits, _layernorm(pooled, 0.5) * norm.weight + norm.bias, rtol=1e-5, atol=1e-6)


def test_the_cls_token_and_the_positions_start_as_zero_mean_normals_of_the_configured_spread():
    """_init_weights draws the CLS token and the position embeddings from N(0, initializer_range²) (truncated at ±2,
    far out at std 0.02): their sample means sit within 4 standard errors of 0 and their spreads near 0.02."""
    torch.manual_seed(0)
    emb = CrateModel(_config(hidden_size=64, initializer_range=0.02)).embeddings
    for name, param in (("cls_token", emb.cls_token), ("position_embeddings", emb.position_embeddings)):
        values = param.detach().flatten().double()
        assert abs(float(values.mean())) < 4 * 0.02 / values.numel() ** 0.5, name
        assert 0.015 < float(values.std()) < 0.025, name


def test_the_identity_output_matrix_follows_the_models_dtype_and_device():
    """crate-identity: output_matrix() is I_d, in the weights' dtype (float64 here) and on their device (the meta
    device, a stand-in for an accelerator)."""
    model = CrateModel(_config(variant="crate-identity")).double()
    eye = model.encoder.layer[0].attention.output_matrix()
    assert eye.dtype == torch.float64
    torch.testing.assert_close(eye, torch.eye(16, dtype=torch.float64), rtol=0, atol=0)
    meta = model.to("meta").encoder.layer[0].attention.output_matrix()
    assert meta.device == torch.device("meta") and meta.dtype == torch.float64


def test_the_patch_embedding_refuses_a_width_the_patch_does_not_divide():
    """Either side not divisible by the patch is refused with the message (here only the width: 8x10 in 4x4 patches)."""
    patch = CrateModel(_config()).embeddings.patch_embeddings
    for shape in ((1, 1, 8, 10), (1, 1, 10, 8)):
        with pytest.raises(ValueError, match=r"spatial size \(\d+x\d+\) must be divisible by patch_size \(4x4\)"):
            patch(torch.zeros(shape))


def test_interpolating_at_the_configured_size_keeps_float64_positions_exact():
    """interpolate_pos_encoding=True at the configured resolution uses the learned positions as they are: a float64
    model with positions no float32 can hold gives the same tokens bit for bit as without interpolation."""
    torch.manual_seed(0)
    emb = CrateModel(_config()).double().eval().embeddings
    with torch.no_grad():
        emb.position_embeddings.copy_(torch.randn(1, 5, 16, dtype=torch.float64) / 3)
        assert not torch.equal(emb.position_embeddings.float().double(), emb.position_embeddings)
        x = torch.randn(2, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        assert torch.equal(emb(x, interpolate_pos_encoding=True), emb(x))


def test_attention_maps_of_an_sdpa_model_take_the_eager_path_without_transformers_dispatch_warning():
    """output_attentions=True on an sdpa model asks the interface for "eager" by name: the maps exist, equal an eager
    model's, and transformers' warning about an attention implementation of None is not logged."""
    from transformers.utils import logging as hf_logging

    hf_logging.get_logger("transformers.modeling_utils").warning_once.cache_clear()  # warning_once: once per process
    torch.manual_seed(0)
    sdpa = CrateModel(_config(attn_implementation="sdpa")).eval()
    eager = CrateModel(_config()).eval()
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
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_a_fresh_model_does_not_checkpoint_until_asked():
    """Activation checkpointing is off in a new model (the Trainer and transformers read it) until enabled."""
    model = CrateModel(_config())
    assert model.is_activation_checkpointing is False
    model.activation_checkpointing_enable()
    assert model.is_activation_checkpointing is True


def test_the_variants_without_a_learned_output_matrix_have_no_out_proj():
    """crate-c/-n/-t/-fix/-identity keep ``attention.out_proj = None`` (what hf_tdiag.diagnostics.mssa_step tests
    before copying W into it); their MSSA step then runs: at κ = 0 the curve is R_c of Z itself."""
    from hf_tdiag.diagnostics.mssa_step import mssa_step_compression
    from hf_tdiag.measures.coding_rate import compression_rate

    for variant in ("crate-c", "crate-n", "crate-t", "crate-fix", "crate-identity"):
        assert CrateModel(_config(variant=variant)).encoder.layer[0].attention.out_proj is None, variant
    out = mssa_step_compression([0.0, 0.5], variants=["crate-c"], num_tokens=6, hidden_size=4, num_heads=2, seeds=[0])
    g = torch.Generator().manual_seed(0)  # the function's own draw for seed 0: Z first, then the basis
    z = torch.randn(1, 6, 4, generator=g, dtype=torch.float64)
    basis, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))
    u = basis.reshape(4, 2, 2).permute(1, 0, 2)
    assert out["Rc"]["crate-c"][0][0] == pytest.approx(float(compression_rate(z, u, 0.1)[0]), rel=1e-12)


def test_a_non_square_image_in_non_square_patches_is_patchified_channel_last_at_the_configured_epsilon():
    """An 8x16 two-channel image in 4x2 patches: a 2 x 8 grid of 16 patches of 4·2·2 values, each flattened as
    (row in patch, column in patch, channel), then LN, Linear, LN, both LayerNorms at layer_norm_eps (0.5) — written
    out patch by patch."""
    torch.manual_seed(0)
    config = _config(image_size=(8, 16), patch_size=(4, 2), num_channels=2, layer_norm_eps=0.5)
    patch = CrateModel(config).eval().embeddings.patch_embeddings
    assert patch.grid_size == (2, 8) and patch.num_patches == 16
    x = torch.randn(2, 2, 8, 16, generator=torch.Generator().manual_seed(1))
    rows = [
        x[:, :, 4 * r : 4 * r + 4, 2 * c : 2 * c + 2].permute(0, 2, 3, 1).reshape(2, 16)
        for r in range(2)
        for c in range(8)
    ]
    patches = torch.stack(rows, dim=1)  # (2, 16 patches, 16 values)
    lin = patch.projection
    want = _layernorm(_layernorm(patches, 0.5) @ lin.weight.T + lin.bias, 0.5)
    with torch.no_grad():
        torch.testing.assert_close(patch(x), want, rtol=1e-5, atol=1e-5)
