"""Text CRATE's causal mask on every path, against the token-by-token equations (tests/crate_text_reference.py).

The paths: the attention implementation (eager, sdpa; flex attention when attention maps are asked for, which then
run on the eager path with the mask the eager path needs), the padding mask (none, all ones, left padding), attention
maps asked for or not, and a KV cache (prefill, then a chunk of several tokens, then one token). sdpa with no padding
and attention maps asked for is the path where the block builds the causal mask itself (``CrateTextMSSA``); the block
is also called directly with a filled cache, where that mask is offset by the cached length."""

from __future__ import annotations

import pytest
import torch
from crate_text_reference import reference_forward
from transformers import DynamicCache

from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM
from hf_tdiag.models.crate_text.modeling_crate_text_blocks import CrateTextMSSA

V, N, SCALE = 23, 7, 4.0


def _model() -> CrateTextForCausalLM:
    config = CrateTextConfig.from_preset(
        "crate-lm-12l", vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=32, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = CrateTextForCausalLM(config).eval()
    with torch.no_grad():  # larger attention scores than the 0.02-std initialization gives: the maps are not flat
        for layer in model.crate.layer:
            layer.attention.qkv.weight.mul_(SCALE)
    return model


MODEL = _model()
IDS = torch.randint(1, V, (2, N), generator=torch.Generator().manual_seed(1))
MASKS = {
    "none": None,
    "ones": torch.ones(2, N, dtype=torch.long),
    "left_padded": torch.tensor([[1] * N, [0, 0] + [1] * (N - 2)]),
}
_REFERENCE: dict[str, dict] = {}


def _reference(mask_name: str) -> dict:
    if mask_name not in _REFERENCE:
        _REFERENCE[mask_name] = reference_forward(MODEL, IDS, MASKS[mask_name])
    return _REFERENCE[mask_name]


def _kept(mask_name: str) -> torch.Tensor:
    mask = MASKS[mask_name]
    return torch.ones(2, N, dtype=torch.bool) if mask is None else mask.bool()


def test_the_reference_attention_is_causal_and_not_flat():
    """The test's own premise: each token's weights sit on itself and the tokens before it, and vary."""
    probs = _reference("none")["probs"][0]
    assert float(probs.triu(1).abs().max()) == 0.0
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 2, N, dtype=torch.float64))
    assert float(probs.tril(-1).max()) > 0.2 and float(probs.diagonal(dim1=-2, dim2=-1)[..., 1:].max()) < 0.9


@pytest.mark.parametrize("output_attentions", [False, True])
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex_attention"])
def test_full_forward_follows_the_equations(impl, mask_name, output_attentions):
    if impl == "flex_attention" and not output_attentions:
        pytest.skip("flex attention's own kernel compiles for ~35 s on CPU: the slow run (test_model_common.py)")
    MODEL.set_attn_implementation(impl)
    with torch.no_grad():
        out = MODEL(
            input_ids=IDS, attention_mask=MASKS[mask_name], output_attentions=output_attentions, use_cache=False
        )
    MODEL.set_attn_implementation("eager")
    ref, kept = _reference(mask_name), _kept(mask_name)
    torch.testing.assert_close(out.logits.double()[kept], ref["logits"][kept], rtol=1e-5, atol=1e-5)
    if not output_attentions:
        assert out.attentions is None
        return
    assert len(out.attentions) == 2
    for ours, expected in zip(out.attentions, ref["probs"]):
        assert ours.shape == (2, 2, N, N)
        rows = kept[:, None, :, None].expand(-1, 2, -1, N)  # the rows of attended queries
        torch.testing.assert_close(ours.double()[rows], expected[rows], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("output_attentions", [False, True])
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_cached_chunks_follow_the_equations(impl, mask_name, output_attentions):
    """Prefill 4 tokens, then a chunk of 2 (several new queries against a cache), then 1: each step's logits and maps
    are the full sequence's at those positions."""
    MODEL.set_attn_implementation(impl)
    mask = MASKS[mask_name]
    cache = DynamicCache(config=MODEL.config)
    logits, maps = [], []
    with torch.no_grad():
        for start, stop in ((0, 4), (4, 6), (6, 7)):
            step = MODEL(
                input_ids=IDS[:, start:stop], attention_mask=None if mask is None else mask[:, :stop], cache=cache,
                use_cache=True, output_attentions=output_attentions,
            )  # fmt: skip
            cache = step.cache
            logits.append(step.logits)
            maps.append(step.attentions)
    MODEL.set_attn_implementation("eager")
    assert cache.get_seq_length() == N
    ref, kept = _reference(mask_name), _kept(mask_name)
    torch.testing.assert_close(torch.cat(logits, 1).double()[kept], ref["logits"][kept], rtol=1e-5, atol=1e-5)
    if output_attentions:
        for (start, stop), step_maps in zip(((0, 4), (4, 6), (6, 7)), maps):
            for ours, expected in zip(step_maps, ref["probs"]):
                assert ours.shape == (2, 2, stop - start, stop)
                rows = kept[:, None, start:stop, None].expand(-1, 2, -1, stop)
                torch.testing.assert_close(
                    ours.double()[rows], expected[:, :, start:stop, :stop][rows], rtol=1e-5, atol=1e-6
                )


@pytest.mark.parametrize("past", [0, 3])
def test_the_block_builds_its_causal_mask_offset_by_the_cache(past):
    """``CrateTextMSSA`` on the eager path with no mask and a cache holding ``past`` tokens: query ``i`` (position
    ``past + i``) sees the keys ``0 .. past + i``, written here as a loop."""
    attention = MODEL.crate.layer[0].attention
    tokens = 4
    x = torch.randn(2, past + tokens, 16, generator=torch.Generator().manual_seed(2))
    cache = DynamicCache(config=MODEL.config)
    with torch.no_grad():
        if past:
            attention(x[:, :past], None, cache)  # fills layer 0 of the cache
        out, probs = attention(x[:, past:], None, cache, output_attentions=True)
        w = attention.qkv(x).view(2, past + tokens, 2, 8).transpose(1, 2).double()
        expected = torch.zeros(2, 2, tokens, past + tokens, dtype=torch.float64)
        for i in range(tokens):
            visible = past + i + 1
            scores = w[:, :, past + i : past + i + 1] @ w[:, :, :visible].transpose(-1, -2) / 8**0.5
            expected[:, :, i : i + 1, :visible] = torch.softmax(scores, -1)
        heads = (expected @ w).transpose(1, 2).reshape(2, tokens, 16)
        expected_out = attention.out_proj(heads.float())
    torch.testing.assert_close(probs.double(), expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out, expected_out, rtol=1e-5, atol=1e-6)
    assert float(probs.tril(past).sum(-1).sub(1).abs().max()) < 1e-6  # all weight on the visible keys


def test_an_encoder_block_builds_no_mask():
    """The same block in a bidirectional model: every query sees every key (the causal branch is for decoders)."""
    config = CrateTextConfig.from_preset(
        "crate-bert-base", vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=32, ista_dictionary_size=16,
    )  # fmt: skip
    config._attn_implementation = "eager"
    attention = CrateTextMSSA(config, 0).eval()
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        _, probs = attention(x, None, None, output_attentions=True)
    assert float(probs.min()) > 0.0
