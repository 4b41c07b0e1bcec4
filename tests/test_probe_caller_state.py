"""Every probe leaves the caller's model as found (issue 29): each submodule's own train/eval flag, not only the top
module's. The models here have mixed modes (a training top module with an eval-mode embedding and first block, and a
dropout left training inside an eval-mode block), the state ``model.train(was_training)`` used to flatten. The
probes that switch to eval mode for their measurement must still measure in eval mode: with dropout 0.5 two calls
give the same numbers."""

from __future__ import annotations

import pytest
import torch
from decoder_models import build
from transformers import ViTConfig, ViTForImageClassification

from hf_tdiag.diagnostics.concept_fidelity.constants import certified_constants, estimate_constants
from hf_tdiag.probes.attention_heads import head_weights
from hf_tdiag.probes.block_matrices import encoder_weights
from hf_tdiag.probes.concept_decoder import capture_block_kwargs
from hf_tdiag.probes.concept_model import concept_model_parts, layer_activations, suffix_runner
from hf_tdiag.probes.describe import describe
from hf_tdiag.probes.layer_features import layer_features
from hf_tdiag.probes.subspaces import subspaces
from hf_tdiag.probes.token_states import token_states
from hf_tdiag.probes.weights import path_norm, trainable_parameters, weight_matrices

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _vit():
    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=8,
        patch_size=4,
        num_channels=1,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        num_labels=3,
        hidden_dropout_prob=0.5,
        attention_probs_dropout_prob=0.5,
    )
    return ViTForImageClassification(cfg)


def _mixed(model, blocks):
    """Top module training, the embeddings and the first block in eval mode, and inside the (eval) second block
    one dropout left training: three different flags below one top module."""
    model.train()
    embeddings = next(m for n, m in model.named_modules() if n.endswith(("embeddings", "wte")))
    embeddings.eval()
    blocks[0].eval()
    blocks[1].eval()
    next(m for m in blocks[1].modules() if isinstance(m, torch.nn.Dropout)).train()
    return model


def _flags(model):
    return {name: m.training for name, m in model.named_modules()}


@pytest.fixture
def vit():
    model = _vit()
    return _mixed(model, describe(model).blocks)


def _check(model, before):
    after = _flags(model)
    changed = sorted(n for n in before if after[n] != before[n])
    assert not changed, f"modes changed: {changed[:5]}"


def test_the_mixed_state_is_really_mixed(vit):
    flags = set(_flags(vit).values())
    assert flags == {True, False}  # a state model.train(flag) cannot restore
    assert vit.training and not describe(vit).blocks[1].training


PIXELS = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def test_layer_features_measures_in_eval_mode_and_restores_every_flag(vit):
    before = _flags(vit)
    first = layer_features(vit, [PIXELS[:2], PIXELS[2:]])
    _check(vit, before)
    second = layer_features(vit, [PIXELS])
    _check(vit, before)
    for a, b in zip(first, second):  # dropout 0.5 would make these differ if it ran in training mode
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_concept_probes_restore_every_flag(vit):
    before = _flags(vit)
    cm = concept_model_parts(vit)
    acts = layer_activations(vit, PIXELS, 1, cm=cm)
    _check(vit, before)
    again = layer_activations(vit, PIXELS, 1, cm=cm)
    torch.testing.assert_close(acts.frame, again.frame, rtol=0, atol=0)  # eval mode for the measurement
    run = suffix_runner(vit, 1, acts.frame, cm, positions=acts.positions)
    with torch.no_grad():
        run(acts.patches)
    _check(vit, before)
    A_hat = acts.patches + 0.01 * torch.randn(acts.patches.shape, generator=torch.Generator().manual_seed(2))
    certified_constants(cm, acts, 1, A_hat)
    _check(vit, before)
    estimate_constants(cm, acts, A_hat, 1, power_iters=2)
    _check(vit, before)


def test_weight_and_state_probes_restore_every_flag(vit):
    before = _flags(vit)
    for probe in (
        lambda: describe(vit),
        lambda: subspaces(vit),
        lambda: head_weights(vit, 1, 0),
        lambda: encoder_weights(vit),
        lambda: weight_matrices(vit),
        lambda: trainable_parameters(vit),
        lambda: path_norm(vit, PIXELS[:1]),
        lambda: token_states(vit, PIXELS),
    ):
        probe()
        _check(vit, before)


def test_decoder_probes_restore_every_flag():
    model = build("gpt2")
    model = _mixed(model, describe(model).blocks)
    before = _flags(model)
    arch = describe(model)
    capture_block_kwargs(arch.base_model, arch.blocks, 5)
    _check(model, before)
    token_states(model, {"input_ids": torch.randint(3, 60, (2, 5), generator=torch.Generator().manual_seed(3))})
    _check(model, before)
    cm = concept_model_parts(model)
    ids = torch.randint(3, 60, (2, 5), generator=torch.Generator().manual_seed(4))
    layer_activations(model, {"input_ids": ids, "concept_mask": torch.ones(5, dtype=torch.long)}, 1, cm=cm)
    _check(model, before)


def test_trainer_evaluation_and_the_objective_ledger_restore_every_flag(vit):
    """The trainer's evaluation (also the SRR callback's and the study's path) and the objective ledger used to end
    with ``model.train(was_training)``; they restore each submodule's own flag now."""
    from hf_tdiag.diagnostics.objective_ledger import objective_ledger
    from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
    from hf_tdiag.training.gap import evaluate_classifier

    before = _flags(vit)
    batches = [
        {"pixel_values": PIXELS[:2], "labels": torch.tensor([0, 1])},
        {"pixel_values": PIXELS[2:], "labels": torch.tensor([2, 0])},
    ]
    first = evaluate_classifier(vit, batches, disable_tqdm=True)
    _check(vit, before)
    assert evaluate_classifier(vit, batches, disable_tqdm=True) == first  # eval mode: dropout 0.5 did not run
    torch.manual_seed(0)
    crate = CrateForImageClassification(
        CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2, hidden_dropout_prob=0.5)
    )
    crate = _mixed(crate, crate.crate.encoder.layer)
    before = _flags(crate)
    objective_ledger(crate, torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(3)))
    _check(crate, before)
