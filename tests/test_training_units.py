"""Unit tests of the trainer's pieces: arguments, augmentation, data, checkpoint files, optimizer, SRR regulariser."""

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
from hf_tdiag.training import args as targs
from hf_tdiag.training import augment, checkpointing, data, gap, optim, regularizers


# ---------------------------------------------------------------------------------------------- arguments
def test_make_args_from_kwargs_argv_and_errors(tmp_path):
    a = targs.make_args(output_dir=str(tmp_path), srr_layer="2", checkpointing_steps=5)
    assert a.srr_layer == 2 and a.checkpointing_steps == "5" and a.per_device_train_batch_size == 64
    b = targs.make_args(["--output_dir", str(tmp_path), "--srr_layer", "last", "--optimizer", "lion"])
    assert b.srr_layer == "last" and b.optimizer == "lion"
    assert targs.is_digits(b) and not targs.is_digits(targs.make_args(output_dir="x", dataset_name="cifar10"))
    with pytest.raises(TypeError, match="unknown argument"):
        targs.make_args(output_dir="x", learning_rte=1e-3)
    with pytest.raises(ValueError, match="srr_layer"):
        targs.make_args(output_dir="x", srr_layer="first")
    with pytest.raises(ValueError, match="label_smoothing"):
        targs.make_args(output_dir="x", label_smoothing=1.5)
    with pytest.raises(ValueError, match="checkpointing_steps"):
        targs.make_args(output_dir="x", checkpointing_steps="often")
    with pytest.raises(ValueError, match="per_device_train_batch_size"):
        targs.make_args(output_dir="x", per_device_train_batch_size=0)
    with pytest.raises(ValueError, match="dataset"):
        targs.make_args(output_dir="x", dataset_name="cifar10", train_dir="imgs")
    with pytest.raises(TypeError, match="args_or_kwargs"):
        targs.make_args(42)


# ---------------------------------------------------------------------------------------------- augmentation
def _image(h=12, w=10):
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8))


def test_pad_crop_is_a_shift_of_the_zero_padded_image():
    img = _image()
    seed = 7
    out = np.asarray(augment.pad_crop(img, 3, np.random.default_rng(seed)))
    rng = np.random.default_rng(seed)
    left, top = int(rng.integers(0, 7)), int(rng.integers(0, 7))
    padded = np.pad(np.asarray(img), ((3, 3), (3, 3), (0, 0)))
    np.testing.assert_array_equal(out, padded[top : top + 12, left : left + 10])


def test_horizontal_flip_and_determinism():
    img = _image()
    np.testing.assert_array_equal(
        np.asarray(augment.horizontal_flip(img, 1.0, np.random.default_rng(0))), np.asarray(img)[:, ::-1]
    )
    np.testing.assert_array_equal(
        np.asarray(augment.horizontal_flip(img, 0.0, np.random.default_rng(0))), np.asarray(img)
    )
    f = augment.build_augmentation("random_resized_crop", 8, hflip=0.5)
    a = np.asarray(f(img, np.random.default_rng([1, 2, 3])))
    b = np.asarray(f(img, np.random.default_rng([1, 2, 3])))
    c = np.asarray(f(img, np.random.default_rng([1, 2, 4])))
    assert a.shape == (8, 8, 3) and np.array_equal(a, b) and not np.array_equal(a, c)
    with pytest.raises(TypeError, match="img"):
        augment.pad_crop(np.zeros((4, 4)), 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="kind"):
        augment.build_augmentation("mixup", 8)


def test_random_resized_crop_box_respects_scale_and_ratio():
    rng = np.random.default_rng(0)
    for _ in range(200):
        left, top, right, bottom = augment.random_resized_crop_box(40, 30, rng, scale=(0.2, 0.6), ratio=(0.5, 2.0))
        assert 0 <= left < right <= 40 and 0 <= top < bottom <= 30
        w, h = right - left, bottom - top
        # rounding of w and h moves area and ratio by at most one pixel per side
        assert 0.2 * 1200 * 0.8 <= w * h <= 0.6 * 1200 * 1.2
        assert 0.5 * 0.8 <= w / h <= 2.0 * 1.25


# ---------------------------------------------------------------------------------------------- data
def test_digits_split_is_fixed_and_stratified():
    x_tr, x_te, y_tr, y_te = data.digits_split()
    assert x_tr.shape == (1437, 8, 8) and x_te.shape == (360, 8, 8) and x_tr.dtype == np.uint8
    assert x_tr.max() == 255 and x_tr.min() == 0
    counts = np.bincount(y_te, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # 20% of ~180 per class
    x_tr2, _, y_tr2, _ = data.digits_split()
    np.testing.assert_array_equal(x_tr, x_tr2)
    np.testing.assert_array_equal(y_tr, y_tr2)


def test_digits_pixel_values_are_the_processor_normalisation(tmp_path):
    from hf_tdiag.models.crate import CrateImageProcessor

    a = targs.make_args(output_dir=str(tmp_path))
    raw = data.load_raw_data(a)
    processor = CrateImageProcessor.for_config(CrateConfig.from_preset("crate-digits"))
    sets = data.build_datasets(a, raw, processor, 1, (8, 8))
    assert len(sets.train) == 1437 and len(sets.eval) == 360 and sets.augmentation == "none"
    item = sets.eval[5]
    expected = (raw.eval["images"][5].astype(np.float32) / 255.0 - 0.5) / 0.5
    np.testing.assert_allclose(item["pixel_values"][0].numpy(), expected, atol=1e-6)
    assert int(item["labels"]) == int(raw.eval["labels"][5])


# ---------------------------------------------------------------------------------------------- checkpoint files
def _fake_ckpt(root, name, complete=True):
    path = root / name
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"x")
    if complete:
        (path / checkpointing.STATE_FILE).write_text(
            json.dumps({"completed_steps": 1, "epoch": 0, "batches_in_epoch": 1})
        )
    return path


def test_latest_ignores_partial_and_rotation_keeps_last_k(tmp_path):
    _fake_ckpt(tmp_path, "checkpoint-2")
    _fake_ckpt(tmp_path, "checkpoint-10")
    _fake_ckpt(tmp_path, "checkpoint-12", complete=False)  # killed before the state file
    _fake_ckpt(tmp_path, ".tmp-checkpoint-14")  # killed before the rename
    (tmp_path / "checkpoint-9").mkdir()
    (tmp_path / "checkpoint-9" / checkpointing.STATE_FILE).write_text("{trunc")  # torn write
    assert [s for s, _ in checkpointing.list_checkpoints(str(tmp_path))] == [2, 10]
    assert checkpointing.latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert checkpointing.resolve_checkpoint("latest", str(tmp_path)) == str(tmp_path / "checkpoint-10")
    with pytest.raises(ValueError, match="resume_from_checkpoint"):
        checkpointing.resolve_checkpoint(str(tmp_path / "checkpoint-12"), str(tmp_path))
    with pytest.raises(FileNotFoundError, match="resume_from_checkpoint"):
        checkpointing.resolve_checkpoint(str(tmp_path / "nope"), str(tmp_path))
    _fake_ckpt(tmp_path, "checkpoint-11")
    removed = checkpointing.rotate_checkpoints(str(tmp_path), keep=2)
    assert removed == [str(tmp_path / "checkpoint-2")]
    assert [s for s, _ in checkpointing.list_checkpoints(str(tmp_path))] == [10, 11]
    checkpointing.clean_partial(str(tmp_path))
    assert not (tmp_path / ".tmp-checkpoint-14").exists()
    assert checkpointing.latest_checkpoint(str(tmp_path / "missing")) is None


def test_save_checkpoint_roundtrip_with_accelerator(tmp_path):
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    for step in (1, 2, 3):
        checkpointing.save_checkpoint(
            acc, str(tmp_path), step, {"completed_steps": step, "epoch": 0, "batches_in_epoch": step, "w": 1}, keep=2
        )
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2", "checkpoint-3"]
    saved = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.zero_()
    state = checkpointing.load_checkpoint(acc, str(tmp_path / "checkpoint-3"))
    assert state["completed_steps"] == 3 and state["step"] == 3
    assert torch.equal(model.weight.detach(), saved)


# ---------------------------------------------------------------------------------------------- optimizer
def test_lion_step_matches_the_update_rule():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    g1, g2 = torch.randn(5), torch.randn(5)
    opt = optim.Lion([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    theta, m = p.detach().clone(), torch.zeros(5)
    for g in (g1, g2):
        p.grad = g.clone()
        opt.step()
        theta = theta * (1 - 0.1 * 0.5) - 0.1 * torch.sign(0.9 * m + 0.1 * g)
        m = 0.99 * m + 0.01 * g
        torch.testing.assert_close(p.detach(), theta)


def test_param_groups_exclude_norms_biases_and_tokens():
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10))
    decay, no_decay = optim.param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim == 2 for p in decay["params"])
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert "crate.embeddings.cls_token" in no_decay_names and "classifier.bias" in no_decay_names
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


# ---------------------------------------------------------------------------------------------- SRR regulariser
def _naive_srr(Z, U_list, eps, lam):
    """Per-sample SRR from explicit d×d / p×p matrices and slogdet (independent of the measure's code path)."""
    Z = Z.double()
    N, d = Z.shape
    R = 0.5 * torch.linalg.slogdet(torch.eye(d, dtype=torch.float64) + d / (N * eps**2) * Z.T @ Z)[1]
    Rc = 0.0
    for U in U_list:
        A = Z @ U.double()
        p = A.shape[1]
        Rc = Rc + 0.5 * torch.linalg.slogdet(torch.eye(p, dtype=torch.float64) + p / (N * eps**2) * A.T @ A)[1]
    return Rc - R + lam * (Z != 0).double().sum() / (d * N)


def _tiny_model():
    config = CrateConfig.from_preset(
        "crate-digits", hidden_size=16, num_hidden_layers=3, num_attention_heads=2, num_labels=10
    )
    return CrateForImageClassification(config)


def test_srr_penalty_last_is_the_last_block_output_and_reaches_its_ista_and_U():
    model = _tiny_model()
    x = torch.randn(4, 1, 8, 8)
    out = model(pixel_values=x, output_hidden_states=True)
    assert len(out.hidden_states) == 4  # Z^0 .. Z^3
    penalty, layers = regularizers.model_srr_penalty(model, out.hidden_states, "last", step=0, seed=0, eps=0.5, lam=1.0)
    assert layers == [3]  # block L = 3
    last = model.crate.encoder.layer[2]  # block 3 in code
    W = last.attention.qkv.weight.detach()  # rows k*p:(k+1)*p are U_k^T of block 3
    U_list = [W[k * 8 : (k + 1) * 8].T for k in range(2)]
    Z = out.hidden_states[3].detach()  # Z^L, the output of the last block (its ISTA output)
    naive = torch.stack([_naive_srr(Z[b], U_list, 0.5, 1.0) for b in range(4)]).mean()
    torch.testing.assert_close(penalty.detach(), naive, rtol=1e-9, atol=1e-9)
    (penalty * 1.0).backward()
    # the gradient reaches the last block's ISTA dictionary (through Z^L) and its U
    ista_grads = [p.grad for p in last.ista.parameters() if p.requires_grad]
    assert ista_grads and all(g is not None and float(g.abs().sum()) > 0 for g in ista_grads)
    grad = last.attention.qkv.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0
    # the head is not part of the penalty
    assert model.classifier.weight.grad is None
    # the gradient w.r.t. U of block 3 contains the naive formula's gradient through Rc with Z held fixed:
    # recompute with Z detached to isolate it
    model.zero_grad()
    out2 = model(pixel_values=x, output_hidden_states=True)
    states = [h.detach() for h in out2.hidden_states]
    penalty2, _ = regularizers.model_srr_penalty(model, states, "last", step=0, seed=0, eps=0.5, lam=1.0)
    penalty2.backward()
    W_var = W.clone().requires_grad_(True)
    naive_u = torch.stack(
        [_naive_srr(Z[b], [W_var[k * 8 : (k + 1) * 8].T for k in range(2)], 0.5, 1.0) for b in range(4)]
    ).mean()
    (gu,) = torch.autograd.grad(naive_u, W_var)
    torch.testing.assert_close(last.attention.qkv.weight.grad.double(), gu.double(), rtol=1e-4, atol=1e-6)


def test_srr_regularisation_changes_the_loss_and_its_gradient():
    model = _tiny_model()
    x, y = torch.randn(6, 1, 8, 8), torch.randint(0, 10, (6,))

    def grads(beta):
        model.zero_grad()
        out = model(pixel_values=x, output_hidden_states=True)
        ce = torch.nn.functional.cross_entropy(out.logits, y)
        pen, _ = regularizers.model_srr_penalty(model, out.hidden_states, "all", 0, 0)
        loss = ce + beta * pen.float()
        loss.backward()
        return (
            float(loss.detach()),
            float(ce.detach()),
            float(pen.detach()),
            model.crate.encoder.layer[0].attention.qkv.weight.grad.clone(),
        )

    l0, ce0, pen, g0 = grads(0.0)
    l1, ce1, _, g1 = grads(0.3)
    assert l0 == pytest.approx(ce0) and l1 == pytest.approx(ce1 + 0.3 * pen, rel=1e-5)
    assert not torch.allclose(g0, g1)


def test_srr_layer_choice():
    # blocks are numbered 1..L: "layer l" is the output of block l
    seen = {regularizers.srr_layers_for_step("random", 4, step, seed=1)[0] for step in range(60)}
    assert seen == {1, 2, 3, 4}
    assert regularizers.srr_layers_for_step("random", 4, 17, 1) == regularizers.srr_layers_for_step("random", 4, 17, 1)
    assert regularizers.srr_layers_for_step("last", 4, 0, 0) == [4]
    assert regularizers.srr_layers_for_step(-1, 4, 0, 0) == [4]
    assert regularizers.srr_layers_for_step(1, 4, 0, 0) == [1]
    assert regularizers.srr_layers_for_step("all", 3, 0, 0) == [1, 2, 3]
    for bad in (0, 5, -5):
        with pytest.raises(ValueError, match="srr_layer"):
            regularizers.srr_layers_for_step(bad, 4, 0, 0)
    assert targs.make_args(output_dir="x").srr_layer == "last"  # the paper's main setting is the default


def test_generalization_gap_definition():
    assert gap.generalization_gap(0.75, 0.25) == 0.5
    with pytest.raises(ValueError, match="val_loss"):
        gap.generalization_gap(float("nan"), 0.1)


def test_evaluate_counts_and_means_against_direct_computation():
    model = _tiny_model().eval()
    x, y = torch.randn(10, 1, 8, 8), torch.randint(0, 10, (10,))
    dl = torch.utils.data.DataLoader(data.TensorImageDataset(x, y), batch_size=4)
    metrics = gap.evaluate_classifier(model, dl, disable_tqdm=True)
    with torch.no_grad():
        logits = model(pixel_values=x).logits
    assert metrics["samples"] == 10
    assert metrics["loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)), rel=1e-5)
    assert metrics["accuracy"] == pytest.approx(float((logits.argmax(-1) == y).float().mean()))


def test_one_card_template_the_packaged_one():
    from hf_tdiag.training.model_card import TEMPLATE_NAME, template_path

    here = os.path.dirname(os.path.abspath(__file__))
    top_level = os.path.join(os.path.dirname(here), "model_cards", TEMPLATE_NAME)  # beside hf_tdiag/, recipes/
    assert os.path.samefile(template_path(), top_level)
    assert not os.path.exists(os.path.join(os.path.dirname(here), "hf_tdiag", "model_cards"))  # no second copy


def test_model_card_has_no_local_paths_and_names_the_hub_base_model(tmp_path):
    from types import SimpleNamespace

    from hf_tdiag.training.model_card import build_model_card

    model = _tiny_model()
    folder = tmp_path / "my data"
    folder.mkdir()
    raw = SimpleNamespace(dataset_id=str(folder), name=str(folder), eval_split="validation", is_digits=False)
    results = dict(eval_accuracy=0.5, eval_loss=1.0, train_loss=0.5, train_accuracy=0.75, generalization_gap=0.5)
    for base, expected in (("someone/crate-base", "someone/crate-base"), (str(tmp_path / "base-run"), None)):
        args = targs.make_args(output_dir=str(tmp_path / "out"), train_dir=str(folder), model_name_or_path=base)
        card = build_model_card(model.config, results, args, raw)
        text = str(card)
        assert str(tmp_path) not in text, [line for line in text.splitlines() if str(tmp_path) in line]
        assert card.data.base_model == expected
        assert card.data.eval_results[0].dataset_type == "imagefolder" and card.data.model_name.endswith("on my data")
        assert card.data.eval_results[0].dataset_name == "my data" and card.data.datasets is None  # not on the Hub
        assert ("Fine-tuned from:** [`someone/crate-base`]" in text) == (expected is not None)
        assert ("local checkpoint `base-run`" in text) == (expected is None)
        assert "`--srr_layer last` would choose the block output" in text  # the regulariser's choice, recorded


def test_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes", "accelerate_configs")
    kinds = {}
    for name in ("single_gpu", "multi_gpu_ddp", "fsdp"):
        config = load_config_from_file(os.path.join(folder, f"{name}.yaml"))
        kinds[name] = (str(config.distributed_type), config.mixed_precision)
    assert kinds["single_gpu"] == ("DistributedType.NO", "bf16")
    assert kinds["multi_gpu_ddp"][0] == "DistributedType.MULTI_GPU"
    assert kinds["fsdp"][0] == "DistributedType.FSDP"


def test_store_true_flags_take_no_value():
    parser = targs.build_parser()
    base = ["--output-dir", "out"]
    for flag, dest in (("--push-to-hub", "push_to_hub"), ("--hub-private-repo", "hub_private_repo")):
        assert getattr(parser.parse_args(base), dest) is False
        ns = parser.parse_args(base + [flag, "--hub-model-id", "me/crate"])  # a value-taking flag would eat the next
        assert getattr(ns, dest) is True and ns.hub_model_id == "me/crate"
