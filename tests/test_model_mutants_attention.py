"""Each family's ``eager_attention_forward`` called as the attention interface calls it, against a float64 softmax
attention written here: an additive mask, a boolean mask (text CRATE), a mask longer than the keys (text CRATE's
static cache), the dtype of the output, and the default dropout of 0 in training (mutation survivors of the five
modeling files, whose blocks never pass a mask or leave the dropout out); and each model's attention modules
declaring whether they are causal, as the probes read it."""

from __future__ import annotations

import math

import pytest
import torch
from model_cases import BY_NAME, CASES
from torch import nn

from hf_tdiag.models.crate import modeling_crate
from hf_tdiag.models.crate_alpha import modeling_crate_alpha
from hf_tdiag.models.crate_mae import modeling_crate_mae
from hf_tdiag.models.crate_text import modeling_crate_text_blocks
from hf_tdiag.models.tost import modeling_tost
from hf_tdiag.probes.describe import is_causal

FUNCTIONS = {
    "crate": modeling_crate.eager_attention_forward,
    "crate-alpha": modeling_crate_alpha.eager_attention_forward,
    "crate-mae": modeling_crate_mae.eager_attention_forward,
    "crate-text": modeling_crate_text_blocks.eager_attention_forward,
    "tost": modeling_tost.eager_attention_forward,
}
B, K, NQ, NK, P = 2, 3, 4, 5, 6


def _qkv(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, K, n, P, generator=g, dtype=torch.float64).to(dtype) for n in (NQ, NK, NK)]


def _reference(q, k, v, scaling, keep=None):
    """``softmax(q kᵀ · scaling) v`` in float64, keys outside ``keep`` (B, NK) left out by hand."""
    out = torch.zeros(B, NQ, K, P, dtype=torch.float64)
    probs = torch.zeros(B, K, NQ, NK, dtype=torch.float64)
    for b in range(B):
        cols = [j for j in range(NK) if keep is None or keep[b, j]]
        for h in range(K):
            for i in range(NQ):
                s = [float(q[b, h, i] @ k[b, h, j]) * scaling for j in cols]
                top = max(s)
                w = [math.exp(x - top) for x in s]
                for j, wj in zip(cols, w, strict=True):
                    probs[b, h, i, j] = wj / sum(w)
                out[b, i, h] = sum(probs[b, h, i, j] * v[b, h, j] for j in cols)
    return out, probs


KEEP = torch.tensor([[1, 1, 1, 0, 1], [0, 1, 1, 1, 0]], dtype=torch.bool)


@pytest.mark.parametrize("family", list(FUNCTIONS))
def test_an_additive_mask_leaves_the_masked_keys_out(family):
    q, k, v = _qkv()
    additive = torch.zeros(B, 1, 1, NK, dtype=torch.float64).masked_fill(~KEEP[:, None, None, :], -1e9)
    out, probs = FUNCTIONS[family](nn.Module().eval(), q, k, v, additive, scaling=0.5)
    ref_out, ref_probs = _reference(q, k, v, 0.5, KEEP)
    assert out.dtype == probs.dtype == torch.float64  # probabilities cast back to the query's dtype
    torch.testing.assert_close(probs, ref_probs, rtol=0, atol=1e-6)  # softmax taken in float32
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", list(FUNCTIONS))
def test_without_a_mask_every_key_counts_and_training_keeps_the_default_dropout_of_zero(family):
    q, k, v = _qkv()
    module = nn.Module().train()  # in training, the default dropout (0) must leave the probabilities whole
    out, probs = FUNCTIONS[family](module, q, k, v, None, scaling=P**-0.5)
    ref_out, ref_probs = _reference(q, k, v, P**-0.5)
    torch.testing.assert_close(probs, ref_probs, rtol=0, atol=1e-6)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-5)


def test_text_crate_takes_a_boolean_mask_and_a_mask_longer_than_the_keys():
    """A boolean (SDPA-style, True = attend) mask as output_attentions hands to eager, and an additive mask with
    columns beyond the keys (a static cache's mask): only the first NK columns count."""
    fn = FUNCTIONS["crate-text"]
    q, k, v = _qkv()
    ref_out, ref_probs = _reference(q, k, v, 0.5, KEEP)
    longer = torch.cat([KEEP, torch.zeros(B, 3, dtype=torch.bool)], dim=1)[:, None, None, :]
    out, probs = fn(nn.Module().eval(), q, k, v, longer, scaling=0.5)
    torch.testing.assert_close(probs, ref_probs, rtol=0, atol=1e-6)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-5)
    # the extra columns are large and positive: kept, they would dominate every row
    additive = torch.zeros(B, 1, 1, NK + 3, dtype=torch.float64)
    additive[..., :NK] = additive[..., :NK].masked_fill(~KEEP[:, None, None, :], -1e9)
    additive[..., NK:] = 50.0
    out, probs = fn(nn.Module().eval(), q, k, v, additive, scaling=0.5)
    torch.testing.assert_close(probs, ref_probs, rtol=0, atol=1e-6)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", list(FUNCTIONS))
def test_a_masked_bfloat16_call_returns_bfloat16_close_to_the_float64_reference(family):
    q, k, v = _qkv(torch.bfloat16)
    additive = torch.zeros(B, 1, 1, NK, dtype=torch.bfloat16).masked_fill(~KEEP[:, None, None, :], -1e4)
    out, probs = FUNCTIONS[family](nn.Module().eval(), q, k, v, additive, scaling=0.5)
    ref_out, ref_probs = _reference(q.double(), k.double(), v.double(), 0.5, KEEP)
    assert out.dtype == probs.dtype == torch.bfloat16
    torch.testing.assert_close(probs.double(), ref_probs, rtol=0, atol=0.03)
    torch.testing.assert_close(out.double(), ref_out, rtol=0, atol=0.1)


@pytest.mark.parametrize("family", list(FUNCTIONS))
def test_a_dropout_rate_is_not_applied_in_eval(family):
    q, k, v = _qkv()
    out, probs = FUNCTIONS[family](nn.Module().eval(), q, k, v, None, scaling=0.5, dropout=0.9)
    ref_out, ref_probs = _reference(q, k, v, 0.5)
    torch.testing.assert_close(probs, ref_probs, rtol=0, atol=1e-6)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_each_attention_declares_whether_it_is_causal(name):
    """The attention modules' ``is_causal`` is what hf-tdiag's probes (``probes.describe.is_causal``) and
    transformers' sdpa/flash interfaces (when no ``is_causal`` is passed) read: True only for a causal text model."""
    case = BY_NAME[name]
    model = case.build()
    assert is_causal(model) is case.causal
