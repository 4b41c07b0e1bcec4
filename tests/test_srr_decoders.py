"""SRR on decoders (GPT-2, Llama with 8 query / 2 K/V heads, Mistral, Qwen2 loaded from sharded checkpoints):
causal forward, right-padded batches, ``source`` in {query, key, value}; checked against a numpy computation
written here from the weights as stored (per-head slices by hand) and each sample's unpadded forward pass."""

import copy

import numpy as np
import pytest
import torch
from decoder_models import build, decoder_dirs, decoder_models  # noqa: F401  (fixtures)

from hf_tdiag.diagnostics.srr import layer_srr
from hf_tdiag.measures.coding_rate import compression_rate
from hf_tdiag.probes.subspaces import subspaces

EPS, LAM = 0.5, 0.3
LENGTHS = (9, 6, 4)  # right padding: sample 0 full, samples 1 and 2 padded


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 64, (len(LENGTHS), max(LENGTHS)), generator=g)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(LENGTHS):
        mask[b, :n] = 1
        ids[b, n:] = 1  # the pad token
    return {"input_ids": ids, "attention_mask": mask}


def _blocks(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def _final_norm(model):
    return model.transformer.ln_f if hasattr(model, "transformer") else model.model.norm


def _U_by_hand(model, layer: int, source: str) -> list[np.ndarray]:
    """Per-head ``U_k`` (d, p) sliced from the stored weight: GPT-2's Conv1D c_attn (d, 3d) columns, or the rows of
    q_proj / k_proj / v_proj (K·p, d) of a Llama-style block (K = H for the query, H_kv for key/value)."""
    cfg = model.config
    H = cfg.num_attention_heads
    block = _blocks(model)[layer]
    if hasattr(model, "transformer"):
        W = block.attn.c_attn.weight.detach().double().numpy()  # y = x W + b
        d = W.shape[0]
        off = {"query": 0, "key": d, "value": 2 * d}[source]
        p = d // H
        return [W[:, off + k * p : off + (k + 1) * p] for k in range(H)]
    lin = {"query": "q_proj", "key": "k_proj", "value": "v_proj"}[source]
    W = getattr(block.self_attn, lin).weight.detach().double().numpy()  # (K·p, d)
    p = cfg.hidden_size // H
    return [W[k * p : (k + 1) * p].T for k in range(W.shape[0] // p)]


def _states_alone(model, ids):
    """hidden_states[0..L-1] and block L's output (the final norm's input) of one unpadded sample, (N, d) each."""
    seen = {}
    hook = _final_norm(model).register_forward_pre_hook(lambda m, a: seen.__setitem__("z", a[0]))
    try:
        with torch.no_grad():
            hs = model(input_ids=ids[None], output_hidden_states=True).hidden_states
    finally:
        hook.remove()
    return [h[0].double().numpy() for h in hs[:-1]] + [seen["z"][0].double().numpy()]


def _logdet_i_plus(c, A):
    sign, value = np.linalg.slogdet(np.eye(A.shape[1]) + c * A.T @ A)
    assert sign > 0
    return value


def _terms(Z, Us):
    """R, Rc, sparsity, srr of one sample's real tokens Z (N, d) by the definitions."""
    N, d = Z.shape
    R = 0.5 * _logdet_i_plus(d / (N * EPS**2), Z)
    Rc = sum(0.5 * _logdet_i_plus(U.shape[1] / (N * EPS**2), Z @ U) for U in Us)
    sp = np.count_nonzero(Z) / (N * d)
    return np.array([R, Rc, sp, Rc - R + LAM * sp])


@pytest.fixture(scope="module")
def double_models(decoder_models):
    """float64 copies, so padded and unpadded forward passes agree to rounding."""
    return {f: copy.deepcopy(m).double().eval() for f, m in decoder_models.items()}


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "qwen2"])
@pytest.mark.parametrize("source", ["query", "key", "value"])
def test_srr_matches_numpy_reference(double_models, family, source):
    model = double_models[family]
    batch = _batch()
    report = layer_srr(model, batch, source=source, eps=EPS, lam=LAM, precision="float64", progress=False)
    L = model.config.num_hidden_layers
    # transformers builds rotary cos/sin in float32 whatever the model's dtype, and a batch of 3 and a batch of 1
    # may round that float32 product differently on another CPU (CI saw 2e-8 relative); GPT-2 has no rotary table
    tol = 1e-9 if family == "gpt2" else 1e-6
    assert report.states == ("output", "input") and report.num_layers == L and report.num_samples == len(LENGTHS)
    for b, n in enumerate(LENGTHS):
        Z = _states_alone(model, batch["input_ids"][b, :n])  # Z^0 … Z^L of the sample alone
        for ell in range(1, L + 1):
            Us = _U_by_hand(model, ell - 1, source)
            np.testing.assert_allclose(report.values[b, 0, ell - 1].numpy(), _terms(Z[ell], Us), rtol=tol, atol=tol)
            np.testing.assert_allclose(report.values[b, 1, ell - 1].numpy(), _terms(Z[ell - 1], Us), rtol=tol, atol=tol)
        np.testing.assert_allclose(
            report.embedding_values[b].numpy(), _terms(Z[0], _U_by_hand(model, 0, source)), rtol=tol, atol=tol
        )


def test_gqa_subspaces_and_settings(decoder_models):
    model = decoder_models["llama"]  # 8 query heads, 2 K/V heads
    for source, K in (("query", 8), ("key", 2), ("value", 2)):
        U = subspaces(model, source)
        assert all(u.shape == (K, 64, 8) for u in U)
        report = layer_srr(model, _batch(), source=source, progress=False)
        s = report.settings
        assert s["num_subspaces"] == K and s["num_heads"] == 8 and s["num_kv_heads"] == 2 and s["causal"] is True
        expect = [[h] for h in range(8)] if source == "query" else [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert s["query_heads"] == expect
    # K/V head 1 is read by query heads 4..7: its U is k_proj rows 8..15
    k = model.model.layers[1].self_attn.k_proj.weight
    assert torch.equal(subspaces(model, "key")[1][1], k[8:16].T)


def test_gqa_shared_subspaces_counted_once(decoder_models):
    """Rᶜ with every query head's (shared) K/V subspace listed is exactly H/H_kv times Rᶜ with each K/V head once."""
    model = decoder_models["llama"]
    Z = torch.randn(2, 9, 64, dtype=torch.float64)
    U = subspaces(model, "key", detach=True)[0].double()
    per_query_head = U.repeat_interleave(4, dim=0)  # query head h reads K/V head h // 4
    once = compression_rate(Z, U, eps=EPS, precision="float64")
    torch.testing.assert_close(
        compression_rate(Z, per_query_head, eps=EPS, precision="float64"), 4 * once, rtol=1e-12, atol=1e-12
    )


def test_padding_and_batching_do_not_change_a_sample(decoder_models):
    """float32 model: a right-padded sample in a batch measures as the same sample alone (to float32 rounding)."""
    model = decoder_models["mistral"]
    batch = _batch(seed=3)
    together = layer_srr(model, batch, source="key", progress=False).values
    for b, n in enumerate(LENGTHS):
        alone = layer_srr(model, {"input_ids": batch["input_ids"][b : b + 1, :n]}, source="key", progress=False).values
        torch.testing.assert_close(together[b], alone[0], rtol=2e-4, atol=2e-4)


def test_padding_tokens_are_excluded(decoder_models):
    """Measured without its attention_mask, a padded batch counts the pad tokens and gives other numbers."""
    model = decoder_models["qwen2"]
    batch = _batch()
    masked = layer_srr(model, batch, progress=False).values
    unmasked = layer_srr(model, {"input_ids": batch["input_ids"]}, progress=False).values
    assert torch.allclose(masked[0], unmasked[0], rtol=1e-4, atol=1e-4)  # the full-length sample: no padding
    assert not torch.allclose(masked[2], unmasked[2], rtol=1e-2, atol=1e-2)


def test_tied_and_fresh_models_run(tmp_path):
    """A model built in memory (not from a checkpoint) gives the same SRR as its sharded reload."""
    from decoder_models import save_sharded
    from transformers import AutoModelForCausalLM

    model = build("gpt2", seed=5)
    path = save_sharded(model, tmp_path / "gpt2")
    again = AutoModelForCausalLM.from_pretrained(path).eval()
    a = layer_srr(model, _batch(), source="value", progress=False).values
    b = layer_srr(again, _batch(), source="value", progress=False).values
    torch.testing.assert_close(a, b)
