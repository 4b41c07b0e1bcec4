"""Which query heads read each subspace (hf_tdiag.probes.subspaces.subspace_heads) for grouped-query attention,
multi-head attention and CRATE, checked against the model's own projection weights: written for the survivors of
the mutation run (issue 22)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaModel

from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
from hf_tdiag.probes.describe import describe
from hf_tdiag.probes.subspaces import subspace_heads, subspaces


def _llama(kv_heads: int) -> LlamaModel:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=kv_heads,
        max_position_embeddings=16,
    )
    return LlamaModel(cfg)


def test_gqa_key_and_value_heads_are_listed_once_with_the_query_heads_that_read_them():
    model = _llama(kv_heads=2)
    arch = describe(model)
    assert subspace_heads(arch) == subspace_heads(arch, "query")  # the default source is the query
    q = subspace_heads(arch, "query")
    assert q == {"num_subspaces": 8, "head_dim": 4, "query_heads": [[h] for h in range(8)]}
    for source, proj in (("key", "k_proj"), ("value", "v_proj")):
        heads = subspace_heads(arch, source)
        # repeat_kv: query head h reads K/V head h // (H / H_kv) = h // 4
        assert heads == {"num_subspaces": 2, "head_dim": 4, "query_heads": [[0, 1, 2, 3], [4, 5, 6, 7]]}
        assert all(isinstance(h, int) for g in heads["query_heads"] for h in g)
        U = subspaces(model, source)
        W = getattr(model.layers[1].self_attn, proj).weight  # (H_kv·p, d): rows g·p:(g+1)·p are U_gᵀ
        assert len(U) == 2 and U[1].shape == (2, 32, 4)
        for g in range(2):
            torch.testing.assert_close(U[1][g], W[g * 4 : (g + 1) * 4].T)


def test_multi_head_decoder_and_crate_have_one_subspace_per_head_for_every_source():
    arch = describe(_llama(kv_heads=8))
    for source in ("query", "key", "value"):
        assert subspace_heads(arch, source) == {
            "num_subspaces": 8,
            "head_dim": 4,
            "query_heads": [[h] for h in range(8)],
        }
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=1)
    crate = describe(CrateForImageClassification(cfg))
    H, p = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    for source in ("query", "key", "value"):  # CRATE: one shared projection, whatever the source
        assert subspace_heads(crate, source) == {
            "num_subspaces": H,
            "head_dim": p,
            "query_heads": [[h] for h in range(H)],
        }


def test_an_unknown_source_is_named():
    with pytest.raises(ValueError, match=r"^source: expected one of"):
        subspace_heads(describe(_llama(kv_heads=2)), "keys")
