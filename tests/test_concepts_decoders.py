"""Concept fidelity on decoder token states (GPT-2, Llama 8 Q / 2 KV heads, Mistral with a sliding window, Qwen2,
loaded from sharded checkpoints): the empirical KL is checked against the model's own forward pass with block ℓ's
output replaced by a hook (next-token distribution of the last token), the layer-L states are the final norm's
input, α's value/output gain uses each query head's shared K/V head, and no certified bound is claimed."""

import math

import pytest
import torch
from decoder_models import TEXTS, char_tokenizer, decoder_dirs, decoder_models  # noqa: F401  (fixtures)
from transformers import AutoModelForCausalLM

import hf_tdiag
from hf_tdiag.measures.concepts.alpha import value_output_gain
from hf_tdiag.probes.concept_decoder import value_output_heads
from hf_tdiag.probes.concept_model import concept_model_parts, layer_activations
from hf_tdiag.probes.concept_text import encode_texts
from hf_tdiag.probes.describe import describe

TOKENS = 20  # > Mistral's sliding window (16): the suffix must reuse the model's own sliding-window mask


def _blocks(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def _kl(p_logits, q_logits):
    p = torch.softmax(p_logits.double(), -1)
    return (p * (p.log() - torch.log_softmax(q_logits.double(), -1))).sum(-1)


def _replaced_logits(model, enc, layer, positions, A_hat):
    """Last-token logits of the full model with block ``layer``'s output at ``positions`` replaced by ``A_hat``."""

    def swap(module, args, out):
        hs = out[0] if isinstance(out, tuple) else out
        hs = hs.index_copy(1, positions, A_hat.to(hs))
        return (hs, *out[1:]) if isinstance(out, tuple) else hs

    hook = _blocks(model)[layer - 1].register_forward_hook(swap)
    try:
        with torch.no_grad():
            return model(input_ids=enc["input_ids"]).logits[:, -1]
    finally:
        hook.remove()


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "qwen2"])
def test_kl_matches_the_models_own_forward(decoder_models, family):
    model = decoder_models[family]
    tok = char_tokenizer()
    layer = 1
    report = hf_tdiag.concept_fidelity(
        model, TEXTS, layer, 3, tokenizer=tok, max_tokens=TOKENS, return_tensors=True, power_iters=5, progress=False
    )
    t = report.tensors
    enc = encode_texts(tok, TEXTS, max_tokens=TOKENS)
    assert report["n_tokens"] == TOKENS and report["n_images"] == len(TEXTS) and report["modality"] == "text"
    positions = torch.arange(1, TOKENS + 1)  # <s> at 0 is kept aside
    with torch.no_grad():
        own = model(input_ids=enc["input_ids"]).logits[:, -1]
    torch.testing.assert_close(t["logits"], own, rtol=1e-4, atol=1e-4)  # the head is the LM head, last token
    hat = _replaced_logits(model, enc, layer, positions, t["A_hat"])
    torch.testing.assert_close(t["logits_hat"], hat, rtol=1e-4, atol=1e-4)
    kl = _kl(own, hat)
    assert report["per_image"]["kl"] == pytest.approx(kl.tolist(), rel=1e-3, abs=1e-6)
    assert max(report["per_image"]["kl"]) > 1e-6  # 3 concepts do not reconstruct exactly
    # estimated bound only; the certified one is not claimed for decoders
    assert "bound_certified" not in report and "decoders" in report["bound_certified_note"]
    assert report["bound_estimated"] > 0 and 0.0 <= report["frac_kl_below_bound_estimated"] <= 1.0
    assert report["constants_estimated"]["w_c_op"] == pytest.approx(
        float(torch.linalg.matrix_norm(model.get_output_embeddings().weight.detach().double(), ord=2)), rel=1e-9
    )


def test_last_layer_states_are_before_the_final_norm(decoder_models):
    model = decoder_models["llama"]
    tok = char_tokenizer()
    enc = encode_texts(tok, TEXTS[:3], max_tokens=10)
    cm = concept_model_parts(model)
    L = model.config.num_hidden_layers
    acts = layer_activations(model, enc, L, cm=cm)
    seen = {}
    hook = model.model.norm.register_forward_pre_hook(lambda m, a: seen.__setitem__("z", a[0]))
    with torch.no_grad():
        hs = model(input_ids=enc["input_ids"], output_hidden_states=True).hidden_states
    hook.remove()
    torch.testing.assert_close(acts.frame, seen["z"])
    assert not torch.allclose(acts.frame, hs[L])  # Transformers' hidden_states[L] has the final norm applied
    torch.testing.assert_close(acts.features, model.model.norm(seen["z"][:, -1]))


def test_sdpa_and_eager_agree(decoder_dirs):
    tok = char_tokenizer()
    out = {}
    for impl in ("eager", "sdpa"):
        model = AutoModelForCausalLM.from_pretrained(decoder_dirs["mistral"], attn_implementation=impl).eval()
        out[impl] = hf_tdiag.concept_fidelity(
            model, TEXTS, 1, 3, tokenizer=tok, max_tokens=TOKENS, bounds=False, progress=False
        )
    assert out["eager"]["kl"] == pytest.approx(out["sdpa"]["kl"], rel=1e-3, abs=1e-7)


def test_alpha_gain_uses_the_shared_kv_head(decoder_models):
    """Σ_h ‖W_V,g(h)‖‖W_O,h‖ by hand from v_proj / o_proj rows and columns (8 query heads, 2 K/V heads, p = 8)."""
    model = decoder_models["llama"]
    attn = model.model.layers[1].self_attn
    Wv, Wo = attn.v_proj.weight.detach().double(), attn.o_proj.weight.detach().double()
    expect = sum(
        float(torch.linalg.matrix_norm(Wv[(h // 4) * 8 : (h // 4 + 1) * 8], ord=2))
        * float(torch.linalg.matrix_norm(Wo[:, h * 8 : (h + 1) * 8], ord=2))
        for h in range(8)
    )
    assert value_output_gain(value_output_heads(model, describe(model).decoder, 1)) == pytest.approx(expect, rel=1e-12)
    # GPT-2 stores c_proj as Conv1D (in, out): W_O,h are the rows h·p:(h+1)·p of its weight
    gpt2 = decoder_models["gpt2"]
    a = gpt2.transformer.h[0].attn
    W, P = a.c_attn.weight.detach().double(), a.c_proj.weight.detach().double()
    expect = sum(
        float(torch.linalg.matrix_norm(W[:, 64 + h * 8 : 64 + (h + 1) * 8], ord=2))
        * float(torch.linalg.matrix_norm(P[h * 8 : (h + 1) * 8], ord=2))
        for h in range(4)
    )
    assert value_output_gain(value_output_heads(gpt2, describe(gpt2).decoder, 0)) == pytest.approx(expect, rel=1e-12)


def test_layer_sweep_on_a_decoder(decoder_models):
    model = decoder_models["qwen2"]
    sweep = hf_tdiag.concept_fidelity(
        model, TEXTS, concepts=3, layers="all", tokenizer=char_tokenizer(), max_tokens=12, bounds=False, progress=False
    )
    assert sweep["layers"] == [0, 1, 2, 3] and sweep["modality"] == "text"
    last = sweep["per_layer"][3]
    assert last["n_suffix_blocks"] == 0 and math.isfinite(last["kl"])
