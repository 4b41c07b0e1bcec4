"""Subspace and token-state probes, and layer_srr, on small CRATE / ViT / BERT models built from configs."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel, ViTConfig, ViTForImageClassification

from hf_tdiag import CrateConfig, CrateForImageClassification, layer_srr
from hf_tdiag.measures import coding_rate, compression_rate, sparsity
from hf_tdiag.probes.srr import TERMS, SRRReport
from hf_tdiag.probes.subspaces import subspaces
from hf_tdiag.probes.token_states import token_states


def _crate(variant="crate-c", **kw):
    cfg = CrateConfig.from_preset("crate-digits", variant=variant, num_labels=10, num_hidden_layers=3, **kw)
    return CrateForImageClassification(cfg).eval()


def _vit():
    cfg = ViTConfig(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=48, image_size=16, patch_size=4)
    return ViTForImageClassification(cfg).eval()


def _bert():
    cfg = BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, vocab_size=40)
    return BertModel(cfg).eval()


# ---------------------------------------------------------------------------
# subspaces
# ---------------------------------------------------------------------------


def test_crate_subspaces_are_the_shared_projection_blocks():
    model = _crate(head_dim=8)  # p = 8 < d/K: K*p = 32 < d = 64
    K, p = 4, 8
    Us = subspaces(model)
    assert len(Us) == 3
    for layer, U in zip(model.crate.encoder.layer, Us):
        W = layer.attention.qkv.weight
        assert U.shape == (K, 64, p)
        for k in range(K):
            assert torch.equal(U[k], W[k * p : (k + 1) * p].T)
    # the same U for all three sources, and differentiable with respect to the weight
    for source in ("key", "value"):
        assert all(torch.equal(a, b) for a, b in zip(Us, subspaces(model, source=source)))
    Us[1].sum().backward()
    assert model.crate.encoder.layer[1].attention.qkv.weight.grad is not None
    assert not subspaces(model, detach=True)[0].requires_grad


@pytest.mark.parametrize("source", ["query", "key", "value"])
def test_vit_and_bert_subspaces_slice_the_projection_per_head(source):
    vit, bert = _vit(), _bert()
    names = {"query": "q_proj", "key": "k_proj", "value": "v_proj"}
    for i, U in enumerate(subspaces(vit, source=source)):
        W = getattr(vit.vit.layers[i].attention, names[source]).weight
        assert U.shape == (3, 24, 8)
        for k in range(3):
            assert torch.equal(U[k], W[8 * k : 8 * (k + 1)].T)
    for i, U in enumerate(subspaces(bert, source=source)):
        W = getattr(bert.encoder.layer[i].attention.self, source).weight
        assert U.shape == (2, 16, 8)
        assert torch.equal(U[1], W[8:16].T)
    with pytest.raises(ValueError, match="source"):
        subspaces(vit, source="output")


# ---------------------------------------------------------------------------
# token states
# ---------------------------------------------------------------------------


def test_crate_token_states_match_the_models_own_outputs():
    model = _crate()
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        out = model(x, output_hidden_states=True, output_mid_hidden_states=True)
    ts = token_states(model, x)
    assert len(ts.block_inputs) == 3 and len(ts.mid_states) == 3
    for i in range(3):
        torch.testing.assert_close(ts.block_inputs[i], out.hidden_states[i])
        torch.testing.assert_close(ts.mid_states[i], out.mid_hidden_states[i])
    assert not ts.layernorm_applied and ts.token_mask is None
    ln = token_states(model, x, apply_layernorm=True, projection_source="query")
    assert ln.layernorm_applied
    for i, layer in enumerate(model.crate.encoder.layer):
        with torch.no_grad():
            torch.testing.assert_close(ln.block_inputs[i], layer.layernorm_before(out.hidden_states[i]))
            torch.testing.assert_close(ln.mid_states[i], layer.layernorm_before(out.mid_hidden_states[i]))
            # the forward pass's own projections equal U_kᵀ LN(Z) for every head
            W = layer.attention.qkv.weight
            expected = (ln.block_inputs[i] @ W.T).unflatten(-1, (4, 16)).movedim(-2, -3)
            torch.testing.assert_close(ln.projections[i], expected)
    # without the LayerNorm the qkv input is not the measured state: nothing to reuse
    assert token_states(model, x, projection_source="query").projections == [None, None, None]


def test_vit_and_bert_token_states_are_block_inputs():
    vit = _vit()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        hidden = vit(x, output_hidden_states=True).hidden_states
    ts = token_states(vit, x, projection_source="key")
    assert ts.mid_states is None
    for i in range(2):
        torch.testing.assert_close(ts.block_inputs[i], hidden[i])
    assert ts.projections == [None, None]  # pre-norm: k_proj sees LN(Z), not Z
    ts_ln = token_states(vit, x, apply_layernorm=True, projection_source="key")
    layer = vit.vit.layers[1]
    with torch.no_grad():
        torch.testing.assert_close(ts_ln.block_inputs[1], layer.layernorm_before(hidden[1]))
        expected = (layer.layernorm_before(hidden[1]) @ layer.attention.k_proj.weight.T).unflatten(-1, (3, 8)).movedim(-2, -3)
    torch.testing.assert_close(ts_ln.projections[1], expected, rtol=1e-5, atol=1e-5)

    bert = _bert()
    ids = torch.randint(0, 40, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 3:] = 0
    with torch.no_grad():
        hidden = bert(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    ts = token_states(bert, {"input_ids": ids, "attention_mask": mask, "labels": torch.zeros(2)}, apply_layernorm=True)
    assert not ts.layernorm_applied  # post-norm blocks have no pre-attention LayerNorm
    assert torch.equal(ts.token_mask, mask.bool())
    for i in range(2):
        torch.testing.assert_close(ts.block_inputs[i], hidden[i])


# ---------------------------------------------------------------------------
# layer_srr
# ---------------------------------------------------------------------------


def _independent_crate_values(model, x, eps=0.1, lam=1.0):
    """(n, 2, L, 4) from the model's own outputs and the (separately tested) measures, layer by layer."""
    with torch.no_grad():
        out = model(x, output_hidden_states=True, output_mid_hidden_states=True)
    rows = []
    for states in (out.hidden_states[:-1], out.mid_hidden_states):
        per_layer = []
        for i, Z in enumerate(states):
            W = model.crate.encoder.layer[i].attention.qkv.weight.detach()
            U = W.reshape(4, 16, 64).transpose(1, 2)
            R, Rc, sp = coding_rate(Z, eps), compression_rate(Z, U, eps), sparsity(Z)
            per_layer.append(torch.stack([R, Rc, sp, Rc - R + lam * sp], -1))
        rows.append(torch.stack(per_layer, 1))
    return torch.stack(rows, 1)


def test_layer_srr_matches_independent_computation_and_batching():
    model = _crate()
    x = torch.randn(7, 1, 8, 8)
    expected = _independent_crate_values(model, x, eps=0.2, lam=0.5)
    report = layer_srr(model, x, eps=0.2, lam=0.5, batch_size=3, progress=False)
    assert report.states == ("block_input", "mid") and report.num_samples == 7 and report.num_layers == 3
    torch.testing.assert_close(report.values, expected, rtol=1e-9, atol=1e-9)
    for s, state in enumerate(report.states):
        for j, term in enumerate(TERMS):
            np.testing.assert_allclose(report.mean[state][term], expected[:, s, :, j].mean(0).numpy(), rtol=1e-9)
            np.testing.assert_allclose(report.std[state][term], expected[:, s, :, j].numpy().std(0), rtol=1e-7, atol=1e-12)
    # the same numbers from a DataLoader of (inputs, labels) pairs and from a dict batch
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.zeros(7)), batch_size=2)
    torch.testing.assert_close(layer_srr(model, dl, eps=0.2, lam=0.5, progress=False).values, expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(
        layer_srr(model, {"pixel_values": x}, eps=0.2, lam=0.5, batch_size=5, progress=False).values,
        expected,
        rtol=1e-9,
        atol=1e-9,
    )
    assert layer_srr(model, dl, max_batches=2, progress=False).num_samples == 4
    assert layer_srr(model, x, include_mid=False, progress=False).states == ("block_input",)
    assert report.settings["eps"] == 0.2 and report.settings["variant"] == "crate-c"


def test_layer_srr_layernorm_reuse_equals_recomputation_and_restores_mode():
    model = _crate().train()
    x = torch.randn(4, 1, 8, 8)
    reused = layer_srr(model, x, apply_layernorm=True, progress=False)
    fresh = layer_srr(model, x, apply_layernorm=True, reuse_projections=False, progress=False)
    assert model.training  # measured in eval mode, then restored
    torch.testing.assert_close(reused.values, fresh.values, rtol=1e-6, atol=1e-6)
    plain = layer_srr(model, x, progress=False)
    assert not torch.allclose(plain.values[:, :, 1:], reused.values[:, :, 1:])  # the LayerNorm changes the numbers


def test_layer_srr_bert_padding_is_excluded():
    bert = _bert()
    ids = torch.randint(1, 40, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 4:] = 0
    padded = layer_srr(bert, {"input_ids": ids, "attention_mask": mask}, source="value", progress=False)
    alone = layer_srr(bert, {"input_ids": ids[1:, :4], "attention_mask": mask[1:, :4]}, source="value", progress=False)
    torch.testing.assert_close(padded.values[1], alone.values[0], rtol=1e-5, atol=1e-5)
    # and U really is the value projection
    Z = token_states(bert, {"input_ids": ids[:1]}).block_inputs[1]
    U = subspaces(bert, source="value", detach=True)[1]
    # (post-norm: the forward pass's own float32 value projections are reused, hence the tolerance)
    torch.testing.assert_close(padded.values[0, 0, 1, 1], compression_rate(Z, U)[0], rtol=1e-6, atol=1e-6)


def test_vit_sources_differ_and_report_roundtrip(tmp_path):
    vit = _vit()
    x = torch.randn(3, 3, 16, 16)
    reports = {s: layer_srr(vit, x, source=s, progress=False) for s in ("query", "key", "value")}
    assert reports["query"].states == ("block_input",)
    # R and sparsity do not depend on U; Rc does
    torch.testing.assert_close(reports["query"].values[..., 0], reports["key"].values[..., 0])
    assert not torch.allclose(reports["query"].values[..., 1], reports["value"].values[..., 1])
    rep = reports["key"]
    path = tmp_path / "srr.json"
    rep.to_json(str(path), include_samples=True)
    data = json.loads(path.read_text())
    assert data["settings"]["source"] == "key" and data["num_samples"] == 3 and data["layers"] == [0, 1]
    back = SRRReport.from_dict(data)
    torch.testing.assert_close(back.values, rep.values)
    assert back.mean == rep.mean and back.summary() == rep.summary()
    assert rep.summary()["srr_last_layer"] == pytest.approx(rep.mean["block_input"]["srr"][-1])


def test_layer_srr_errors():
    model = _crate()
    x = torch.randn(2, 1, 8, 8)
    with pytest.raises(ValueError, match="source"):
        layer_srr(model, x, source="out")
    with pytest.raises(ValueError, match="eps"):
        layer_srr(model, x, eps=-1)
    with pytest.raises(ValueError, match="batch_size"):
        layer_srr(model, x, batch_size=0)
    with pytest.raises(TypeError, match="inputs"):
        layer_srr(model, 3.0)
    with pytest.raises(TypeError, match="model"):
        layer_srr("crate", x)
    with pytest.raises(ValueError, match="Z: contains NaN"):
        layer_srr(model, torch.full((2, 1, 8, 8), float("nan")), progress=False)


def test_accelerate_single_process_counts_each_sample_once():
    from accelerate import Accelerator

    model = _crate()
    x = torch.randn(5, 1, 8, 8)
    acc = Accelerator(cpu=True)
    dl = acc.prepare_data_loader(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=2))
    rep = layer_srr(model, dl, accelerator=acc, progress=False)
    torch.testing.assert_close(rep.values, layer_srr(model, x, progress=False).values)
    # a raw tensor is sharded and gathered too
    assert layer_srr(model, x, accelerator=acc, batch_size=2, progress=False).num_samples == 5


_WORKER = textwrap.dedent(
    """
    import json, sys, torch
    import torch.distributed as dist
    from accelerate import Accelerator
    from hf_tdiag import CrateConfig, CrateForImageClassification, layer_srr
    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    cfg = CrateConfig.from_preset("crate-digits", variant="crate-c", num_labels=10, num_hidden_layers=2)
    model = CrateForImageClassification(cfg).eval()
    x = torch.randn(7, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=2)
    rep = layer_srr(model, dl, accelerator=acc, progress=False)
    if acc.is_main_process:
        torch.save(model.state_dict(), sys.argv[1] + ".pt")
        json.dump({"world": acc.num_processes, "values": rep.values.tolist(), "mean": rep.mean}, open(sys.argv[1], "w"))
    acc.wait_for_everyone()
    dist.destroy_process_group()
    """
)


def test_accelerate_two_processes_gather_each_sample_once(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    out = tmp_path / "out.json"
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), WORLD_SIZE="2",
               LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    procs = [
        subprocess.Popen([sys.executable, str(script), str(out)], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for r in range(2)
    ]
    logs = [p.communicate(timeout=240)[0].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    data = json.loads(out.read_text())
    assert data["world"] == 2
    # same model and inputs in this single process
    cfg = CrateConfig.from_preset("crate-digits", variant="crate-c", num_labels=10, num_hidden_layers=2)
    model = CrateForImageClassification(cfg).eval()
    model.load_state_dict(torch.load(str(out) + ".pt", weights_only=True))
    x = torch.randn(7, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    single = layer_srr(model, x, progress=False)
    gathered = torch.tensor(data["values"], dtype=torch.float64)
    assert gathered.shape[0] == 7  # 7 samples over 2 processes x batches of 2: the padded duplicate is dropped
    torch.testing.assert_close(gathered, single.values, rtol=1e-9, atol=1e-9)
