"""AoT beyond tests/test_model_equations_aot.py: what the sampled mutation run of modeling_aot.py and
modeling_aot_text.py found untested — the equations at a LayerNorm epsilon far from torch's default, the depth-scaled
initialisation of the attention output, the trunc-normal positions, a fresh model not checkpointing — each against a
computation written here (or the equations' reference of tests/test_model_equations_aot.py)."""

from __future__ import annotations

import pytest
import torch
from test_model_equations_aot import _randomised, _vision_reference

from hf_tdiag.models.aot import AotConfig, AotForImageClassification, AotModel


def _config(**kw) -> AotConfig:
    fields = dict(image_size=8, patch_size=4, num_channels=2, hidden_size=12, num_hidden_layers=2,
                  num_attention_heads=3, num_labels=4)  # fmt: skip
    return AotConfig(**{**fields, **kw})


def test_the_vision_equations_hold_at_an_epsilon_far_from_layernorms_default():
    """Every LayerNorm (patch norms, the blocks', the head's) at layer_norm_eps = 0.37, not torch's 1e-5."""
    torch.manual_seed(0)
    model = _randomised(AotForImageClassification(_config(layer_norm_eps=0.37)))
    pixels = torch.randn(2, 2, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(pixels, output_hidden_states=True)
    logits, states = _vision_reference(model, pixels)
    torch.testing.assert_close(out.logits.double(), logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.stack(out.hidden_states).double(), states, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", ["mssa", "mhsa"])
def test_the_attention_output_starts_depth_scaled_and_the_positions_trunc_normal(attention):
    """GPT-2's scaling: W_O ~ normal(0, initializer_range / sqrt(2 L)); CLS and positions ~ trunc-normal(0, 0.02)."""
    config = _config(image_size=32, patch_size=2, hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
                     attention=attention)  # fmt: skip
    torch.manual_seed(0)
    model = AotModel(config)
    weights = torch.cat([layer.attention.out_proj.weight.detach().flatten() for layer in model.layer])
    assert float(weights.std()) == pytest.approx(0.02 / 4, rel=0.05)  # 8 x 4096 draws
    assert abs(float(weights.mean())) < 1e-3
    positions = model.embeddings.position_embeddings.detach()  # (1, 257, 64)
    assert float(positions.std()) == pytest.approx(0.02, rel=0.05)
    assert abs(float(positions.mean())) < 1e-3


def test_a_fresh_model_does_not_checkpoint_until_asked():
    model = AotModel(_config())
    assert model.is_activation_checkpointing is False
    model.activation_checkpointing_enable()
    assert model.is_activation_checkpointing is True


def _text_model(attention: str = "mssa", **kw):
    from hf_tdiag.models.aot import AotForCausalLM, AotTextConfig

    fields = dict(vocab_size=23, max_position_embeddings=8, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
                  attention=attention, pad_token_id=0, attn_implementation="eager")  # fmt: skip
    torch.manual_seed(0)
    return _randomised(AotForCausalLM(AotTextConfig(**{**fields, **kw}))).eval()


@pytest.mark.parametrize("attention", ["mssa", "mhsa"])
def test_left_padding_leaves_the_real_tokens_logits_as_without_it(attention):
    """A row padded on the left gives its real tokens the logits of the same tokens alone: positions count only the
    attended tokens (0, 1, ... from the first real one), and the padding is never attended."""
    model = _text_model(attention)
    ids = torch.randint(1, 23, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]])
    with torch.no_grad():
        batch = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        alone = [
            model(input_ids=ids[0:1], use_cache=False).logits,
            model(input_ids=ids[1:2, 3:], use_cache=False).logits,
        ]
    torch.testing.assert_close(batch[0], alone[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batch[1, 3:], alone[1][0], rtol=1e-5, atol=1e-5)


def test_the_positions_end_exactly_at_max_position_embeddings():
    """8 learned positions: 8 tokens run; a 9th (in one call, or through the cache) is refused with a ValueError."""
    model = _text_model()
    ids = torch.randint(1, 23, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert model(input_ids=ids[:, :8], use_cache=False).logits.shape == (1, 8, 23)
        with pytest.raises(ValueError, match="max_position_embeddings=8"):
            model(input_ids=ids, use_cache=False)
        cache = model(input_ids=ids[:, :6], use_cache=True).past_key_values
        with pytest.raises(ValueError, match="max_position_embeddings=8"):
            model(input_ids=ids[:, 6:], past_key_values=cache, use_cache=True)


def test_attention_maps_under_flex_attention_are_the_eager_ones():
    """With output_attentions a flex-attention model runs the eager path with the mask that path needs: the same
    maps and logits as an eager model, causal and padded."""
    eager = _text_model()
    flex = _text_model(attn_implementation="flex_attention")
    flex.load_state_dict(eager.state_dict())
    ids = torch.randint(1, 23, (2, 5), generator=torch.Generator().manual_seed(5))
    mask = torch.tensor([[1] * 5, [0, 1, 1, 1, 1]])
    with torch.no_grad():
        want = eager(input_ids=ids, attention_mask=mask, output_attentions=True, use_cache=False)
        got = flex(input_ids=ids, attention_mask=mask, output_attentions=True, use_cache=False)
    torch.testing.assert_close(got.logits, want.logits)
    for a, b in zip(got.attentions, want.attentions, strict=True):
        torch.testing.assert_close(a, b)
    assert float(want.attentions[0][1, :, 1:, 0].abs().max()) == 0.0  # no real token attends to the padding


def test_the_text_models_attention_output_starts_depth_scaled():
    from hf_tdiag.models.aot import AotForCausalLM, AotTextConfig

    config = AotTextConfig(vocab_size=23, max_position_embeddings=8, hidden_size=64, num_hidden_layers=8,
                           num_attention_heads=4, attention="mhsa")  # fmt: skip
    torch.manual_seed(0)
    model = AotForCausalLM(config)
    weights = torch.cat([layer.attention.out_proj.weight.detach().flatten() for layer in model.aot.layer])
    assert float(weights.std()) == pytest.approx(0.02 / 4, rel=0.05)
