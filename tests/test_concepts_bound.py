"""The certified KL bound: each certified constant against brute-force Jacobians, the bound against the empirical
KL on every input (adversarial reconstructions included), certified >= estimated constants, the layer sweep."""

import math

import pytest
import torch
from transformers import BertConfig, BertModel, ViTConfig, ViTForImageClassification

from hf_tdiag import CrateConfig, CrateForImageClassification
from hf_tdiag.diagnostics.concept_fidelity import concept_fidelity, prepare_inputs
from hf_tdiag.diagnostics.concept_fidelity.constants import block_lipschitz_certified
from hf_tdiag.measures.concepts import Reconstruction, SemiNMF
from hf_tdiag.measures.concepts.certified import (
    GELU_LIPSCHITZ,
    attention_lipschitz,
    feed_forward_lipschitz,
    ista_lipschitz,
    layernorm_lipschitz,
)
from hf_tdiag.probes.concept_model import layer_activations

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _digits(n=12):
    from sklearn.datasets import load_digits

    X = load_digits().images[:n]
    return torch.tensor(X, dtype=torch.float32)[:, None] / 8 - 1


def _vit(layers=2, d=16, **kw):
    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=d,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * d,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **kw,
    )
    model = ViTForImageClassification(cfg).eval()
    with torch.no_grad():  # spread the LayerNorm gains and biases so γ_max and β matter
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return model


def _crate(layers=2, **kw):
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=layers, **kw)
    return CrateForImageClassification(cfg).eval()


def _bert(layers=2, vocab=64):
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertModel(cfg).eval()


def _text_encoding(n=8, length=6, vocab=64, seed=0):
    """Random token ids as concept_text.encode_texts lays them out: [CLS]=1, tokens, [SEP]=2."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (n, length), generator=g)
    ids = torch.cat([torch.ones(n, 1, dtype=torch.long), ids, 2 * torch.ones(n, 1, dtype=torch.long)], 1)
    mask = torch.ones(length + 2, dtype=torch.long)
    mask[0] = mask[-1] = 0
    return {
        "input_ids": ids,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": torch.ones_like(ids),
        "concept_mask": mask,
    }


def _exact_jacobian_norm(f, Z):
    """σ_max of the full Jacobian of f at one token matrix Z (float64, autograd), the brute-force reference."""
    J = torch.autograd.functional.jacobian(f, Z.double(), vectorize=True)
    return float(torch.linalg.matrix_norm(J.reshape(Z.numel(), -1).T, ord=2))


def _points_in_ball(Z, radius, count, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(count):
        u = torch.randn(Z.shape, generator=g, dtype=torch.float64)
        yield Z.double() + u / u.norm() * radius * float(torch.rand(1, generator=g))


# ----------------------------------------------------------------------------- the pieces, against brute force


def test_gelu_constant_is_the_maximum_slope():
    x = torch.linspace(-8, 8, 400001, dtype=torch.float64, requires_grad=True)
    (slope,) = torch.autograd.grad(torch.nn.functional.gelu(x).sum(), x)
    assert float(slope.abs().max()) == pytest.approx(GELU_LIPSCHITZ, abs=1e-9)
    assert float(slope.abs().max()) <= GELU_LIPSCHITZ


def test_layernorm_bound_is_exact_at_the_data_and_holds_on_the_ball():
    g = torch.Generator().manual_seed(0)
    Z = torch.randn(1, 5, 7, generator=g, dtype=torch.float64)
    gamma = torch.full((7,), 1.7, dtype=torch.float64)
    eps = 1e-5

    def ln(x, gamma=gamma):
        return torch.nn.functional.layer_norm(x, (7,), gamma, None, eps)

    # radius 0, uniform γ: the Jacobian is γ/s (P − yyᵀ/d), whose norm is γ/s exactly (d ≥ 3)
    exact = _exact_jacobian_norm(ln, Z[0])
    assert float(layernorm_lipschitz(Z, torch.zeros(1), gamma, eps)) == pytest.approx(exact, rel=1e-9)
    gamma2 = torch.rand(7, generator=g, dtype=torch.float64) + 0.5
    for radius in (0.3, 1.0):
        bound = float(layernorm_lipschitz(Z, torch.tensor([radius]), gamma2, eps))
        for Y in _points_in_ball(Z[0], radius, 6, seed=1):
            assert _exact_jacobian_norm(lambda x: ln(x, gamma2), Y) <= bound * (1 + 1e-9)


def _naive_attention(X, Wq, Wk, Wv, Wo, bq, bk, bv, bo, heads):
    """Multi-head softmax attention written out (row-vector form, nn.Linear weight layout)."""
    p = Wq.shape[0] // heads
    out = bo.expand(X.shape[0], -1).clone()
    for k in range(heads):
        r = slice(k * p, (k + 1) * p)
        q, key, v = X @ Wq[r].T + bq[r], X @ Wk[r].T + bk[r], X @ Wv[r].T + bv[r]
        P = torch.softmax(q @ key.T / math.sqrt(p), dim=-1)
        out = out + P @ v @ Wo[:, r].T
    return out


def test_attention_bound_holds_on_the_ball_with_biases():
    g = torch.Generator().manual_seed(2)
    T, d, heads = 5, 6, 2
    Wq, Wk, Wv = (torch.randn(d, d, generator=g, dtype=torch.float64) for _ in range(3))
    Wo = torch.randn(d, d, generator=g, dtype=torch.float64)
    bq, bk, bv, bo = (torch.randn(d, generator=g, dtype=torch.float64) for _ in range(4))
    X0 = torch.randn(1, T, d, generator=g, dtype=torch.float64)
    for radius in (0.0, 0.5):
        bound = float(
            attention_lipschitz(X0, torch.tensor([radius]), Wq, Wk, Wv, Wo, bq, heads, 1 / math.sqrt(d // heads))
        )
        worst = 0.0
        for Y in _points_in_ball(X0[0], radius, 5, seed=3):
            worst = max(
                worst, _exact_jacobian_norm(lambda x: _naive_attention(x, Wq, Wk, Wv, Wo, bq, bk, bv, bo, heads), Y)
            )
        assert worst <= bound
    # the key and value biases do not enter the bound (row-constant logits, zero-sum probability changes): large
    # ones still leave the exact Jacobian norm below it
    bound = float(attention_lipschitz(X0, torch.tensor([0.0]), Wq, Wk, Wv, Wo, bq, heads, 1 / math.sqrt(d // heads)))
    exact = _exact_jacobian_norm(lambda x: _naive_attention(x, Wq, Wk, Wv, Wo, bq, 50 * bk, 50 * bv, bo, heads), X0[0])
    assert exact <= bound


def test_ista_and_feed_forward_constants_by_hand():
    g = torch.Generator().manual_seed(4)
    D = torch.randn(6, 6, generator=g, dtype=torch.float64) * 0.3
    eta = 0.1
    ref = float(torch.linalg.svdvals(torch.eye(6, dtype=torch.float64) + eta * D - eta * D.T @ D)[0])
    assert ista_lipschitz(D, eta) == pytest.approx(ref, rel=1e-12)
    W1 = torch.randn(6, 12, generator=g, dtype=torch.float64)
    W2 = torch.randn(12, 6, generator=g, dtype=torch.float64)
    s1, s2 = (float(torch.linalg.svdvals(w)[0]) for w in (W1, W2))
    assert feed_forward_lipschitz(W1, W2, "gelu") == pytest.approx(s1 * s2 * 1.12890415, rel=1e-7)
    with pytest.raises(ValueError, match="hidden_act"):
        feed_forward_lipschitz(W1, W2, "swish")


def _points_in_box(Z, radii, count, seed):
    """Token matrices whose token t lies within radii[t] of Z's (on the sphere for half of them)."""
    g = torch.Generator().manual_seed(seed)
    for c in range(count):
        u = torch.randn(Z.shape, generator=g, dtype=torch.float64)
        scale = 1.0 if c % 2 == 0 else torch.rand(Z.shape[0], 1, generator=g, dtype=torch.float64)
        yield Z.double() + u / u.norm(dim=-1, keepdim=True) * radii[:, None] * scale


def test_layernorm_and_attention_token_deviations_hold_on_the_box():
    from hf_tdiag.measures.concepts.certified import attention_deviation, layernorm_deviation

    g = torch.Generator().manual_seed(5)
    T, d, heads = 5, 6, 2
    Wq, Wk, Wv, Wo = (torch.randn(d, d, generator=g, dtype=torch.float64) for _ in range(4))
    bq, bk, bv, bo = (torch.randn(d, generator=g, dtype=torch.float64) for _ in range(4))
    X0 = torch.randn(1, T, d, generator=g, dtype=torch.float64)
    gamma = torch.rand(d, generator=g, dtype=torch.float64) + 0.5
    radii = torch.rand(1, T, generator=g, dtype=torch.float64) * 0.6
    radii[0, 0] = 0.0  # an untouched token
    dev_a = attention_deviation(X0, radii, Wq, Wk, Wv, Wo, bq, bk, heads, 1 / math.sqrt(d // heads))[0]
    dev_l = layernorm_deviation(X0, radii, gamma, 1e-5)[0]
    ref_a = _naive_attention(X0[0], Wq, Wk, Wv, Wo, bq, bk, bv, bo, heads)
    ref_l = torch.nn.functional.layer_norm(X0[0], (d,), gamma, None, 1e-5)
    for Y in _points_in_box(X0[0], radii[0], 40, seed=6):
        moved_a = (_naive_attention(Y, Wq, Wk, Wv, Wo, bq, bk, bv, bo, heads) - ref_a).norm(dim=-1)
        moved_l = (torch.nn.functional.layer_norm(Y, (d,), gamma, None, 1e-5) - ref_l).norm(dim=-1)
        assert bool((moved_a <= dev_a * (1 + 1e-9)).all()) and bool((moved_l <= dev_l * (1 + 1e-9)).all())


@pytest.mark.parametrize("family", ["vit", "crate", "bert"])
def test_block_bounds_hold_against_exact_jacobians_and_token_moves(family):
    if family == "bert":
        model = _bert()
        cm, inputs, _ = prepare_inputs(model, _text_encoding(n=1), head=torch.nn.Linear(16, 3))
    else:
        model = _vit() if family == "vit" else _crate()
        cm, inputs, _ = prepare_inputs(model, _digits(1))
    Z = layer_activations(model, inputs, 1, cm=cm).block_inputs[0]
    b64 = __import__("copy").deepcopy(cm.blocks[1]).double()

    def f(x):
        return cm.block_forward(b64, x[None])[0]

    g = torch.Generator().manual_seed(7)
    scale = float(Z.norm(dim=-1).mean())
    for radii in (
        torch.zeros(1, Z.shape[1]),
        0.05 * scale * torch.rand(1, Z.shape[1], generator=g, dtype=torch.float64),
    ):
        lip, dev = block_lipschitz_certified(cm, 1, Z, radii)
        ref = f(Z[0].double())
        for Y in _points_in_box(Z[0], radii[0], 2 if float(radii.max()) else 1, seed=8):
            assert _exact_jacobian_norm(f, Y) <= float(lip[0]) * (1 + 1e-9)
            assert bool(((f(Y) - ref).norm(dim=-1) <= dev[0] * (1 + 1e-9) + 1e-12).all())
    # a Frobenius ball (one radius per input): the same Lipschitz bound as a box with that radius on every token
    r = torch.tensor([0.03 * scale])
    lip_ball, _ = block_lipschitz_certified(cm, 1, Z, r)
    lip_box, _ = block_lipschitz_certified(cm, 1, Z, r[:, None].expand(1, Z.shape[1]))
    assert float(lip_ball[0]) >= float(lip_box[0]) * (1 - 1e-12)


# ----------------------------------------------------------------------------- the bound on models


def _adversarial(model, inputs, layer, k, steps=8, seed=0, **kw):
    """Â on the sphere ‖Â − A‖_F = δ_rec (per input) around A, moved by projected gradient ascent on the KL."""
    cm, inputs, _ = prepare_inputs(model, inputs, **kw)
    acts = layer_activations(model, inputs, layer, cm=cm)
    A = acts.patches.detach()
    est = SemiNMF(k, max_iter=30, random_state=seed).fit(A)
    A_hat0 = est.inverse_transform(est.codes_).to(A)
    radius = (A_hat0 - A).flatten(1).norm(dim=1).view(-1, 1, 1)
    from hf_tdiag.probes.concept_model import suffix_runner

    run = suffix_runner(model, layer, acts.frame, cm, positions=acts.positions)
    with torch.no_grad():
        target = torch.log_softmax(run(A).double(), -1)
    D = (A_hat0 - A).clone()
    for _ in range(steps):
        D.requires_grad_(True)
        lq = torch.log_softmax(run(A + D).double(), -1)
        kl = (target.exp() * (target - lq)).sum()
        (grad,) = torch.autograd.grad(kl, D)
        with torch.no_grad():
            D = D + 0.5 * radius * grad / grad.flatten(1).norm(dim=1).clamp(min=1e-30).view(-1, 1, 1)
            D = D * radius / D.flatten(1).norm(dim=1).clamp(min=1e-30).view(-1, 1, 1)
    return A + D.detach(), A_hat0


def _check_report(r):
    per = r["per_image"]
    for kl, cert, chain in zip(per["kl"], per["bound_certified"], per["bound_certified_chain"]):
        assert kl <= chain * (1 + 1e-9) + 1e-12 and chain <= cert * (1 + 1e-9)
    # every certified constant is at least its local estimate
    cc, ce = r["constants_certified"], r["constants_estimated"]
    blocks = cc["per_image"]["l_blocks"]
    for j, (jac, ratio) in enumerate(zip(ce["l_block_jacobian"], ce["l_block_realized"])):
        for i in range(len(ratio)):
            assert ratio[i] <= blocks[i][j] * (1 + 1e-6)
            if i < len(jac):
                assert jac[i] <= blocks[i][j] * (1 + 1e-6)
    for i, jac in enumerate(ce["l_readout_jacobian"]):
        assert jac <= cc["per_image"]["l_readout"][i] * (1 + 1e-6)
    for a_c, a_e in zip(cc["per_image"]["alpha"], ce["per_image"]["alpha"]):
        assert a_e <= a_c * (1 + 1e-9)
    assert cc["w_c_op"] == ce["w_c_op"]


@pytest.mark.parametrize("name", ["vit", "crate-cls", "crate-mean", "bert"])
def test_certified_bound_holds_on_every_input_including_adversarial_reconstructions(name):
    if name == "bert":
        model, inputs, kw = _bert(), _text_encoding(n=8), {"labels": [0, 1, 2, 3] * 2}
    else:
        model = _vit() if name == "vit" else _crate(pooling="mean" if name == "crate-mean" else "cls")
        inputs, kw = _digits(8), {}
    for layer in range(0, 3):
        A_adv, A_hat0 = _adversarial(model, inputs, layer, 3, **kw)
        fixed = {
            name: Reconstruction(lambda A, A_hat=A_hat: A_hat) for name, A_hat in (("plain", A_hat0), ("adv", A_adv))
        }
        plain = concept_fidelity(model, inputs, layer, fixed["plain"], power_iters=8, progress=False, **kw)
        adv = concept_fidelity(model, inputs, layer, fixed["adv"], power_iters=8, progress=False, **kw)
        _check_report(plain)
        _check_report(adv)
        assert adv["delta_rec"] == pytest.approx(plain["delta_rec"], rel=1e-4)  # same sphere
        if layer < 2 or name == "crate-mean":
            assert adv["kl"] > plain["kl"]  # the ascent found worse reconstructions at the same distance
        assert adv["frac_kl_below_bound_certified"] == 1.0


def test_kl_is_recomputed_by_a_hooked_full_forward():
    """The report's KL against an independent route: the whole model run with a hook that swaps the patch tokens."""
    model = _vit(layers=3)
    X = _digits(6)
    r = concept_fidelity(model, X, 1, 3, progress=False, bounds=False, return_tensors=True)
    A_hat = r.tensors["A_hat"]

    def swap(module, args, output):
        out = output[0] if isinstance(output, tuple) else output
        out = torch.cat([out[:, :1], A_hat.to(out)], 1)
        return (out, *output[1:]) if isinstance(output, tuple) else out

    with torch.no_grad():
        p = torch.softmax(model(X).logits.double(), -1)
        from hf_tdiag.probes.describe import describe

        block1 = describe(model).encoder_layers[0]  # block 1's output = hidden_states[1]
        handle = block1.register_forward_hook(swap)
        try:
            q = torch.softmax(model(X).logits.double(), -1)
        finally:
            handle.remove()
    kl = (p * (p.log() - q.log())).sum(-1)
    assert r["per_image"]["kl"] == pytest.approx(kl.tolist(), rel=1e-5, abs=1e-12)
    assert r["per_image"]["top1_agree"] == [float(a == b) for a, b in zip(p.argmax(-1).tolist(), q.argmax(-1).tolist())]


def test_chain_and_seed_form_from_the_reported_constants_by_hand():
    model = _crate(layers=3)
    r = concept_fidelity(model, _digits(6), 1, 4, power_iters=5, progress=False)
    c = r["constants_certified"]
    for i in range(6):
        gain = math.prod(c["per_image"]["l_blocks"][i])
        assert gain == pytest.approx(c["per_image"]["suffix_gain"][i], rel=1e-12)
        assert max(c["per_image"]["l_blocks"][i]) == pytest.approx(c["per_image"]["l_block"][i], rel=1e-12)
        moved = c["per_image"]["head_input_deviation"][i]
        assert moved <= c["per_image"]["l_readout"][i] * gain * r["per_image"]["delta_rec"][i] * (1 + 1e-12)
        assert r["per_image"]["bound_certified_chain"][i] == pytest.approx(0.5 * (c["w_c_op"] * moved) ** 2, rel=1e-9)
        seed = (
            0.5
            * (c["w_c_op"] * c["per_image"]["l_readout"][i]) ** 2
            * c["per_image"]["l_block"][i] ** 4
            * (
                math.sqrt(16) * r["per_image"]["delta_rec"][i]
                + c["per_image"]["alpha"][i] * r["per_image"]["gram_norm"][i] * r["per_image"]["delta_gram"][i]
            )
            ** 2
        )
        assert r["per_image"]["bound_certified"][i] == pytest.approx(seed, rel=1e-9)
    assert len(c["per_image"]["l_blocks"][0]) == 2  # blocks 2 and 3 follow layer 1


# ----------------------------------------------------------------------------- the sweep


def test_sweep_equals_separate_single_layer_runs():
    model = _crate(layers=2)
    X = _digits(8)
    est = SemiNMF(3, gram_weight=0.5, max_iter=20, refine_iter=5)
    sweep = concept_fidelity(model, X, concepts=est, layers="all", power_iters=4, progress=False)
    assert sweep["layers"] == [0, 1, 2] and est.__dict__.get("components_") is None  # the spec is not consumed
    for layer in (0, 1, 2):
        single = concept_fidelity(
            model, X, layer, SemiNMF(3, gram_weight=0.5, max_iter=20, refine_iter=5), power_iters=4, progress=False
        )
        rep = sweep["per_layer"][layer]
        for key in ("delta_rec", "delta_gram", "kl", "bound_certified", "bound_certified_chain", "bound_estimated"):
            # two runs: the thread count follows the idle cores, so float32 sums may run in another order
            assert rep["per_image"][key] == pytest.approx(single["per_image"][key], rel=1e-6, abs=1e-9), (layer, key)
        row = sweep["table"][layer]
        assert row["layer"] == layer and row["kl"] == pytest.approx(single["kl"], rel=1e-6, abs=1e-9)
        assert row["bound_certified"] == pytest.approx(single["bound_certified"], rel=1e-6, abs=1e-9)
    # the last layer with CLS pooling: the head's input is untouched, KL and the chain are exactly 0
    assert sweep["per_layer"][2]["kl"] == 0.0 and sweep["per_layer"][2]["bound_certified_chain"] == 0.0
    assert concept_fidelity(model, X, concepts=3, layers=[1], bounds=False, progress=False)["layers"] == [1]
    with pytest.raises(ValueError, match="layer"):
        concept_fidelity(model, X, 1, 3, layers="all", progress=False)
    with pytest.raises(TypeError, match="concepts"):
        concept_fidelity(model, X, concepts=SemiNMF(3).fit(torch.rand(40, 64)), layers="all", progress=False)
