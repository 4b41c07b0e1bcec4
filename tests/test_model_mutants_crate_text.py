"""Text CRATE beyond the equations of tests/test_model_equations_text.py: what the sampled mutation run of
modeling_crate_text_blocks.py and modeling_crate_text.py found untested — the pooled token of each kind of mask, the
causal mask the block builds for two tokens, the attention dropout in training; the second sample: the heads' label
count, a single token type, attention maps under sdpa, the block's causal mask in float64, a fresh model not checkpointing, generate's default-length
warning — each against a computation written here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextModel
from hf_tdiag.models.crate_text.modeling_crate_text_blocks import pooled_token

V = 19


def _config(preset: str = "crate-gpt-12l", **kw) -> CrateTextConfig:
    sizes = dict(vocab_size=V, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=16,
                 pad_token_id=0, attn_implementation="eager")  # fmt: skip
    return CrateTextConfig.from_preset(preset, **{**sizes, **kw})


def test_the_pooled_token_is_the_first_or_the_last_attended_one():
    hidden = torch.arange(3 * 4 * 2, dtype=torch.float32).reshape(3, 4, 2)
    torch.testing.assert_close(pooled_token(hidden, None, causal=False), hidden[:, 0])
    torch.testing.assert_close(pooled_token(hidden, None, causal=True), hidden[:, 3])
    # a 4-D (already expanded) mask says nothing about padding: the last token
    torch.testing.assert_close(pooled_token(hidden, torch.zeros(3, 1, 4, 4), causal=True), hidden[:, 3])
    # a 2-D mask over 2 cached + 4 new tokens: its last 4 columns; right padding ends early, left padding does not
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 1, 1, 1], [0, 0, 1, 1, 1, 0]])
    last = [1, 3, 2]  # by hand: the last 1 among each row's last 4 columns
    want = torch.stack([hidden[b, last[b]] for b in range(3)])
    torch.testing.assert_close(pooled_token(hidden, mask, causal=True), want)


def _by_hand(mssa, h: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
    """MSSA written out: w = U^T z per head, causal softmax(w w^T / sqrt(p)) (or the probabilities given), out_proj."""
    batch, n, _ = h.shape
    k, p = mssa.num_heads, mssa.head_dim
    w = (h.double() @ mssa.qkv.weight.double().T).view(batch, n, k, p).transpose(1, 2)
    if probs is None:
        scores = w @ w.transpose(-1, -2) / p**0.5
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        probs = scores.masked_fill(future, float("-inf")).softmax(-1)
    heads = (probs.double() @ w).transpose(1, 2).reshape(batch, n, k * p)
    return heads @ mssa.out_proj.weight.double().T + mssa.out_proj.bias.double()


@pytest.mark.parametrize("tokens", [2, 3])
def test_the_block_masks_the_future_itself_from_two_tokens_on(tokens):
    """The eager path with no padding mask: the block's own causal mask, from the shortest sequence it matters for."""
    torch.manual_seed(0)
    model = CrateTextModel(_config(attention_bias=True)).eval()
    mssa = model.layer[0].attention
    h = 3 * torch.randn(2, tokens, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out, probs = mssa(h, output_attentions=True)
    assert float(probs[:, :, 0, 1:].abs().max()) == 0.0  # the first token sees only itself
    torch.testing.assert_close(out.double(), _by_hand(mssa, h), rtol=1e-5, atol=1e-5)


def test_attention_dropout_drops_probabilities_in_training_only():
    torch.manual_seed(0)
    model = CrateTextModel(_config(attention_probs_dropout_prob=0.5, hidden_dropout_prob=0.0, attention_bias=True))
    mssa = model.layer[0].attention
    h = 3 * torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mssa.eval()
        ref, probs = mssa(h, output_attentions=True)
        mssa.train()
        torch.manual_seed(3)
        train, _ = mssa(h, output_attentions=True)
    torch.manual_seed(3)
    dropped = F.dropout(probs, p=0.5, training=True)  # the same draw on the eval probabilities
    torch.testing.assert_close(train.double(), _by_hand(mssa, h, dropped), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref.double(), _by_hand(mssa, h), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(train, ref)


def test_a_causal_models_heads_without_a_cache_output_build_none(monkeypatch):
    """A head that returns no cache (sequence classification of a decoder) runs its base model without one, even when
    the caller (a Trainer, a pipeline) passes use_cache=True; the causal LM builds one (the counter works)."""
    from hf_tdiag.models.crate_text import CrateTextForCausalLM, CrateTextForSequenceClassification, modeling_crate_text

    built = []

    class Counted(modeling_crate_text.DynamicCache):
        def __init__(self, *args, **kwargs):
            built.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(modeling_crate_text, "DynamicCache", Counted)
    ids = torch.randint(1, V, (2, 4), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    config = _config(num_labels=3, use_cache=True)
    with torch.no_grad():
        CrateTextForSequenceClassification(config).eval()(input_ids=ids, use_cache=True)
        assert built == []
        CrateTextForSequenceClassification(config).eval()(input_ids=ids)
        assert built == []
        CrateTextForCausalLM(config).eval()(input_ids=ids, use_cache=True)
    assert len(built) == 1


@pytest.mark.parametrize("head", ["masked-lm", "token-classification"])
def test_an_option_passed_as_none_falls_back_to_the_config(head):
    """transformers' convention: output_hidden_states=None means the config's value (here True): the heads pass only
    the options given (not None) to the base model, whose output capturing reads an explicit None as 'no'."""
    from hf_tdiag.models.crate_text import CrateTextForMaskedLM, CrateTextForTokenClassification

    cls = CrateTextForMaskedLM if head == "masked-lm" else CrateTextForTokenClassification
    torch.manual_seed(0)
    model = cls(_config("crate-bert-base", num_labels=3, output_hidden_states=True, num_hidden_layers=2)).eval()
    ids = torch.randint(1, V, (2, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=None)
    assert out.hidden_states is not None and len(out.hidden_states) == 3  # Z^0 and the two blocks' outputs


@pytest.mark.parametrize("preset", ["crate-lm-12l", "crate-bert-base"])
def test_the_equations_hold_at_epsilons_far_from_layernorms_default(preset):
    """Every LayerNorm takes its epsilon from the config (layer_norm_eps for the blocks and the final norm,
    head_layer_norm_eps for the embedding and LM-head norms): at 0.3 and 0.2 (not torch's 1e-5) the logits are still
    the token-by-token reference's."""
    from crate_text_reference import reference_forward

    from hf_tdiag.models.crate_text import CrateTextForCausalLM, CrateTextForMaskedLM

    cls = CrateTextForCausalLM if preset == "crate-lm-12l" else CrateTextForMaskedLM
    extra = {"ista_dictionary_size": 16} if preset == "crate-lm-12l" else {}
    config = _config(preset, layer_norm_eps=0.3, head_layer_norm_eps=0.2, num_hidden_layers=2, **extra)
    torch.manual_seed(0)
    model = cls(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # weights far from the 0.02-std start, so that every term is visible
        for name, param in model.named_parameters():
            param.copy_(
                (1 if "norm" in name and name.endswith("weight") else 0) + 0.5 * torch.randn(param.shape, generator=g)
            )
    ids = torch.randint(1, V, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits if config.is_decoder else model(input_ids=ids).logits
    torch.testing.assert_close(logits.double(), reference_forward(model, ids)["logits"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("head", ["sequence-classification", "token-classification"])
def test_the_classification_heads_carry_their_label_count(head):
    """transformers' convention (pipelines and the Trainer read it): a classification head's num_labels."""
    from hf_tdiag.models.crate_text import CrateTextForSequenceClassification, CrateTextForTokenClassification

    cls = CrateTextForSequenceClassification if head == "sequence-classification" else CrateTextForTokenClassification
    assert cls(_config("crate-bert-base", num_labels=7)).num_labels == 7


def test_a_single_token_type_adds_its_embedding_to_every_token():
    """type_vocab_size=1 (one segment, as some BERT-shaped checkpoints have) still carries the token-type embedding:
    each token's embedding is its word row + its position row + the one type row (no LayerNorm in crate-gpt)."""
    from hf_tdiag.models.crate_text.modeling_crate_text_blocks import CrateTextEmbeddings

    torch.manual_seed(0)
    emb = CrateTextEmbeddings(_config(type_vocab_size=1)).eval()
    assert emb.token_type_embeddings is not None and emb.token_type_embeddings.weight.shape == (1, 8)
    ids = torch.tensor([[3, 1, 4], [1, 5, 9]])
    with torch.no_grad():
        emb.token_type_embeddings.weight.copy_(torch.randn(1, 8))
        words = emb.word_embeddings.weight[ids]
        out = emb(words, torch.arange(3).expand(2, 3))
        want = words + emb.position_embeddings.weight[:3] + emb.token_type_embeddings.weight[0]
    torch.testing.assert_close(out, want)


def test_attention_maps_under_sdpa_are_the_eager_ones():
    """output_attentions=True on an sdpa model: each block takes the eager path for that call, so the maps exist
    (sdpa returns none) and equal an eager model's, padding mask included, and so do the hidden states."""
    torch.manual_seed(0)
    sdpa = CrateTextModel(_config(num_hidden_layers=2, attn_implementation="sdpa")).eval()
    eager = CrateTextModel(_config(num_hidden_layers=2)).eval()
    eager.load_state_dict(sdpa.state_dict())
    ids = torch.randint(1, V, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        got = sdpa(input_ids=ids, attention_mask=mask, output_attentions=True)
        want = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert len(got.attentions) == 2 and all(a is not None for a in got.attentions)
    for a, b in zip(got.attentions, want.attentions, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert float(got.attentions[0][1, :, :, 3:].abs().max()) == 0.0  # the padding is never attended
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-5, atol=1e-5)


def test_a_fresh_model_does_not_checkpoint_until_asked():
    model = CrateTextModel(_config())
    assert model.is_activation_checkpointing is False
    model.activation_checkpointing_enable()
    assert model.is_activation_checkpointing is True


def test_generate_keeps_transformers_warning_about_the_default_max_length():
    """The causal LM's own length check passes transformers' has_default_max_length on: generating without
    max_new_tokens warns about the model-agnostic default max_length (20), with max_new_tokens it does not."""
    import warnings

    from hf_tdiag.models.crate_text import CrateTextForCausalLM

    torch.manual_seed(0)
    model = CrateTextForCausalLM(_config(max_position_embeddings=32)).eval()
    ids = torch.randint(1, V, (1, 3), generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="model-agnostic default `max_length`"):
        model.generate(ids, do_sample=False, pad_token_id=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.generate(ids, do_sample=False, pad_token_id=0, max_new_tokens=2)
    assert not [w for w in caught if "model-agnostic default" in str(w.message)]


def test_the_blocks_own_causal_mask_works_in_float64():
    """A float64 model: the mask the block builds (eager, no padding mask) is in the model's dtype, its −∞ stand-in
    float64's smallest number; the outputs are the masked attention written out."""
    torch.manual_seed(0)
    model = CrateTextModel(_config(attention_bias=True)).double().eval()
    mssa = model.layer[0].attention
    h = 3 * torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        out, probs = mssa(h, output_attentions=True)
    assert probs.dtype == torch.float64 and float(probs[:, :, 0, 1:].abs().max()) == 0.0
    torch.testing.assert_close(out, _by_hand(mssa, h), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("preset", ["crate-gpt-12l", "crate-bert-base"])
def test_a_registered_attention_function_gets_the_mask_its_own_mask_function_built(preset):
    """The full run of modeling_crate_text.py: without attention maps, an implementation other than eager/sdpa (flex
    attention's BlockMask, a registered function's mask) is given the mask its AttentionMaskInterface entry builds, not
    the eager path's additive one; asked for maps, the call runs on the eager path with the eager mask."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    built, received = [], []

    def mask_function(*args, **kwargs):
        built.append(sdpa_mask(*args, **kwargs))
        return built[-1]

    def attention(module, query, key, value, attention_mask, **kwargs):
        received.append(attention_mask)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("hf_tdiag_test_own_mask", attention)
    AttentionMaskInterface.register("hf_tdiag_test_own_mask", mask_function)
    torch.manual_seed(0)
    model = CrateTextModel(_config(preset, attn_implementation="sdpa")).eval()
    ids = torch.randint(1, V, (2, 4), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).last_hidden_state
        model.set_attn_implementation("hf_tdiag_test_own_mask")
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
        assert len(built) == 1 and len(received) == 1 and received[0] is built[0]
        assert received[0].dtype == torch.bool  # sdpa's mask (True = attend), not the eager path's additive floats
        torch.testing.assert_close(got, want)
        maps = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    assert len(built) == 1 and len(received) == 1  # the eager path: neither the registered mask nor function ran
    assert float(maps[0][1, :, 1:, 0].abs().max()) == 0.0  # the attended queries never attend the padded key


def test_an_input_longer_than_the_positions_after_the_offset_is_refused_by_its_length():
    """The full run of modeling_crate_text_blocks.py: the length check (a shape, so compiled graphs keep it) counts
    the position offset: with offset 2 and 16 rows, 14 tokens fit; 15 are refused naming the 14 positions, before the
    eager-only check of the position values."""
    from hf_tdiag.models.crate_text.modeling_crate_text_blocks import CrateTextEmbeddings

    emb = CrateTextEmbeddings(_config("crate-bert-base", max_position_embeddings=16, position_offset=2)).eval()
    with torch.no_grad():
        assert emb(torch.zeros(1, 14, 8), torch.arange(14)[None]).shape == (1, 14, 8)
        with pytest.raises(ValueError, match=r"^input of 15 tokens is longer than the 14 positions"):
            emb(torch.zeros(1, 15, 8), torch.arange(15)[None])


def test_only_the_attention_output_projection_is_initialised_at_the_depth_scaled_spread():
    """_init_weights: every Linear is N(0, initializer_range²) (transformers' rule), except each MSSA's out_proj, at
    initializer_range / sqrt(2 L) (CRATE-LM's depth scaling): with L = 8, 0.02 against 0.005."""
    torch.manual_seed(0)
    config = _config("crate-bert-base", hidden_size=64, num_attention_heads=2, num_hidden_layers=8,
                     initializer_range=0.02, num_labels=3)  # fmt: skip
    from hf_tdiag.models.crate_text import CrateTextForSequenceClassification

    model = CrateTextForSequenceClassification(config)
    layer = model.crate.layer[0]
    for name, linear, std in (
        ("qkv", layer.attention.qkv, 0.02),
        ("out_proj", layer.attention.out_proj, 0.02 / 16**0.5),
        ("classifier.dense", model.classifier.dense, 0.02),
    ):
        weight = linear.weight.detach().double()
        assert abs(float(weight.std()) / std - 1) < 0.1, name
        assert abs(float(weight.mean())) < 4 * std / weight.numel() ** 0.5, name


def test_the_positions_pooling_and_causal_mask_are_built_on_the_inputs_device(monkeypatch):
    """Tensors the text blocks make themselves (positions without a mask, the pooled token's index, the block's own
    causal mask, the default token types) live on the input's device. Checked on the meta device, which stands in for
    an accelerator (an op mixing it with a CPU tensor raises); the embeddings' eager-only check of position values,
    which a meta tensor does not have, is skipped as in a compiled graph."""
    from hf_tdiag.models.crate_text.modeling_crate_text_blocks import CrateTextEmbeddings, position_ids_from_mask

    meta = torch.device("meta")
    assert position_ids_from_mask(None, 0, 4, meta).device == meta
    hidden = torch.zeros(2, 4, 8, device=meta)
    assert pooled_token(hidden, torch.ones(2, 4, dtype=torch.long, device=meta), causal=True).device == meta
    mssa = CrateTextModel(_config()).eval().layer[0].attention.to(meta)
    with torch.no_grad():
        out, probs = mssa(hidden, output_attentions=True)  # eager, no padding mask, 4 tokens: the block's own mask
    assert out.device == meta and probs.device == meta and probs.shape == (2, 2, 4, 4)
    emb = CrateTextEmbeddings(_config(type_vocab_size=2)).eval().to(meta)
    looked_up = []  # the default token types (zeros): a meta embedding table takes CPU indices silently, a GPU's not
    emb.token_type_embeddings.register_forward_pre_hook(lambda module, args: looked_up.append(args[0].device))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with torch.no_grad():
        assert emb(hidden, torch.arange(4, device=meta)[None]).device == meta
    assert looked_up == [meta]
