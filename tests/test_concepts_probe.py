"""Concept fidelity on CRATE and ViT: layer split, suffix runner, empirical KL, constants, Gram alignment on a trained model."""

import math

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, ViTConfig, ViTForImageClassification

import hf_tdiag
from hf_tdiag import CrateConfig, CrateForImageClassification
from hf_tdiag.diagnostics.concept_fidelity import concept_fidelity, supervised_concepts
from hf_tdiag.measures.concepts import Reconstruction, SemiNMF, fidelity_errors, jacobian_spectral_norm, kl_divergence
from hf_tdiag.probes.concept_model import layer_activations, suffix_runner

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _digits():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return torch.tensor(X, dtype=torch.float32).reshape(-1, 1, 8, 8) / 8 - 1, torch.tensor(y)


def _vit(**kw):
    cfg = dict(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    cfg.update(kw)
    torch.manual_seed(0)
    return ViTForImageClassification(ViTConfig(**cfg)).eval()


def _crate(**kw):
    torch.manual_seed(0)
    return CrateForImageClassification(
        CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=3, **kw)
    ).eval()


@pytest.fixture(scope="module")
def trained_vit():
    """A ViT trained on scikit-learn digits for a few seconds (well above chance)."""
    torch.set_num_threads(1)
    X, y = _digits()
    model = _vit().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    epochs, bs, n_train = 8, 64, 1400
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=epochs * (n_train // bs))
    g = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        perm = torch.randperm(n_train, generator=g)
        for i in range(0, n_train - bs + 1, bs):
            idx = perm[i : i + bs]
            loss = model(X[idx], labels=y[idx]).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        acc = float((model(X[n_train:]).logits.argmax(1) == y[n_train:]).float().mean())
    assert acc > 0.6, acc
    return model, X[n_train:]


# ----------------------------------------------------------------------------- the split at layer ℓ


@pytest.mark.parametrize("make", [_vit, _crate, lambda: _crate(pooling="mean")], ids=["vit", "crate-cls", "crate-mean"])
def test_suffix_runner_reproduces_model_logits_at_every_layer(make):
    model = make()
    X, _ = _digits()
    X = X[:6]
    L = model.config.num_hidden_layers
    with torch.no_grad():
        out = model(pixel_values=X, output_hidden_states=True)
        for layer in range(L + 1):
            acts = layer_activations(model, X, layer)
            # definition: output of block ℓ = hidden_states[ℓ], patch tokens only
            assert torch.equal(acts.patches, out.hidden_states[layer][:, 1:])
            assert torch.equal(acts.prefix, out.hidden_states[layer][:, :1])
            run = suffix_runner(model, layer, acts.prefix)
            assert torch.allclose(run(acts.patches), out.logits, atol=1e-5)
            assert torch.allclose(run(acts.patches[2:4], slice(2, 4)), out.logits[2:4], atol=1e-5)


def test_suffix_runner_leaves_cls_untouched_and_uses_replaced_patches():
    model = _vit()
    X, _ = _digits()
    acts = layer_activations(model, X[:4], 1)
    run = suffix_runner(model, 1, acts.prefix)
    with torch.no_grad():
        changed = run(acts.patches + 0.5)
        # manual: CLS of layer 1 + modified patches -> block 2 -> final norm -> head on CLS
        z = torch.cat([acts.prefix, acts.patches + 0.5], dim=1)
        z = model.vit.layers[1](z)
        ref = model.classifier(model.vit.layernorm(z)[:, 0])
    assert torch.allclose(changed, ref, atol=1e-6)
    assert not torch.allclose(changed, run(acts.patches))


@pytest.mark.parametrize("make", [_vit, _crate], ids=["vit", "crate"])
def test_empirical_kl_is_exactly_zero_when_reconstruction_is_exact(make):
    model = make()
    X, _ = _digits()
    r = concept_fidelity(model, X[:8], 1, Reconstruction(torch.clone), power_iters=3, progress=False)
    assert r["per_image"]["kl"] == [0.0] * 8
    assert r["kl"] == 0.0 and r["top1_agreement"] == 1.0
    assert r["delta_rec"] == 0.0 and r["delta_gram"] == 0.0
    for kind in ("certified", "certified_chain", "estimated"):
        assert r[f"bound_{kind}"] == 0.0, kind
    assert r["frac_kl_below_bound_certified"] == 1.0 and r["frac_kl_below_bound_estimated"] == 1.0


def test_report_matches_direct_computations():
    model = _crate()
    X, _ = _digits()
    X = X[:10]
    est = SemiNMF(6, max_iter=40).fit(layer_activations(model, X, 2).patches)
    r = concept_fidelity(model, X, 2, est, power_iters=5, progress=False, return_tensors=True)
    A, A_hat = r.tensors["A"], r.tensors["A_hat"]
    assert torch.allclose(A_hat, est.inverse_transform(est.transform(A)))
    errs = fidelity_errors(A, A_hat)
    assert r["per_image"]["delta_rec"] == pytest.approx(errs["delta_rec"].tolist())
    assert r["per_image"]["delta_gram"] == pytest.approx(errs["delta_gram"].tolist())
    acts = layer_activations(model, X, 2)
    run = suffix_runner(model, 2, acts.prefix)
    with torch.no_grad():
        kl = kl_divergence(run(A), run(A_hat))
    assert r["per_image"]["kl"] == pytest.approx(kl.tolist(), rel=1e-6, abs=1e-12)
    c = r["constants_estimated"]
    assert c["w_c_op"] == pytest.approx(float(torch.linalg.svdvals(model.classifier.weight.detach().double())[0]))
    assert r["constants_certified"]["w_c_op"] == c["w_c_op"]
    # bound = ½ (‖W_c‖ L_readout)² L_block^{2 L_suf} (√N δ_rec + α ‖G‖ δ_gram)², per image, both constant sets
    for kind, consts in (("estimated", c), ("certified", r["constants_certified"])):
        for i in range(10):
            alpha = consts["per_image"]["alpha"][i]
            l_block = consts["per_image"]["l_block"][i] if kind == "certified" else consts["l_block"]
            l_ro = consts["per_image"]["l_readout"][i] if kind == "certified" else consts["l_readout"]
            term = math.sqrt(16) * errs["delta_rec"][i] + alpha * errs["gram_norm"][i] * errs["delta_gram"][i]
            ref = 0.5 * (c["w_c_op"] * l_ro) ** 2 * l_block ** (2 * 1) * float(term) ** 2
            assert r["per_image"][f"bound_{kind}"][i] == pytest.approx(ref, rel=1e-9)
        below = sum(k <= b for k, b in zip(r["per_image"]["kl"], r["per_image"][f"bound_{kind}"])) / 10
        assert r[f"frac_kl_below_bound_{kind}"] == pytest.approx(below)
    assert r["lemma_holds"] == 1.0


def test_block_lipschitz_estimate_matches_exact_jacobian_norm():
    model = _crate()
    block = model.crate.encoder.layer[1].double()
    Z = torch.randn(2, 17, 64, dtype=torch.float64)

    def f(x):
        return block(x)[0]

    est = jacobian_spectral_norm(f, Z, n_iter=60)
    for i in range(2):
        J = torch.autograd.functional.jacobian(lambda z: f(z[None])[0], Z[i]).reshape(17 * 64, 17 * 64)
        exact = float(torch.linalg.matrix_norm(J, ord=2))
        # power iteration approaches σ_max from below
        assert 0.97 * exact <= float(est[i]) <= exact * (1 + 1e-6)
    # a per-token linear map: the Jacobian norm is σ_max(M) exactly
    M = torch.randn(64, 64, dtype=torch.float64)
    est = jacobian_spectral_norm(lambda x: x @ M, Z, n_iter=200)
    assert torch.allclose(est, torch.linalg.matrix_norm(M, ord=2).expand(2), rtol=1e-4)


# ----------------------------------------------------------------------------- errors


def test_clear_errors_for_bad_models_layers_and_concept_counts():
    model = _vit()
    X, _ = _digits()
    with pytest.raises(ValueError, match="layer"):
        concept_fidelity(model, X[:4], 3, 4, progress=False)
    with pytest.raises(ValueError, match="layer"):
        concept_fidelity(model, X[:4], -1, 4, progress=False)
    with pytest.raises(ValueError, match="n_concepts"):
        concept_fidelity(model, X[:4], 1, 33, progress=False)  # d = 32
    bert = BertForSequenceClassification(
        BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    )
    with pytest.raises(TypeError, match="inputs"):  # a text model given pixels
        concept_fidelity(bert, X[:4], 1, 4, progress=False)
    with pytest.raises(TypeError, match="model"):
        concept_fidelity(torch.nn.Linear(3, 3), X[:4], 1, 4, progress=False)
    with pytest.raises(TypeError, match="inputs"):
        concept_fidelity(model, [1, 2, 3], 1, 4, progress=False)
    with pytest.raises(ValueError, match=r"pixel_values: contains NaN at index \(0, 0, 0, 0\)"):
        concept_fidelity(model, torch.full((2, 1, 8, 8), float("nan")), 1, 4, progress=False)
    with pytest.raises(TypeError, match="concepts"):
        concept_fidelity(model, X[:4], 1, "many", progress=False)
    assert hf_tdiag.concept_fidelity is concept_fidelity


# ----------------------------------------------------------------------------- trained model


def test_gram_weight_lowers_delta_gram_on_a_trained_model(trained_vit):
    model, X = trained_vit
    X = X[:150]
    A = layer_activations(model, X, 1).patches
    plain = SemiNMF(6, max_iter=100).fit(A)
    aligned = SemiNMF(6, gram_weight=10.0, max_iter=100, refine_iter=60).fit(A)
    r0 = concept_fidelity(model, X, 1, plain, bounds=False, progress=False)
    r1 = concept_fidelity(model, X, 1, aligned, bounds=False, progress=False)
    assert r1["delta_gram"] < 0.8 * r0["delta_gram"]
    # per image, most images improve
    better = sum(a < b for a, b in zip(r1["per_image"]["delta_gram"], r0["per_image"]["delta_gram"]))
    assert better >= 0.8 * len(X)


def test_supervised_concepts_lower_kl_on_a_trained_model(trained_vit):
    model, X = trained_vit
    X = X[:100]
    plain = concept_fidelity(model, X, 1, SemiNMF(4, max_iter=60), bounds=False, progress=False)
    sup = supervised_concepts(model, X, 1, 4, kl_weight=20.0, supervised_iter=40, lr=0.05, max_iter=60)
    r = concept_fidelity(model, X, 1, sup, bounds=False, progress=False)
    assert r["kl"] < plain["kl"]
    assert all(p.grad is None for p in model.parameters())  # only the factors were trained
