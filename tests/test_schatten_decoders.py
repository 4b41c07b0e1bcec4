"""Schatten / Edelman proxies of decoders (GPT-2, Llama with GQA, Mistral, Qwen2) against a dense numpy reference
built here from the checkpoints' tensors by name; streaming from the safetensors shards equals the in-memory path
bit for bit; GQA products use the shared K/V head."""

import json
import os

import numpy as np
import pytest
import torch
from decoder_models import build, decoder_dirs, decoder_models, save_sharded  # noqa: F401  (fixtures)
from safetensors import safe_open
from test_schatten_reference import dense_reference_from_matrices

import hf_tdiag

FAMILIES = ["gpt2", "llama", "mistral", "qwen2"]


def checkpoint_tensors(folder):
    """Every tensor of a sharded checkpoint as float64 numpy, read shard by shard from the index."""
    with open(os.path.join(folder, "model.safetensors.index.json")) as fh:
        files = sorted(set(json.load(fh)["weight_map"].values()))
    out = {}
    for f in files:
        with safe_open(os.path.join(folder, f), framework="pt") as fh:
            out.update({k: fh.get_tensor(k).double().numpy() for k in fh.keys()})
    return out


def gpt2_matrices(sd, L, H):
    """Row-vector matrices of GPT-2 blocks (Conv1D: y = x W + b, W stored (in, out))."""
    layers = []
    for i in range(L):
        W = sd[f"transformer.h.{i}.attn.c_attn.weight"]  # (d, 3d): [query | key | value] columns
        d = W.shape[0]
        p = d // H
        Wo = sd[f"transformer.h.{i}.attn.c_proj.weight"]  # (d_in = H·p, d_out)
        q, k, v = W[:, :d], W[:, d : 2 * d], W[:, 2 * d :]
        cols = [slice(h * p, (h + 1) * p) for h in range(H)]
        layers.append(
            {
                "qk": [q[:, c] @ k[:, c].T for c in cols],  # x W_Q,h (x' W_K,h)ᵀ = x (W_Q,h W_K,hᵀ) x'ᵀ
                "v": [v[:, c] @ Wo[c] for c in cols],
                "m_in": sd[f"transformer.h.{i}.mlp.c_fc.weight"],
                "m_out": sd[f"transformer.h.{i}.mlp.c_proj.weight"],
            }
        )
    return layers


def llama_matrices(sd, L, H, H_kv):
    """Row-vector matrices of Llama-style blocks: QK_h, Ṽ_h with query head h on K/V head h // (H/H_kv) (np.repeat,
    as Transformers' repeat_kv), M_in = [W_gateᵀ | W_upᵀ], M_out = W_downᵀ."""
    layers = []
    for i in range(L):
        g = lambda n, i=i: sd[f"model.layers.{i}.{n}.weight"]  # noqa: E731
        wq, wk, wv, wo = g("self_attn.q_proj"), g("self_attn.k_proj"), g("self_attn.v_proj"), g("self_attn.o_proj")
        d = wq.shape[1]
        p = wq.shape[0] // H
        qh = wq.reshape(H, p, d)
        kh = np.repeat(wk.reshape(H_kv, p, d), H // H_kv, axis=0)
        vh = np.repeat(wv.reshape(H_kv, p, d), H // H_kv, axis=0)
        oh = wo.T.reshape(H, p, d)  # rows of (W_O)ᵀ per query head
        layers.append(
            {
                "qk": [qh[h].T @ kh[h] for h in range(H)],
                "v": [vh[h].T @ oh[h] for h in range(H)],
                "m_in": np.concatenate([g("mlp.gate_proj").T, g("mlp.up_proj").T], axis=1),
                "m_out": g("mlp.down_proj").T,
            }
        )
    return layers


def reference(folder, family, **kw):
    sd = checkpoint_tensors(folder)
    with open(os.path.join(folder, "config.json")) as fh:
        cfg = json.load(fh)
    if family == "gpt2":
        layers = gpt2_matrices(sd, cfg["n_layer"], cfg["n_head"])
    else:
        layers = llama_matrices(sd, cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"])
    return dense_reference_from_matrices(layers, **kw), layers


def assert_matches(rep, ref, layers):
    assert rep.schatten_bound == pytest.approx(ref["ours"], rel=1e-9, abs=0)
    assert rep.edelman_bound == pytest.approx(ref["edelman"], rel=1e-9, abs=0)
    np.testing.assert_allclose(rep.alpha, ref["alpha"], rtol=1e-9)
    np.testing.assert_allclose([m.min_contribution for m in rep.matrices], ref["mins"], rtol=1e-9)
    np.testing.assert_allclose(rep.contribution_curves, np.array(ref["curves"]), rtol=1e-9)
    assert [m.p_opt for m in rep.matrices] == list(ref["p_opt"])
    assert [m.rank for m in rep.matrices] == list(ref["rank"])
    assert [m.type for m in rep.matrices] == list(ref["types"])
    for key, attr in (
        ("spectral", "spectral_norm"),
        ("norm_2_1", "norm_2_1"),
        ("norm_1_1", "norm_1_1"),
        ("stable_rank", "stable_rank"),
    ):
        np.testing.assert_allclose([getattr(m, attr) for m in rep.matrices], ref[key], rtol=1e-9, err_msg=key)
    m_in = [m for m in rep.matrices if m.type == "m_in"]
    assert all(m.shape == layers[0]["m_in"].shape for m in m_in)


@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_proxies_match_dense_reference(decoder_dirs, family):
    folder = decoder_dirs[family]
    rep = hf_tdiag.schatten_bounds(folder)
    ref, layers = reference(folder, family)
    assert_matches(rep, ref, layers)
    assert rep.family == ("gpt2" if family == "gpt2" else "llama") and rep.gated == (family != "gpt2")
    kv = {"gpt2": 4, "llama": 2, "mistral": 2, "qwen2": 1}[family]
    assert rep.num_kv_heads == kv


def test_small_weights_make_p_above_zero_win_and_still_match(tmp_path):
    """With small weights γα_ℓL shrinks and p_opt > 0 wins for some matrices: the reference follows."""
    model = build("llama", seed=3)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if prm.ndim == 2 and "embed" not in name and "lm_head" not in name:
                prm.mul_(0.02)
    folder = save_sharded(model, tmp_path / "small")
    rep = hf_tdiag.schatten_bounds(folder, L_phi=1.0)
    ref, layers = reference(folder, "llama", L_phi=1.0)
    assert_matches(rep, ref, layers)
    assert any(m.p_opt > 0 for m in rep.matrices) and not rep.degenerate


@pytest.mark.parametrize("family", FAMILIES)
def test_streaming_equals_in_memory_exactly(decoder_dirs, decoder_models, family):
    folder = decoder_dirs[family]
    streamed = hf_tdiag.schatten_bounds(folder, streaming=True)
    loaded = hf_tdiag.schatten_bounds(folder)  # AutoModel.from_pretrained, then in memory
    model = hf_tdiag.schatten_bounds(decoder_models[family], num_workers=2)  # the CausalLM object, two workers
    for other in (loaded, model):
        assert streamed.schatten_bound == other.schatten_bound and streamed.edelman_bound == other.edelman_bound
        assert np.array_equal(streamed.alpha, other.alpha) and np.array_equal(streamed.xi, other.xi)
        for a, b in zip(streamed.matrices, other.matrices):
            assert (a.layer, a.head, a.type, a.shape, a.rank, a.p_opt) == (
                b.layer,
                b.head,
                b.type,
                b.shape,
                b.rank,
                b.p_opt,
            )
            assert np.array_equal(a.singular_values, b.singular_values)
            assert np.array_equal(a.contributions, b.contributions)
            assert (a.norm_2_1, a.norm_1_1, a.frobenius_norm) == (b.norm_2_1, b.norm_1_1, b.frobenius_norm)
    assert streamed.to_dict(include_spectra=False) == {**loaded.to_dict(include_spectra=False), "model": streamed.model}


def test_streaming_chunks_large_ffn_and_matches_reference(tmp_path, monkeypatch):
    """FFN matrices larger than one chunk are streamed in blocks (Gram, or TSQR when ill-conditioned): same numbers
    both ways, and the dense reference to 1e-9."""
    from hf_tdiag.measures import schatten as S

    monkeypatch.setattr(S, "CHUNK_ENTRIES", 700)  # every FFN matrix spans several blocks
    model = build("mistral", seed=5)
    with torch.no_grad():  # one ill-conditioned M_out: the Gram eigenvalues are refused, TSQR + SVD used
        model.model.layers[0].mlp.down_proj.weight[:, :5] *= 1e-4
        model.model.layers[0].mlp.down_proj.weight[0] *= 1e-5
    folder = save_sharded(model, tmp_path / "m")
    calls = {"gram": 0, "tsqr": 0}
    gram, tsqr = S.streamed_gram, S.streamed_r_factor

    def count(key, fn):
        def wrapped(*a, **k):
            calls[key] += 1
            return fn(*a, **k)

        return wrapped

    monkeypatch.setattr(S, "streamed_gram", count("gram", gram))
    monkeypatch.setattr(S, "streamed_r_factor", count("tsqr", tsqr))
    streamed = hf_tdiag.schatten_bounds(folder, streaming=True)
    assert calls == {"gram": 4, "tsqr": 1}  # M_in, M_out of 2 layers; one ill-conditioned M_out
    loaded = hf_tdiag.schatten_bounds(folder)
    assert streamed.schatten_bound == loaded.schatten_bound and streamed.edelman_bound == loaded.edelman_bound
    ref, layers = reference(folder, "mistral")
    assert_matches(streamed, ref, layers)
    svd = hf_tdiag.schatten_bounds(folder, streaming=True, svd_method="svd")
    assert svd.schatten_bound == pytest.approx(ref["ours"], rel=1e-9) and svd.edelman_bound == pytest.approx(
        ref["edelman"], rel=1e-9
    )


def test_gqa_products_use_the_shared_kv_head(tmp_path):
    """Zero K/V head 1 of layer 0 (query heads 4..7 read it): exactly those QK_h vanish; V of K/V head 0 zeroes Ṽ_0..3."""
    model = build("llama", seed=1)
    p = 8
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight[p : 2 * p] = 0
        model.model.layers[0].self_attn.v_proj.weight[:p] = 0
    folder = save_sharded(model, tmp_path / "gqa")
    for rep in (hf_tdiag.schatten_bounds(folder), hf_tdiag.schatten_bounds(folder, streaming=True)):
        qk = {m.head: m for m in rep.matrices if m.layer == 1 and m.type == "qk"}
        v = {m.head: m for m in rep.matrices if m.layer == 1 and m.type == "v"}
        assert [qk[h].rank for h in range(8)] == [8, 8, 8, 8, 0, 0, 0, 0]
        assert [v[h].rank for h in range(8)] == [0, 0, 0, 0, 8, 8, 8, 8]
        # heads sharing a K head differ only through W_Q: same K, different products
        assert qk[0].nuclear_norm != qk[1].nuclear_norm


def test_streaming_errors(decoder_models, tmp_path):
    with pytest.raises(TypeError, match="streaming=True reads a checkpoint"):
        hf_tdiag.schatten_bounds(decoder_models["gpt2"], streaming=True)
    with pytest.raises(TypeError, match="streaming"):
        hf_tdiag.schatten_bounds(decoder_models["gpt2"], streaming="yes")
    bin_only = tmp_path / "bin"
    decoder_models["gpt2"].save_pretrained(bin_only)
    for f in os.listdir(bin_only):
        if f.endswith(".safetensors"):
            os.remove(bin_only / f)
    with pytest.raises(ValueError, match="safetensors"):
        hf_tdiag.schatten_bounds(str(bin_only), streaming=True)
