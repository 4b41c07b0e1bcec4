"""The SRR regulariser's wiring and block choice (hf_tdiag.training.regularizers) and the generalization gap's
arguments, checked by value: written for the survivors of the mutation run (issue 22)."""

from __future__ import annotations

import math

import pytest
import torch

from hf_tdiag.measures.coding_rate import sparse_rate_reduction
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
from hf_tdiag.training.gap import generalization_gap
from hf_tdiag.training.regularizers import model_srr_penalty, srr_layers_for_step, srr_penalty


def test_generalization_gap_is_val_minus_train_and_names_a_bad_loss():
    assert generalization_gap(0.75, 0.25) == 0.5
    for name, args in (("val_loss", (math.nan, 0.1)), ("train_loss", (0.1, math.inf))):
        with pytest.raises(ValueError, match=rf"^{name}\b"):
            generalization_gap(*args)


@pytest.mark.parametrize("L", [1, 4])
def test_block_numbers_from_both_ends_and_their_limits(L):
    assert srr_layers_for_step(L, L, 0, 0) == [L]
    assert srr_layers_for_step(-L, L, 0, 0) == [1]  # -L counts back to the first block
    assert srr_layers_for_step(-1, L, 0, 0) == [L]
    assert srr_layers_for_step("last", L, 0, 0) == [L]
    assert srr_layers_for_step("all", L, 0, 0) == list(range(1, L + 1))
    for bad in (0, L + 1, -L - 1):
        with pytest.raises(ValueError, match=r"^srr_layer: expected a block number 1\.\."):
            srr_layers_for_step(bad, L, 0, 0)
    for bad in (True, 1.0, "first", None):
        with pytest.raises(ValueError, match=r"^srr_layer: expected a block number, 'last'"):
            srr_layers_for_step(bad, L, 0, 0)
    with pytest.raises(ValueError, match=r"^num_layers\b"):
        srr_layers_for_step("last", 0, 0, 0)


def test_random_block_depends_on_seed_and_step_only():
    import random

    L = 12
    draws = [srr_layers_for_step("random", L, step, 3)[0] for step in range(40)]
    assert draws == [random.Random(f"3:{step}").randrange(L) + 1 for step in range(40)]
    assert len(set(draws)) > 5  # a new block each step, not one fixed block
    other = [srr_layers_for_step("random", L, step, 4)[0] for step in range(40)]
    assert other != draws  # and another seed draws other blocks
    assert draws == [srr_layers_for_step("random", L, step, 3)[0] for step in range(40)]  # a resumed run: the same


def _states(L=3, B=2, N=5, d=8, K=2, p=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    hs = [torch.randn(B, N, d, generator=g, dtype=torch.float64) for _ in range(L + 1)]
    U = [torch.linalg.qr(torch.randn(K, d, p, generator=g, dtype=torch.float64)).Q for _ in range(L)]
    return hs, U


def test_srr_penalty_is_the_mean_over_blocks_of_the_batch_mean_with_the_papers_defaults():
    hs, U = _states()
    per_block = {ell: sparse_rate_reduction(hs[ell], U[ell - 1], eps=0.1, lam=1.0).mean() for ell in (1, 2, 3)}
    assert float(srr_penalty(hs, U, [3])) == pytest.approx(float(per_block[3]), rel=1e-12)
    assert float(srr_penalty(hs, U, [1, 3])) == pytest.approx(float(per_block[1] + per_block[3]) / 2, rel=1e-12)
    custom = sparse_rate_reduction(hs[2], U[1], eps=0.5, lam=0.25).mean()
    assert float(srr_penalty(hs, U, [2], eps=0.5, lam=0.25)) == pytest.approx(float(custom), rel=1e-12)
    assert float(srr_penalty(hs, U, [2], eps=0.5, lam=0.25)) != pytest.approx(float(per_block[2]), rel=1e-6)


def test_model_srr_penalty_reads_the_live_query_subspaces_and_passes_eps_and_lam():
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2)
    model = CrateForImageClassification(cfg)
    pixels = torch.randn(2, cfg.num_channels, cfg.image_size, cfg.image_size)
    hs = model(pixel_values=pixels, output_hidden_states=True).hidden_states
    penalty, layers = model_srr_penalty(model, hs, "all", step=0, seed=0, eps=0.5, lam=0.25)
    assert layers == [1, 2]
    from hf_tdiag.probes.subspaces import subspaces

    U = subspaces(model, "query", detach=True)
    ref = torch.stack([sparse_rate_reduction(hs[ell].detach(), U[ell - 1], eps=0.5, lam=0.25).mean() for ell in (1, 2)])
    assert float(penalty.detach()) == pytest.approx(float(ref.mean()), rel=1e-6)
    default, _ = model_srr_penalty(model, hs, "last", step=0, seed=0)
    ref_default = sparse_rate_reduction(hs[2].detach(), U[1], eps=0.1, lam=1.0).mean()
    assert float(default.detach()) == pytest.approx(float(ref_default), rel=1e-6)
    model.zero_grad()
    penalty.backward()  # differentiable in U: the gradient reaches the subspace weights
    grads = [p.grad for n, p in model.named_parameters() if p.grad is not None and "attention" in n]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)


def test_model_srr_penalty_random_block_follows_the_step_and_seed():
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=3)
    model = CrateForImageClassification(cfg)
    hs = model(pixel_values=torch.randn(1, cfg.num_channels, cfg.image_size, cfg.image_size), output_hidden_states=True)
    hs = [h.detach() for h in hs.hidden_states]
    for seed in (0, 1):
        chosen = [model_srr_penalty(model, hs, "random", step=s, seed=seed)[1] for s in range(12)]
        assert chosen == [srr_layers_for_step("random", 3, s, seed) for s in range(12)]
        assert len({c[0] for c in chosen}) > 1
