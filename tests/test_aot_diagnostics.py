"""AoT in the diagnostics: its description (roles of the MSSA and MHSA blocks, the output matrix), the objective
ledger (one ``mssa`` step per block whose ``Rᶜ`` before and after equals a hand-written float64 log-determinant and
``measures.coding_rate.compression_rate`` on the model's recorded states), SRR and the attention-SVM diagnostic on a
tiny AoT, and the trainer building an AoT from its preset."""

from __future__ import annotations

import math

import pytest
import torch

import hf_tdiag
from hf_tdiag.measures.coding_rate import compression_rate
from hf_tdiag.models.aot import AotConfig, AotForCausalLM, AotForImageClassification, AotTextConfig
from hf_tdiag.probes.describe import describe


def _aot(seed=0, **fields):
    config = AotConfig.from_preset("aot-digits", num_hidden_layers=3, hidden_size=16, num_attention_heads=2,
                                   num_labels=10, **fields)  # fmt: skip
    torch.manual_seed(seed)
    return AotForImageClassification(config).eval()


def _pixels(n=6, seed=1):
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def test_describe_gives_the_roles_of_mssa_and_mhsa_blocks():
    model = _aot()
    d = describe(model)
    assert (d.family, d.attention, d.projection_layout, d.num_layers, d.num_heads, d.head_dim) == (
        "aot", "mssa", "shared", 3, 2, 8)  # fmt: skip
    block = model.aot.layer[1]
    h = d.layers[1]
    assert h.query is h.key is h.value is block.attention.qkv and h.attention_norm is block.layernorm_before
    assert h.ffn_in is None and h.ista is None and h.ffn_norm is None  # attention only
    assert torch.equal(h.output_weight(), block.attention.out_proj.weight)
    subspace = _aot(mssa_output="subspace")
    assert torch.equal(describe(subspace).layers[0].output_weight(), subspace.aot.layer[0].attention.qkv.weight.T)
    mhsa = describe(_aot(attention="mhsa"))
    assert (mhsa.family, mhsa.attention, mhsa.projection_layout) == ("aot-mhsa", "softmax", "separate")
    assert mhsa.layers[0].key is mhsa.layers[0].block.attention.k_proj
    config = AotTextConfig(vocab_size=20, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
    lm = AotForCausalLM(config)
    text = describe(lm)
    assert text.attention == "causal" and text.causal and text.final_norm is lm.aot.final_layernorm


def _rc_by_hand(Z: torch.Tensor, qkv: torch.Tensor, heads: int, eps: float) -> float:
    """Mean over samples of ``Σ_k ½ logdet(I + p/(N ε²) A_kᵀ A_k)``, ``A_k = Z U_k`` with ``U_kᵀ`` the rows of qkv."""
    Z, W = Z.double(), qkv.detach().double()
    n, p = Z.shape[1], W.shape[0] // heads
    total = 0.0
    for sample in Z:
        for k in range(heads):
            A = sample @ W[k * p : (k + 1) * p].T  # (N, p)
            total += 0.5 * float(torch.logdet(torch.eye(p, dtype=torch.float64) + p / (n * eps**2) * A.T @ A))
    return total / Z.shape[0]


def test_the_ledger_measures_rc_before_and_after_each_block_as_computed_independently():
    model = _aot()
    pixels = _pixels()
    ledger = hf_tdiag.objective_ledger(model, pixels, eps=0.5, batch_size=4)  # two batches: 4 + 2 samples
    assert (ledger.family, ledger.num_layers, ledger.num_samples) == ("aot", 3, 6)
    assert [(s.layer, s.step, s.objective) for s in ledger.steps] == [(i, "mssa", "Rc") for i in (1, 2, 3)]
    with torch.no_grad():
        states = model(pixels, output_hidden_states=True).hidden_states
    for step in ledger.steps:
        attention = model.aot.layer[step.layer - 1].attention
        before, after = states[step.layer - 1], states[step.layer]
        assert step.before == pytest.approx(_rc_by_hand(before, attention.qkv.weight, 2, 0.5), rel=1e-5)
        assert step.after == pytest.approx(_rc_by_hand(after, attention.qkv.weight, 2, 0.5), rel=1e-5)
        U = attention.subspace_bases().detach()
        assert step.after == pytest.approx(float(compression_rate(after, U, 0.5).mean()), rel=1e-5)
        assert step.before != pytest.approx(step.after, rel=1e-6)  # the block moved the tokens
    assert math.isfinite(ledger.summary()["mean_relative_change"])


def test_the_ledger_refuses_an_aot_without_subspaces_in_one_line():
    with pytest.raises(ValueError, match=r"an AoT with MHSA blocks \(attention='mhsa'\) has no subspaces U") as info:
        hf_tdiag.objective_ledger(_aot(attention="mhsa"), _pixels(2))
    assert "\n" not in str(info.value)


def test_srr_and_attention_svm_run_on_a_tiny_aot_with_finite_numbers():
    model = _aot()
    srr = hf_tdiag.layer_srr(model, _pixels(), progress=False)
    frame = srr.to_pandas()
    assert srr.layers == [1, 2, 3] and len(frame) > 0
    assert all(math.isfinite(v) for v in frame[["R", "Rc", "srr"]].to_numpy().ravel())
    svm = hf_tdiag.attention_svm_diagnostic(model, _pixels(2), layer=2, head=1).summary()
    assert svm["family"] == "aot" and svm["feasible"] and svm["tokens_per_sequence"] == 17
    assert math.isfinite(svm["correlation"]) and 0 < svm["svm_margin"] < math.inf


def test_the_trainer_builds_an_aot_from_its_preset_and_refuses_a_text_checkpoint():
    from hf_tdiag.training.args import make_args
    from hf_tdiag.training.data import load_raw_data
    from hf_tdiag.training.families import check_trainable, family_of_preset
    from hf_tdiag.training.model import build_model_and_processor

    assert family_of_preset("aot-digits") == "aot" and family_of_preset("crate-digits") is None
    args = make_args(output_dir="unused", preset="aot-digits", num_hidden_layers=2)
    model, processor, preset = build_model_and_processor(args, load_raw_data(args))
    assert type(model) is AotForImageClassification and preset == "aot-digits"
    assert (model.config.num_hidden_layers, model.config.num_labels, model.config.hidden_size) == (2, 10, 64)
    assert (processor.size.height, processor.size.width) == (8, 8) and list(processor.image_mean) == [0.5]
    check_trainable(model.config)
    with pytest.raises(ValueError, match=r"model_name_or_path: expected a CRATE, CRATE-α, ToST or AoT checkpoint"):
        check_trainable(AotTextConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2))
