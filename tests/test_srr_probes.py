"""Subspace and token-state probes, and layer_srr, on small CRATE / ViT / BERT models built from configs."""

import copy
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
from hf_tdiag._threads import torch_threads
from hf_tdiag.diagnostics.srr import TERMS, SRRReport
from hf_tdiag.measures import coding_rate, compression_rate, sparsity
from hf_tdiag.probes.subspaces import subspaces
from hf_tdiag.probes.token_states import token_states


def _crate(variant="crate-c", **kw):
    cfg = CrateConfig.from_preset("crate-digits", variant=variant, num_labels=10, num_hidden_layers=3, **kw)
    return CrateForImageClassification(cfg).eval()


def _vit():
    cfg = ViTConfig(
        hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=48, image_size=16, patch_size=4
    )
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
    assert len(ts.block_inputs) == len(ts.block_outputs) == len(ts.mid_states) == 3
    for ell in range(1, 4):  # block ell: input Z^{ell-1}, mid Z^{ell-1/2}, output Z^ell
        torch.testing.assert_close(ts.block_inputs[ell - 1], out.hidden_states[ell - 1])
        torch.testing.assert_close(ts.mid_states[ell - 1], out.mid_hidden_states[ell - 1])
        torch.testing.assert_close(ts.block_outputs[ell - 1], out.hidden_states[ell])
    assert not ts.layernorm_applied and ts.token_mask is None
    ln = token_states(model, x, apply_layernorm=True, projection_source="query")
    assert ln.layernorm_applied
    for i, layer in enumerate(model.crate.encoder.layer):
        with torch.no_grad():
            torch.testing.assert_close(ln.block_inputs[i], layer.layernorm_before(out.hidden_states[i]))
            torch.testing.assert_close(ln.mid_states[i], layer.layernorm_before(out.mid_hidden_states[i]))
            torch.testing.assert_close(ln.block_outputs[i], layer.layernorm_before(out.hidden_states[i + 1]))
            # the forward pass's own projections equal U_kᵀ LN(Z) for every head
            W = layer.attention.qkv.weight
            expected = (ln.block_inputs[i] @ W.T).unflatten(-1, (4, 16)).movedim(-2, -3)
            torch.testing.assert_close(ln.projections[i], expected)
    # without the LayerNorm the qkv input is not the measured state: nothing to reuse, but the qkv output is kept
    plain = token_states(model, x, projection_source="query")
    assert plain.projections == [None, None, None]
    torch.testing.assert_close(plain.source_outputs[2], ln.projections[2])


def test_vit_and_bert_token_states_are_block_inputs_and_outputs():
    vit = _vit()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        hidden = vit(x, output_hidden_states=True).hidden_states
    ts = token_states(vit, x, projection_source="key")
    assert ts.mid_states is None and len(hidden) == 3
    for ell in range(1, 3):
        torch.testing.assert_close(ts.block_inputs[ell - 1], hidden[ell - 1])
        torch.testing.assert_close(ts.block_outputs[ell - 1], hidden[ell])
    assert ts.projections == [None, None]  # pre-norm: k_proj sees LN(Z), not Z
    ts_ln = token_states(vit, x, apply_layernorm=True, projection_source="key")
    layer = vit.vit.layers[1]
    with torch.no_grad():
        torch.testing.assert_close(ts_ln.block_inputs[1], layer.layernorm_before(hidden[1]))
        expected = (
            (layer.layernorm_before(hidden[1]) @ layer.attention.k_proj.weight.T).unflatten(-1, (3, 8)).movedim(-2, -3)
        )
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
    for ell in range(1, 3):
        torch.testing.assert_close(ts.block_inputs[ell - 1], hidden[ell - 1])
        torch.testing.assert_close(ts.block_outputs[ell - 1], hidden[ell])


# ---------------------------------------------------------------------------
# layer_srr: "layer l" is the output of block l, by hand
# ---------------------------------------------------------------------------


def _by_hand(Z, U, eps, lam, mask=None):
    """(R, Rc, sparsity, SRR) of one sample Z (N, d), U (K, d, p): token-side slogdet in float64, written out."""
    if mask is not None:
        Z = Z[mask.bool()]
    Z, U = Z.double(), U.double()
    N, d = Z.shape
    K, _, p = U.shape

    def half_logdet(A, c):  # ½ logdet(I_N + c A Aᵀ) on the N x N (token) side
        return 0.5 * torch.linalg.slogdet(torch.eye(A.shape[0], dtype=torch.float64) + c * A @ A.T)[1]

    R = half_logdet(Z, d / (N * eps**2))
    Rc = sum(half_logdet(Z @ U[k], p / (N * eps**2)) for k in range(K))
    sp = float((Z != 0).sum()) / (N * d)
    return torch.tensor([float(R), float(Rc), sp, float(Rc - R + lam * sp)], dtype=torch.float64)


def _check_layers_by_hand(report, hidden, Us, eps, lam, mask=None):
    """Layer l (l = 1..L, incl. L) = hidden[l] with U^l; embeddings = hidden[0] with U^1; per sample."""
    L = len(Us)
    assert report.layers == list(range(1, L + 1)) and len(hidden) == L + 1
    out = report.states.index("output")
    for b in range(hidden[0].shape[0]):
        m = None if mask is None else mask[b]
        torch.testing.assert_close(
            report.embedding_values[b], _by_hand(hidden[0][b], Us[0], eps, lam, m), rtol=1e-7, atol=1e-7
        )
        for ell in range(1, L + 1):
            expected = _by_hand(hidden[ell][b], Us[ell - 1], eps, lam, m)
            torch.testing.assert_close(report.values[b, out, ell - 1], expected, rtol=1e-7, atol=1e-7)
    mean = torch.stack(
        [
            torch.stack(
                [
                    _by_hand(hidden[ell][b], Us[ell - 1], eps, lam, None if mask is None else mask[b])
                    for b in range(hidden[0].shape[0])
                ]
            ).mean(0)
            for ell in range(1, L + 1)
        ]
    )
    np.testing.assert_allclose(report.per_layer("srr"), mean[:, 3].numpy(), rtol=1e-7)
    assert report.summary()["srr_last_layer"] == pytest.approx(float(mean[-1, 3]), rel=1e-7)
    assert report.summary()["srr_mean_over_layers"] == pytest.approx(float(mean[:, 3].mean()), rel=1e-7)


def test_crate_layer_l_is_the_output_of_block_l_by_hand():
    model = _crate(variant="crate")
    x = torch.randn(3, 1, 8, 8)
    report = layer_srr(model, x, eps=0.3, lam=0.5, progress=False)
    assert report.states == ("output", "input", "mid")
    with torch.no_grad():
        out = model(x, output_hidden_states=True, output_mid_hidden_states=True)
    Us = [layer.attention.qkv.weight.detach().reshape(4, 16, 64).transpose(1, 2) for layer in model.crate.encoder.layer]
    _check_layers_by_hand(report, out.hidden_states, Us, 0.3, 0.5)
    # block l's input Z^{l-1} and mid state Z^{l-1/2}, both with U^l
    for ell in range(1, 4):
        for state, Z in (("input", out.hidden_states[ell - 1]), ("mid", out.mid_hidden_states[ell - 1])):
            torch.testing.assert_close(
                report.values[1, report.states.index(state), ell - 1],
                _by_hand(Z[1], Us[ell - 1], 0.3, 0.5),
                rtol=1e-7,
                atol=1e-7,
            )
    # the ISTA output is sparse; the embeddings and mid states are dense
    assert report.embeddings["mean"]["sparsity"] == 1.0 and report.mean["output"]["sparsity"][-1] < 1.0


def test_vit_layer_l_is_the_output_of_block_l_by_hand():
    vit = _vit()
    x = torch.randn(2, 3, 16, 16)
    report = layer_srr(vit, x, source="value", eps=0.2, progress=False)
    assert report.states == ("output", "input")
    with torch.no_grad():
        hidden = vit(x, output_hidden_states=True).hidden_states
    Us = [layer.attention.v_proj.weight.detach().reshape(3, 8, 24).transpose(1, 2) for layer in vit.vit.layers]
    _check_layers_by_hand(report, hidden, Us, 0.2, 1.0)


def test_bert_layer_l_is_the_output_of_block_l_by_hand_with_padding():
    bert = _bert()
    ids = torch.randint(1, 40, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 4:] = 0
    report = layer_srr(bert, {"input_ids": ids, "attention_mask": mask}, source="key", progress=False)
    with torch.no_grad():
        hidden = bert(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    Us = [layer.attention.self.key.weight.detach().reshape(2, 8, 16).transpose(1, 2) for layer in bert.encoder.layer]
    _check_layers_by_hand(report, hidden, Us, 0.1, 1.0, mask=mask)
    # padding is excluded: the padded sample equals the same tokens alone
    alone = layer_srr(bert, {"input_ids": ids[1:, :4], "attention_mask": mask[1:, :4]}, source="key", progress=False)
    torch.testing.assert_close(report.values[1], alone.values[0], rtol=1e-5, atol=1e-5)


def _independent_crate_values(model, x, eps=0.1, lam=1.0):
    """(n, 3, L, 4): outputs, inputs, mids from the model's own outputs and the (separately tested) measures."""
    with torch.no_grad():
        out = model(x, output_hidden_states=True, output_mid_hidden_states=True)
    rows = []
    for states in (out.hidden_states[1:], out.hidden_states[:-1], out.mid_hidden_states):
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
    # both at one thread: the diagnostic caps torch's count by the idle cores, and float32 products summed in another
    # order by another thread count differ at 1e-8 relative, above this test's 1e-9
    with torch_threads(1):
        expected = _independent_crate_values(model, x, eps=0.2, lam=0.5)
        report = layer_srr(model, x, eps=0.2, lam=0.5, batch_size=3, progress=False)
    assert report.states == ("output", "input", "mid") and report.num_samples == 7 and report.num_layers == 3
    torch.testing.assert_close(report.values, expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(report.embedding_values, expected[:, 1, 0], rtol=1e-9, atol=1e-9)  # Z^0 with U^1
    for s, state in enumerate(report.states):
        for j, term in enumerate(TERMS):
            np.testing.assert_allclose(report.mean[state][term], expected[:, s, :, j].mean(0).numpy(), rtol=1e-9)
            np.testing.assert_allclose(
                report.std[state][term], expected[:, s, :, j].numpy().std(0), rtol=1e-7, atol=1e-12
            )
    # the same numbers from a DataLoader of (inputs, labels) pairs and from a dict batch
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.zeros(7)), batch_size=2)
    torch.testing.assert_close(
        layer_srr(model, dl, eps=0.2, lam=0.5, progress=False).values, expected, rtol=1e-9, atol=1e-9
    )
    torch.testing.assert_close(
        layer_srr(model, {"pixel_values": x}, eps=0.2, lam=0.5, batch_size=5, progress=False).values,
        expected,
        rtol=1e-9,
        atol=1e-9,
    )
    assert layer_srr(model, dl, max_batches=2, progress=False).num_samples == 4
    assert layer_srr(model, x, include_mid=False, progress=False).states == ("output", "input")
    assert report.settings["eps"] == 0.2 and report.settings["variant"] == "crate-c"


def test_layer_srr_layernorm_reuse_equals_recomputation_and_restores_mode():
    model = _crate().train()
    x = torch.randn(4, 1, 8, 8)
    reused = layer_srr(model, x, apply_layernorm=True, progress=False)
    fresh = layer_srr(model, x, apply_layernorm=True, reuse_projections=False, progress=False)
    assert model.training  # measured in eval mode, then restored
    torch.testing.assert_close(reused.values, fresh.values, rtol=1e-6, atol=1e-6)
    plain = layer_srr(model, x, progress=False)
    assert not torch.allclose(plain.values, reused.values)  # the LayerNorm changes the numbers


def test_vit_sources_differ_and_report_roundtrip(tmp_path):
    vit = _vit()
    x = torch.randn(3, 3, 16, 16)
    reports = {s: layer_srr(vit, x, source=s, progress=False) for s in ("query", "key", "value")}
    # R and sparsity do not depend on U; Rc does
    torch.testing.assert_close(reports["query"].values[..., 0], reports["key"].values[..., 0])
    assert not torch.allclose(reports["query"].values[..., 1], reports["value"].values[..., 1])
    rep = reports["key"]
    path = tmp_path / "srr.json"
    rep.to_json(str(path), include_samples=True)
    data = json.loads(path.read_text())
    assert data["settings"]["source"] == "key" and data["num_samples"] == 3 and data["layers"] == [1, 2]
    back = SRRReport.from_dict(data)
    torch.testing.assert_close(back.values, rep.values)
    torch.testing.assert_close(back.embedding_values, rep.embedding_values)
    assert back.mean == rep.mean and back.summary() == rep.summary() and back.embeddings == rep.embeddings
    assert rep.summary()["srr_last_layer"] == pytest.approx(rep.mean["output"]["srr"][-1])


# ---------------------------------------------------------------------------
# measurement="official": an independent re-derivation of the official hooks' math
# ---------------------------------------------------------------------------


def _official_checkpoint(dim=24, depth=3, heads=3, dim_head=8, patch=2, image=8, channels=1, classes=5, seed=0):
    """A state dict in the official CRATE layout (model/crate.py), random but LayerNorm-like weights."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.3):
        return scale * torch.randn(*shape, generator=g)

    patch_dim, n = patch * patch * channels, (image // patch) ** 2
    sd = {
        "to_patch_embedding.1.weight": 1 + r(patch_dim),
        "to_patch_embedding.1.bias": r(patch_dim),
        "to_patch_embedding.2.weight": r(dim, patch_dim),
        "to_patch_embedding.2.bias": r(dim),
        "to_patch_embedding.3.weight": 1 + r(dim),
        "to_patch_embedding.3.bias": r(dim),
        "pos_embedding": r(1, n + 1, dim, scale=1.0),
        "cls_token": r(1, 1, dim, scale=1.0),
        "mlp_head.0.weight": 1 + r(dim),
        "mlp_head.0.bias": r(dim),
        "mlp_head.1.weight": r(classes, dim),
        "mlp_head.1.bias": r(classes),
    }
    for i in range(depth):
        p = f"transformer.layers.{i}"
        sd[f"{p}.0.norm.weight"], sd[f"{p}.0.norm.bias"] = 1 + r(dim), r(dim)
        sd[f"{p}.0.fn.qkv.weight"] = r(heads * dim_head, dim)
        sd[f"{p}.0.fn.to_out.0.weight"], sd[f"{p}.0.fn.to_out.0.bias"] = r(dim, heads * dim_head), r(dim)
        sd[f"{p}.1.norm.weight"], sd[f"{p}.1.norm.bias"] = 1 + r(dim), r(dim)
        sd[f"{p}.1.fn.weight"] = r(dim, dim)
    return sd


def test_official_measurement_matches_the_official_hooks_math_on_a_converted_checkpoint():
    """Official hooks: Rc from each qkv output b n (h d) -> b h n d with every token at unit norm, scalar
    p / (N·0.01), logdet(I_N + scalar·X Xᵀ) summed over heads / 2; sparsity of each ISTA output (the official
    plot counts zeros, ours the non-zeros: 1 − theirs). Written here from that description in float64."""
    import torch.nn.functional as F

    from hf_tdiag import convert_official_crate

    sd = _official_checkpoint()
    cfg = CrateConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=24,
        num_hidden_layers=3,
        num_attention_heads=3,
        head_dim=8,
        num_labels=5,
    )
    model = convert_official_crate(sd, cfg).eval()
    x = torch.randn(4, 1, 8, 8)
    report = layer_srr(model, x, measurement="official", lam=0.7, progress=False)
    assert report.states == ("official",) and report.embeddings is None and report.layers == [1, 2, 3]
    with torch.no_grad():
        hidden = model(x, output_hidden_states=True).hidden_states
    for i in range(3):
        p = f"transformer.layers.{i}"
        y = F.layer_norm(hidden[i].double(), (24,), sd[f"{p}.0.norm.weight"].double(), sd[f"{p}.0.norm.bias"].double())
        w = (y @ sd[f"{p}.0.fn.qkv.weight"].double().T).reshape(4, 17, 3, 8).permute(0, 2, 1, 3)  # b h n d
        X = w / w.norm(dim=-1, keepdim=True)
        N, dh = X.shape[-2], X.shape[-1]
        logdet = torch.linalg.slogdet(torch.eye(N, dtype=torch.float64) + dh / (N * 0.01) * X @ X.transpose(-1, -2))[1]
        rc = logdet.sum(-1) / 2.0  # (b,)
        zero_fraction = (hidden[i + 1] == 0).double().mean(dim=(1, 2))
        torch.testing.assert_close(report.values[:, 0, i, 1], rc, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(report.values[:, 0, i, 2], 1.0 - zero_fraction, rtol=0, atol=1e-12)
        expected_R = torch.stack([_by_hand(hidden[i + 1][b], torch.zeros(1, 24, 1), 0.1, 0.0)[0] for b in range(4)])
        torch.testing.assert_close(report.values[:, 0, i, 0], expected_R, rtol=1e-7, atol=1e-7)
        torch.testing.assert_close(
            report.values[:, 0, i, 3], rc - expected_R + 0.7 * (1.0 - zero_fraction), rtol=1e-6, atol=1e-6
        )
    # the default measurement differs (different states, no unit norm)
    design = layer_srr(model, x, progress=False)
    assert not np.allclose(design.per_layer("Rc"), report.per_layer("Rc"))
    with pytest.raises(ValueError, match="apply_layernorm"):
        layer_srr(model, x, measurement="official", apply_layernorm=True)
    with pytest.raises(ValueError, match="measurement"):
        layer_srr(model, x, measurement="paper")


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
    with pytest.raises(ValueError, match="model: 'crate' is neither a local model folder nor a model id"):
        layer_srr("crate", x)  # a string is a model path: a folder that is not there is named
    with pytest.raises(ValueError, match="pixel_values: contains NaN"):
        layer_srr(model, torch.full((2, 1, 8, 8), float("nan")), progress=False)
    broken = copy.deepcopy(model)
    with torch.no_grad():
        next(p for n, p in broken.named_parameters() if n.endswith("patch_embeddings.projection.weight")).fill_(
            float("nan")
        )
    # named by its parameter (issue 29; the states used to report it as "Z: contains NaN or inf")
    with pytest.raises(
        ValueError, match=r"weight 'crate\.embeddings\.patch_embeddings\.projection\.weight' .* 256 NaN"
    ):
        layer_srr(broken, x, progress=False)


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
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(29500 + os.getpid() % 1000),
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(out)],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
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
