"""Text CRATE's blocks against the equations written token by token (tests/crate_text_reference.py), for the three
presets' shapes: CRATE-LM's overcomplete two-step ISTA with a final LayerNorm, the square one-step ISTA of CRATE-GPT,
and the RoBERTa-shaped encoder (position offset 2, token types, embedding LayerNorm, the dense-GELU-LayerNorm LM head),
every weight (LayerNorm affines and biases included) random so that none of them can be dropped unnoticed."""

from __future__ import annotations

import pytest
import torch
from crate_text_reference import reference_forward

from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM, CrateTextForMaskedLM, CrateTextModel

V = 31


def _randomized(cls, preset: str, **kw):
    sizes = dict(vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=24)
    if preset == "crate-lm-12l":
        sizes["ista_dictionary_size"] = 32
    config = CrateTextConfig.from_preset(preset, pad_token_id=0, **sizes, **kw)
    torch.manual_seed(0)
    model = cls(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("layernorm.weight") or "norm" in name and name.endswith(".weight"):
                param.copy_(1 + 0.3 * torch.randn(param.shape, generator=g))
            else:
                param.copy_(0.5 * torch.randn(param.shape, generator=g))
    return model


CASES = {
    "crate-lm": (CrateTextForCausalLM, "crate-lm-12l"),
    "crate-gpt": (CrateTextForCausalLM, "crate-gpt-12l"),
    "crate-bert": (CrateTextForMaskedLM, "crate-bert-base"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lm_logits_follow_the_equations(case):
    cls, preset = CASES[case]
    model = _randomized(cls, preset)
    ids = torch.randint(1, V, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = (
        torch.tensor([[1] * 6, [0, 1, 1, 1, 1, 1]])
        if model.config.is_decoder
        else torch.tensor([[1] * 6, [1] * 4 + [0, 0]])
    )
    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=mask, output_mid_hidden_states=True)
    ref = reference_forward(model, ids, mask)
    kept = mask.bool()
    torch.testing.assert_close(ours.logits.double()[kept], ref["logits"][kept], rtol=1e-4, atol=1e-4)
    # the sparse codes are partly active: the ReLUs and the threshold -eta*lambda are exercised
    layer = model.crate.layer[0]
    with torch.no_grad():
        states = model.crate(input_ids=ids, attention_mask=mask, output_mid_hidden_states=True).mid_hidden_states
        code = layer.ista.sparse_code(layer.layernorm_after(states[0]))
    assert 0.05 < float((code > 0).float().mean()) < 0.95


def test_the_bare_model_state_and_the_encoder_pooler():
    """The bare encoder's last state is the reference's; its pooler is tanh(W h_CLS + b) on the first token."""
    model = _randomized(CrateTextModel, "crate-bert-base")
    ids = torch.randint(1, V, (2, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(input_ids=ids)
    ref = reference_forward(model, ids)
    torch.testing.assert_close(out.last_hidden_state.double(), ref["hidden"], rtol=1e-4, atol=1e-4)
    sd = {k: v.double() for k, v in model.state_dict().items()}
    pooled = torch.tanh(ref["hidden"][:, 0] @ sd["pooler.dense.weight"].T + sd["pooler.dense.bias"])
    torch.testing.assert_close(out.pooler_output.double(), pooled, rtol=1e-4, atol=1e-4)


def test_the_mssa_output_projection_starts_depth_scaled():
    """CRATE-LM's initialization: the MSSA output projection normal(0, initializer_range / sqrt(2 L))."""
    config = CrateTextConfig.from_preset(
        "crate-lm-12l", vocab_size=V, hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
        max_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(0)
    model = CrateTextModel(config)
    weights = torch.cat([layer.attention.out_proj.weight.detach().flatten() for layer in model.layer])
    assert float(weights.std()) == pytest.approx(0.02 / 4, rel=0.05)  # 8 x 4096 draws
    assert abs(float(weights.mean())) < 1e-3


def test_token_types_on_a_model_without_them_are_refused_unless_all_zero():
    model = _randomized(CrateTextForCausalLM, "crate-lm-12l")
    assert model.config.type_vocab_size == 0
    ids = torch.randint(1, V, (1, 4), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        plain = model(input_ids=ids, use_cache=False).logits
        zeros = model(input_ids=ids, token_type_ids=torch.zeros_like(ids), use_cache=False).logits
    torch.testing.assert_close(zeros, plain)
    with pytest.raises(ValueError, match="type_vocab_size=0"):
        model(input_ids=ids, token_type_ids=torch.tensor([[0, 1, 0, 0]]), use_cache=False)
