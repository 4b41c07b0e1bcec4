"""Weight discovery across BERT-like / ViT-like encoders and CRATE, the report object, and unsupported models."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_schatten_reference import dense_reference, dense_reference_from_matrices
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    DistilBertConfig,
    DistilBertModel,
    ElectraConfig,
    ElectraModel,
    GPTNeoXConfig,
    GPTNeoXModel,
    RobertaConfig,
    RobertaModel,
    ViTConfig,
    ViTModel,
)

import hf_tdiag
from hf_tdiag.probes.block_matrices import encoder_weights

L, H, A, FF = 2, 64, 2, 256
SMALL = dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=A, intermediate_size=FF)


def _bert(**kw):
    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=50, max_position_embeddings=16, **{**SMALL, **kw})).eval()


def test_bert_weights_are_views_of_the_named_parameters():
    model = _bert()
    w = encoder_weights(model)
    assert (w.family, w.num_layers, w.hidden_size, w.num_heads, w.head_dim, w.intermediate_size) == (
        "bert-like",
        L,
        H,
        A,
        H // A,
        FF,
    )
    lyr = model.encoder.layer[1]
    assert w.layers[1].query.data_ptr() == lyr.attention.self.query.weight.data_ptr()
    assert w.layers[1].names["attn_output"] == "encoder.layer.1.attention.output.dense"
    assert w.layers[1].names["ffn_out"] == "encoder.layer.1.output.dense"
    dh = H // A
    torch.testing.assert_close(w.heads(1, "key")[1], lyr.attention.self.key.weight[dh:])
    torch.testing.assert_close(w.heads(1, "attn_output")[0], lyr.attention.output.dense.weight[:, :dh].T)
    with pytest.raises(ValueError, match="role"):
        w.heads(0, "intermediate")


def _copy_bert_into(bert, target_layers, names):
    with torch.no_grad():
        for src, dst in zip(bert.encoder.layer, target_layers):
            s = {
                "query": src.attention.self.query,
                "key": src.attention.self.key,
                "value": src.attention.self.value,
                "attn_output": src.attention.output.dense,
                "ffn_in": src.intermediate.dense,
                "ffn_out": src.output.dense,
            }
            for role, path in names.items():
                dst.get_submodule(path).weight.copy_(s[role].weight)


def test_distilbert_and_vit_with_copied_weights_give_the_bert_numbers():
    bert = _bert()
    ref = hf_tdiag.schatten_bounds(bert)
    distil = DistilBertModel(DistilBertConfig(vocab_size=50, dim=H, n_layers=L, n_heads=A, hidden_dim=FF)).eval()
    _copy_bert_into(
        bert,
        distil.transformer.layer,
        {
            "query": "attention.q_lin",
            "key": "attention.k_lin",
            "value": "attention.v_lin",
            "attn_output": "attention.out_lin",
            "ffn_in": "ffn.lin1",
            "ffn_out": "ffn.lin2",
        },
    )
    vit = ViTModel(ViTConfig(image_size=8, patch_size=4, **SMALL)).eval()
    _copy_bert_into(
        bert,
        vit.layers,  # Transformers 5 ViT layout
        {
            "query": "attention.q_proj",
            "key": "attention.k_proj",
            "value": "attention.v_proj",
            "attn_output": "attention.o_proj",
            "ffn_in": "mlp.fc1",
            "ffn_out": "mlp.fc2",
        },
    )
    for other in (distil, vit):
        rep = hf_tdiag.schatten_bounds(other)
        assert rep.family == "bert-like"
        assert rep.schatten_bound == pytest.approx(ref.schatten_bound, rel=1e-12)
        assert rep.edelman_bound == pytest.approx(ref.edelman_bound, rel=1e-12)
    assert encoder_weights(distil).layers[0].names["ffn_out"] == "transformer.layer.0.ffn.lin2"


@pytest.mark.parametrize("kind", ["roberta", "electra", "bert-seqcls"])
def test_roberta_electra_and_task_heads_match_the_dense_reference(kind):
    torch.manual_seed(1)
    if kind == "roberta":
        model = RobertaModel(RobertaConfig(vocab_size=50, max_position_embeddings=20, **SMALL))
    elif kind == "electra":
        model = ElectraModel(ElectraConfig(vocab_size=50, embedding_size=32, max_position_embeddings=16, **SMALL))
    else:
        model = BertForSequenceClassification(
            BertConfig(vocab_size=50, max_position_embeddings=16, num_labels=3, **SMALL)
        )
    rep = hf_tdiag.schatten_bounds(model)
    ref = dense_reference(model.state_dict(), L, A)
    assert rep.schatten_bound == pytest.approx(ref["ours"], rel=1e-9)
    assert rep.edelman_bound == pytest.approx(ref["edelman"], rel=1e-9)


def _crate(variant, seed=0):
    from hf_tdiag.models.crate import CrateConfig, CrateModel

    torch.manual_seed(seed)
    cfg = CrateConfig(
        image_size=8,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        head_dim=16,
        variant=variant,
    )
    model = CrateModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.3, generator=torch.Generator().manual_seed(hash(name) % 2**31))
        for name, b in model.named_buffers():
            if name.endswith("fixed_output"):
                b.normal_(0, 0.3)
    return model


def _crate_matrices(model):
    """Explicit matrices from the CRATE contract: U_k = qkv.weight[kp:(k+1)p].T, O = output_matrix(), M_in = Dᵀ."""
    layers = []
    for blk in model.encoder.layer:
        u_t = blk.attention.qkv.weight.detach().double().numpy()
        o = blk.attention.output_matrix().detach().double().numpy()
        p = blk.attention.head_dim
        qk, v = [], []
        for k in range(blk.attention.num_heads):
            rows = slice(k * p, (k + 1) * p)
            qk.append(u_t[rows].T @ u_t[rows])  # U_k U_kᵀ
            v.append(u_t[rows].T @ o.T[rows])
        layers.append({"qk": qk, "v": v, "m_in": blk.ista.weight.detach().double().numpy().T, "m_out": None})
    return layers


@pytest.mark.parametrize("variant", ["crate", "crate-c", "crate-t", "crate-fix", "crate-identity"])
def test_crate_matches_dense_reference_with_identity_m_out(variant):
    model = _crate(variant)
    rep = hf_tdiag.schatten_bounds(model)
    ref = dense_reference_from_matrices(_crate_matrices(model))
    assert rep.family == "crate" and rep.model_type == "crate"
    assert [m.type for m in rep.matrices[: 2 * 2 + 1]] == ["qk", "qk", "v", "v", "ista"]
    assert not rep.by_type("m_out") and len(rep.by_type("ista")) == 2
    assert rep.schatten_bound == pytest.approx(ref["ours"], rel=1e-9)
    assert rep.edelman_bound == pytest.approx(ref["edelman"], rel=1e-9)
    np.testing.assert_allclose([m.min_contribution for m in rep.matrices], ref["mins"], rtol=1e-9)
    # QK = U_k U_kᵀ is PSD: its singular values are the squared singular values of U_k
    u = model.encoder.layer[0].attention.qkv.weight.detach().double()[:16]
    np.testing.assert_allclose(rep.matrices[0].singular_values, torch.linalg.svdvals(u).numpy() ** 2, rtol=1e-10)


def test_crate_saved_folder_matches_model_object(tmp_path):
    model = _crate("crate", seed=2)
    model.save_pretrained(tmp_path / "crate")
    a = hf_tdiag.schatten_bounds(model)
    b = hf_tdiag.schatten_bounds(str(tmp_path / "crate"))
    assert b.schatten_bound == pytest.approx(a.schatten_bound, rel=1e-12) and b.edelman_bound == pytest.approx(
        a.edelman_bound, rel=1e-12
    )


def test_report_fields_and_serialisation(tmp_path):
    model = _bert()
    rep = hf_tdiag.schatten_bounds(model, p_grid_m=5, progress=True)
    assert rep.p_grid.tolist() == [k / 5 for k in range(11)]
    assert len(rep.matrices) == L * (2 * A + 2)
    assert rep.contribution_curves.shape == (len(rep.matrices), 11)
    assert [m.type for m in rep.matrices[: 2 * A + 2]] == ["qk"] * A + ["v"] * A + ["m_in", "m_out"]
    for m in rep.matrices:
        assert m.min_contribution == pytest.approx(float(m.contributions.min()), rel=0)
        assert m.p_opt in rep.p_grid
        assert m.rank == len(m.singular_values)
        assert m.spectral_norm == pytest.approx(float(m.singular_values[0]), rel=0)
        assert m.frobenius_norm == pytest.approx(float(np.sqrt((m.singular_values**2).sum())), rel=1e-12)
        assert m.nuclear_norm == pytest.approx(float(m.singular_values.sum()), rel=1e-12)
        assert m.stable_rank == pytest.approx(m.frobenius_norm**2 / m.spectral_norm**2, rel=1e-12)
    assert {m.shape for m in rep.by_type("m_in")} == {(H, FF)} and {m.shape for m in rep.by_type("m_out")} == {(FF, H)}
    assert all(m.rank == H // A for m in rep.by_type("qk"))
    ours = sum(m.min_contribution for m in rep.matrices) + np.sqrt(L)
    assert rep.schatten_bound == pytest.approx(ours, rel=1e-12)
    d = json.loads(rep.to_json(tmp_path / "r.json"))
    assert d == json.loads((tmp_path / "r.json").read_text())
    assert (
        d["schatten_bound"] == rep.schatten_bound
        and d["edelman_bound"] == rep.edelman_bound
        and len(d["matrices"]) == len(rep.matrices)
    )
    assert "singular_values" not in rep.to_dict(include_spectra=False)["matrices"][0]
    assert rep.summary()["num_layers"] == L
    assert rep.layers_path == "encoder.layer" and d["layers_path"] == "encoder.layer"
    with pytest.raises(ValueError, match="matrix_type"):
        rep.by_type("ffn")


def test_l_phi_and_rank_tol_are_passed_through():
    model = _bert()
    a = hf_tdiag.schatten_bounds(model, L_phi=1.0)
    ref = dense_reference(model.state_dict(), L, A, L_phi=1.0, p_grid_m=3)
    b = hf_tdiag.schatten_bounds(model, L_phi=1.0, p_grid_m=3)
    assert b.schatten_bound == pytest.approx(ref["ours"], rel=1e-9) and b.edelman_bound == pytest.approx(
        ref["edelman"], rel=1e-9
    )
    assert a.alpha[0] == pytest.approx(hf_tdiag.schatten_bounds(model).alpha[0] / 1.13, rel=1e-12)
    huge_tol = hf_tdiag.schatten_bounds(model, rank_tol=0.5)
    assert all(m.rank <= 1 for m in huge_tol.matrices)  # τ = 0.5·N·max(σ₁,1) removes (almost) everything


def test_unsupported_models_and_bad_arguments(tmp_path):
    neox = GPTNeoXModel(
        GPTNeoXConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, vocab_size=20, intermediate_size=64)
    )  # a decoder with a fused query_key_value: unsupported
    with pytest.raises(ValueError, match=r"not a supported decoder.*GPT-2.*query_key_value"):
        hf_tdiag.schatten_bounds(neox)
    roberta_like = BertModel(
        BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=20)
    )
    roberta_like.encoder.layer[0].attention.self.query = torch.nn.Identity()
    with pytest.raises(ValueError, match=r"unsupported architecture 'bert'.*query: query \| q_lin"):
        hf_tdiag.schatten_bounds(roberta_like)
    with pytest.raises(ValueError, match="unsupported architecture"):
        encoder_weights(torch.nn.Sequential(torch.nn.Linear(3, 3)))
    two = torch.nn.ModuleDict({"a": _bert(), "b": _bert()})
    with pytest.raises(ValueError, match="several encoder layer lists.*a.encoder.layer.*b.encoder.layer"):
        encoder_weights(two)
    with pytest.raises(TypeError, match="model_or_path"):
        hf_tdiag.schatten_bounds(42)
    with pytest.raises(TypeError, match="model"):
        encoder_weights("bert")
    with pytest.raises(ValueError, match="model_or_path"):
        hf_tdiag.schatten_bounds(str(tmp_path / "missing"))
    model = _bert()
    for kwargs, name in [
        ({"L_phi": 0.0}, "L_phi"),
        ({"rank_tol": -1.0}, "rank_tol"),
        ({"svd_method": "x"}, "svd_method"),
        ({"p_grid_m": 0}, "m"),
        ({"num_workers": 0}, "num_workers"),
        ({"num_workers": 1.5}, "num_workers"),
    ]:
        with pytest.raises(ValueError, match=name):
            hf_tdiag.schatten_bounds(model, **kwargs)
    with torch.no_grad():
        model.encoder.layer[1].attention.self.value.weight[0, 0] = float("nan")
    for workers in (1, 2):
        with pytest.raises(ValueError, match=r"layer 1 value .*NaN"):
            hf_tdiag.schatten_bounds(model, num_workers=workers)
    model = _bert()
    with torch.no_grad():
        model.encoder.layer[0].output.dense.weight[3, 5] = float("-inf")
    threads = torch.get_num_threads()
    with pytest.raises(ValueError, match=r"layer 0 ffn_out \(encoder.layer.0.output.dense\) contains NaN or inf"):
        hf_tdiag.schatten_bounds(model, num_workers=2)
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_worker_threads_give_the_same_report(workers):
    """FFN spectra and head cores solved by a thread pool: the one-worker numbers, to rounding."""
    torch.manual_seed(1)
    model = BertModel(
        BertConfig(
            vocab_size=50,
            max_position_embeddings=16,
            hidden_size=96,
            num_hidden_layers=3,
            num_attention_heads=3,
            intermediate_size=384,
        )
    ).eval()
    threads = torch.get_num_threads()
    one = hf_tdiag.schatten_bounds(model, num_workers=1)
    many = hf_tdiag.schatten_bounds(model, num_workers=workers)
    assert torch.get_num_threads() == threads  # the workers' single-threaded torch is undone on return
    assert many.schatten_bound == pytest.approx(one.schatten_bound, rel=1e-13) and many.edelman_bound == pytest.approx(
        one.edelman_bound, rel=1e-13
    )
    assert [m.type for m in many.matrices] == [m.type for m in one.matrices]
    for a, b in zip(one.matrices, many.matrices):
        assert (a.layer, a.head, a.type, a.rank) == (b.layer, b.head, b.type, b.rank)
        np.testing.assert_allclose(b.singular_values, a.singular_values, rtol=1e-13, atol=0)
        np.testing.assert_allclose(b.contributions, a.contributions, rtol=1e-13, atol=0)
    ref = dense_reference(model.state_dict(), 3, 3)
    assert many.schatten_bound == pytest.approx(ref["ours"], rel=1e-9) and many.edelman_bound == pytest.approx(
        ref["edelman"], rel=1e-9
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_job_propagates_and_restores_torch_threads(monkeypatch, workers):
    from hf_tdiag.diagnostics import schatten as spectrum

    def boom(weight, method):
        raise RuntimeError("solver failed")

    monkeypatch.setattr(spectrum, "_ffn_spectrum", boom)
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="solver failed"):
        hf_tdiag.schatten_bounds(_bert(), num_workers=workers)
    assert torch.get_num_threads() == threads
