"""Public helpers that no other test reached, each against a hand-worked example or an independent computation:
the optimizer and tracker builders, parse_srr_layer, is_complete_checkpoint, the subspace helpers, the official-key
map and its state-dict unwrapping."""

import json
import math

import pytest
import torch

from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
from hf_tdiag.training.args import parse_srr_layer
from hf_tdiag.training.checkpointing import REQUIRED_STATE_KEYS, STATE_FILE, is_complete_checkpoint
from hf_tdiag.training.optim import Lion, build_optimizer
from hf_tdiag.training.tracking import JSONLinesTracker, resolve_trackers


def _tiny_crate(variant="crate", layers=2):
    config = CrateConfig.from_preset(
        "crate-digits", variant=variant, hidden_size=8, num_hidden_layers=layers, num_attention_heads=2, num_labels=3
    )
    return CrateForImageClassification(config)


# ---------------------------------------------------------------------------------------------- parse_srr_layer
@pytest.mark.parametrize(
    "spec, expected",
    [("last", "last"), ("random", "random"), ("all", "all"), ("3", 3), ("-1", -1), (2, 2), (-2, -2), ("0", 0)],
)
def test_parse_srr_layer_keeps_names_and_reads_block_numbers(spec, expected):
    got = parse_srr_layer(spec)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("spec", ["first", "", "2.5", 2.0, True, None, [1]])
def test_parse_srr_layer_refuses_anything_else_naming_the_flag(spec):
    with pytest.raises(ValueError, match=r"srr_layer: expected a block number, 'last', 'random' or 'all', got"):
        parse_srr_layer(spec)


# ---------------------------------------------------------------------------------------------- checkpoints
def test_is_complete_checkpoint_needs_the_name_the_folder_and_a_readable_state(tmp_path):
    state = {"completed_steps": 12, "epoch": 1, "batches_in_epoch": 4}
    good = tmp_path / "checkpoint-12"
    good.mkdir()
    (good / STATE_FILE).write_text(json.dumps(state))
    assert is_complete_checkpoint(str(good))
    assert is_complete_checkpoint(str(good) + "/")  # a trailing slash names the same folder

    for name in ("checkpoint-", "checkpoint-x", "ckpt-12", ".tmp-checkpoint-12", "checkpoint-12-old"):
        other = tmp_path / name
        other.mkdir()
        (other / STATE_FILE).write_text(json.dumps(state))
        assert not is_complete_checkpoint(str(other)), name

    missing_state = tmp_path / "sub" / "checkpoint-3"
    missing_state.mkdir(parents=True)
    assert not is_complete_checkpoint(str(missing_state))
    (missing_state / STATE_FILE).write_text('{"completed_steps": ')  # torn write
    assert not is_complete_checkpoint(str(missing_state))
    (missing_state / STATE_FILE).write_text("[]")  # a JSON document that is not the state object
    assert not is_complete_checkpoint(str(missing_state))
    for key in REQUIRED_STATE_KEYS:  # each counter is required, as a non-negative integer
        for value in (None, -1, True, 1.5):
            broken = {**state, key: value} if value is not None else {k: v for k, v in state.items() if k != key}
            (missing_state / STATE_FILE).write_text(json.dumps(broken))
            assert not is_complete_checkpoint(str(missing_state)), (key, value)
    (missing_state / STATE_FILE).write_text(json.dumps({**state, "completed_steps": 0, "extra": "kept"}))
    assert is_complete_checkpoint(str(missing_state))

    a_file = tmp_path / "f" / "checkpoint-4"
    a_file.parent.mkdir()
    a_file.write_text("{}")
    assert not is_complete_checkpoint(str(a_file))
    assert not is_complete_checkpoint(str(tmp_path / "checkpoint-99"))


# ---------------------------------------------------------------------------------------------- optimizers
class _TwoParams(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([[1.0, -2.0], [0.5, 3.0]]))
        self.bias = torch.nn.Parameter(torch.tensor([0.25, -0.75]))
        self.frozen = torch.nn.Parameter(torch.ones(2, 2), requires_grad=False)


def _grads(module, gw, gb):
    module.weight.grad = gw.clone()
    module.bias.grad = gb.clone()


def test_build_optimizer_adamw_first_steps_by_hand():
    m = _TwoParams()
    opt = build_optimizer(m, "adamw", lr=0.1, weight_decay=0.5, betas=(0.8, 0.9))
    assert isinstance(opt, torch.optim.AdamW)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0]
    assert opt.param_groups[0]["betas"] == (0.8, 0.9) and opt.param_groups[0]["lr"] == 0.1
    assert [len(g["params"]) for g in opt.param_groups] == [1, 1]  # the frozen matrix is in no group
    w, b = m.weight.detach().clone(), m.bias.detach().clone()
    gw, gb = torch.tensor([[0.3, -0.1], [2.0, 0.0]]), torch.tensor([-0.5, 0.2])
    # AdamW by hand: decoupled decay θ(1 − ηλ), then θ − η m̂/(√v̂ + ε) with bias-corrected moments
    mw, vw, mb, vb = torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2), torch.zeros(2)
    for step in (1, 2):
        _grads(m, gw * step, gb * step)
        opt.step()
        mw, vw = 0.8 * mw + 0.2 * gw * step, 0.9 * vw + 0.1 * (gw * step) ** 2
        mb, vb = 0.8 * mb + 0.2 * gb * step, 0.9 * vb + 0.1 * (gb * step) ** 2
        c1, c2 = 1 - 0.8**step, 1 - 0.9**step
        w = w * (1 - 0.1 * 0.5) - 0.1 * (mw / c1) / ((vw / c2).sqrt() + 1e-8)
        b = b - 0.1 * (mb / c1) / ((vb / c2).sqrt() + 1e-8)
        torch.testing.assert_close(m.weight.detach(), w)
        torch.testing.assert_close(m.bias.detach(), b)
    assert torch.equal(m.frozen, torch.ones(2, 2))


def test_build_optimizer_lion_decays_only_the_matrix_group():
    m = _TwoParams()
    opt = build_optimizer(m, "lion", lr=0.01, weight_decay=0.2, betas=(0.9, 0.99))
    assert isinstance(opt, Lion)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.2, 0.0] and opt.param_groups[1]["betas"] == (0.9, 0.99)
    w, b = m.weight.detach().clone(), m.bias.detach().clone()
    gw, gb = torch.tensor([[0.3, -0.1], [2.0, -4.0]]), torch.tensor([-0.5, 0.2])
    _grads(m, gw, gb)
    opt.step()
    # first Lion step: m = 0, so u = sign((1 − β₁) g) = sign(g)
    torch.testing.assert_close(m.weight.detach(), w * (1 - 0.01 * 0.2) - 0.01 * torch.sign(gw))
    torch.testing.assert_close(m.bias.detach(), b - 0.01 * torch.sign(gb))


def test_build_optimizer_names_the_argument_for_an_unknown_name():
    with pytest.raises(ValueError, match=r"optimizer: expected 'adamw' or 'lion', got 'sgd'"):
        build_optimizer(_TwoParams(), "sgd", lr=0.1, weight_decay=0.0)


# ---------------------------------------------------------------------------------------------- trackers
def test_jsonl_tracker_writes_the_config_and_one_line_per_log(tmp_path):
    (tracker,) = resolve_trackers("jsonl", str(tmp_path), run_name="run-a")
    assert isinstance(tracker, JSONLinesTracker) and tracker.name == "jsonl"
    tracker.start()
    tracker.store_init_configuration({"lr": 0.1, "path": tmp_path})
    tracker.log({"loss": 1.5, "acc": torch.tensor(0.25)}, step=3)
    tracker.log({"loss": 0.5}, step=4)
    tracker.finish()
    tracker.log({"loss": 0.25}, step=5)  # logging after finish reopens the file and appends
    tracker.finish()
    folder = tmp_path / "run-a"
    assert json.loads((folder / "config.json").read_text()) == {"lr": 0.1, "path": str(tmp_path)}
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in lines] == [(3, 1.5), (4, 0.5), (5, 0.25)]
    assert lines[0]["acc"] == 0.25 and all(isinstance(r["time"], float) for r in lines)


def test_resolve_trackers_names_none_duplicates_all_and_errors(tmp_path):
    from accelerate.tracking import get_available_trackers

    available = sorted(str(t) for t in get_available_trackers())
    assert resolve_trackers("none", str(tmp_path)) == []
    assert resolve_trackers("None, none", str(tmp_path)) == []
    twice = resolve_trackers(" jsonl ,jsonl", str(tmp_path))
    assert len(twice) == 1 and twice[0].directory == str(tmp_path / "crate")
    everything = resolve_trackers("all", str(tmp_path))
    assert isinstance(everything[0], JSONLinesTracker) and sorted(everything[1:]) == available
    for bad in ("", " , "):
        with pytest.raises(ValueError, match="report_to: expected tracker names or 'all'"):
            resolve_trackers(bad, str(tmp_path))
    with pytest.raises(
        ValueError, match=r"report_to: tracker 'no-such-tracker' is not installed; available: \['jsonl'"
    ):
        resolve_trackers("jsonl,no-such-tracker", str(tmp_path))


# ---------------------------------------------------------------------------------------------- subspaces
def test_weight_to_subspaces_by_hand():
    from hf_tdiag.probes.subspaces import weight_to_subspaces

    K, p, d = 3, 2, 4
    W = torch.arange(K * p * d, dtype=torch.float32).reshape(K * p, d)
    U = weight_to_subspaces(W, head_dim=p)
    assert U.shape == (K, d, p)
    for k in range(K):
        for j in range(p):
            for i in range(d):
                assert U[k, i, j] == W[k * p + j, i]  # column j of U_k is row k·p + j of the weight
    # head k's projection of a token z is U_kᵀ z = the weight's rows k·p..k·p+p−1 applied to z
    z = torch.randn(d)
    torch.testing.assert_close(torch.cat([U[k].T @ z for k in range(K)]), W @ z)
    assert U.data_ptr() == W.data_ptr()  # a view: gradients reach the weight
    for bad in (torch.zeros(5, 4), torch.zeros(6)):
        with pytest.raises(ValueError, match=r"weight: expected shape \(K\*2, d\)"):
            weight_to_subspaces(bad, head_dim=2)


def test_layer_projection_is_the_blocks_own_linear():
    from transformers import ViTConfig, ViTModel

    from hf_tdiag.probes.describe import describe
    from hf_tdiag.probes.subspaces import layer_projection

    crate = _tiny_crate(layers=3)
    arch = describe(crate)
    for i in range(3):
        qkv = crate.crate.encoder.layer[i].attention.qkv
        assert all(layer_projection(arch, i, s) is qkv for s in ("query", "key", "value"))
    vit = ViTModel(
        ViTConfig(
            hidden_size=8,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=16,
            image_size=8,
            patch_size=4,
            num_channels=1,
        )
    )
    arch = describe(vit)
    for i in range(2):
        attention = vit.layers[i].attention
        assert layer_projection(arch, i) is attention.q_proj
        assert layer_projection(arch, i, "key") is attention.k_proj
        assert layer_projection(arch, i, "value") is attention.v_proj
    with pytest.raises(ValueError, match=r"source: expected one of \('query', 'key', 'value'\), got 'output'"):
        layer_projection(arch, 0, "output")


# ---------------------------------------------------------------------------------------------- official keys
@pytest.mark.parametrize("variant, per_layer_out", [("crate", 2), ("crate-fix", 1), ("crate-c", 0), ("crate-n", 0)])
def test_official_key_map_by_hand(variant, per_layer_out):
    from hf_tdiag.models.crate.convert_official import official_key_map

    model = _tiny_crate(variant, layers=3)
    m = official_key_map(model.config)
    # 12 embedding/head keys, then per block: LN1 (2) + qkv (1) + to_out + LN2 (2) + ISTA dictionary (1)
    assert len(m) == 12 + 3 * (6 + per_layer_out)
    assert len(set(m.values())) == len(m)
    assert m["transformer.layers.2.0.fn.qkv.weight"] == "crate.encoder.layer.2.attention.qkv.weight"
    assert m["transformer.layers.0.1.fn.weight"] == "crate.encoder.layer.0.ista.weight"
    assert m["transformer.layers.1.1.norm.bias"] == "crate.encoder.layer.1.layernorm_after.bias"
    assert (
        m["mlp_head.1.weight"] == "classifier.weight" and m["pos_embedding"] == "crate.embeddings.position_embeddings"
    )
    assert "transformer.layers.3.0.fn.qkv.weight" not in m
    ours = set(model.state_dict())
    assert set(m.values()) <= ours  # every target is one of our tensors
    # ... and every one of our tensors except derived buffers has an official name
    assert {k for k in ours - set(m.values()) if not k.endswith(("num_batches_tracked",))} <= {
        k for k in ours if "fixed_output" in k and variant != "crate-fix"
    }
    out_keys = sorted(k for k in m if ".to_out." in k)
    if variant == "crate":
        assert m["transformer.layers.1.0.fn.to_out.0.bias"] == "crate.encoder.layer.1.attention.out_proj.bias"
    elif variant == "crate-fix":
        assert [m[k] for k in out_keys] == [f"crate.encoder.layer.{i}.attention.fixed_output" for i in range(3)]
    else:
        assert out_keys == []


def test_unwrap_official_state_dict_strips_wrappers_and_prefixes():
    from hf_tdiag.models.crate.convert_official import unwrap_official_state_dict

    a, b = torch.zeros(1), torch.ones(2)
    for wrapper in ("state_dict", "model", "model_state_dict"):
        out = unwrap_official_state_dict({wrapper: {"module.module.x": a, "y": b}, "epoch": 3})
        assert list(out) == ["x", "y"] and out["x"] is a and out["y"] is b
    plain = unwrap_official_state_dict({"model": a, "module.w": b})  # tensors at top level: no wrapper to strip
    assert list(plain) == ["model", "w"]
    with pytest.raises(TypeError, match=r"state_dict\['epoch'\] must be a torch.Tensor, got int"):
        unwrap_official_state_dict({"w": a, "epoch": 3})
    with pytest.raises(TypeError, match="state_dict must be a mapping of parameter names to tensors, got list"):
        unwrap_official_state_dict([a])
    assert math.isclose(float(unwrap_official_state_dict({"state_dict": {"module.v": b}})["v"].sum()), 2.0)
