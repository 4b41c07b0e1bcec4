import math

import numpy as np
import pytest
import torch
from torch import nn

from hf_tdiag.measures.complexity import (
    bisect_largest,
    inverse_margin,
    l2_norm,
    log_prod_spectral_norm,
    output_margins,
    project_box,
    spectral_norms,
    sum_spectral_norm,
)
from hf_tdiag.probes.weights import path_norm, trainable_parameters, weight_matrices


def _mlp(d_in=4, h=5, d_out=3, bias=True):
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(d_in, h, bias=bias), nn.ReLU(), nn.Linear(h, d_out, bias=bias))


def test_l2_norm_matches_flattened_vector_norm():
    ts = [torch.randn(3, 4), torch.randn(7), torch.randn(2, 2, 2)]
    flat = np.concatenate([t.numpy().ravel() for t in ts]).astype(np.float64)
    assert l2_norm(ts) == pytest.approx(float(np.linalg.norm(flat)), rel=1e-12)
    assert l2_norm({"a": ts[0]}) == pytest.approx(float(np.linalg.norm(ts[0].double().numpy())), rel=1e-12)


def test_spectral_norms_match_svd():
    ms = [torch.randn(5, 3), torch.randn(4, 4, dtype=torch.float64), torch.randn(6, 2, 3)]
    svd = [np.linalg.svd(m.double().numpy().reshape(m.shape[0], -1), compute_uv=False)[0] for m in ms]
    got = spectral_norms(ms)
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), svd, rtol=1e-10)
    assert sum_spectral_norm(ms) == pytest.approx(sum(svd), rel=1e-10)
    assert log_prod_spectral_norm(ms) == pytest.approx(math.log(np.prod(svd)), rel=1e-10)


def test_inverse_margin_matches_naive_percentile():
    torch.manual_seed(0)
    n, c = 50, 4
    labels = torch.randint(0, c, (n,))
    logits = torch.randn(n, c)
    logits[torch.arange(n), labels] += 6.0  # mostly correct
    naive = []
    for i in range(n):
        z = logits[i].tolist()
        y = int(labels[i])
        naive.append(z[y] - max(v for j, v in enumerate(z) if j != y))
    np.testing.assert_allclose(output_margins(logits, labels).numpy(), naive, rtol=1e-6)
    gamma = float(np.percentile(naive, 10))
    assert inverse_margin(logits, labels) == pytest.approx(1 / gamma**2, rel=1e-6)


def test_inverse_margin_undefined_when_misclassified():
    logits = torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match="misclassifies"):
        inverse_margin(logits, torch.tensor([0, 0, 0]))
    with pytest.raises(TypeError, match="labels"):
        inverse_margin(logits, torch.tensor([0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="labels"):
        inverse_margin(logits, torch.tensor([0, 2, 0]))


def test_bad_tensors_are_named():
    with pytest.raises(ValueError, match=r"matrices\[1\].*NaN"):
        spectral_norms([torch.ones(2, 2), torch.tensor([[float("nan")]])])
    with pytest.raises(ValueError, match="matrix"):
        spectral_norms([torch.ones(3)])
    with pytest.raises(TypeError, match="single tensor"):
        l2_norm(torch.ones(3))


def test_bisect_largest_and_project_box():
    thr = math.sqrt(2.0)
    x = bisect_largest(lambda s: s * s <= 2.0, 1e-3, 10.0, iters=40)
    assert x <= thr and x == pytest.approx(thr, rel=1e-6)
    x = bisect_largest(lambda s: s <= 0.3, 0.0, 1.0, iters=30, geometric=False)
    assert x == pytest.approx(0.3, abs=1e-8)
    assert bisect_largest(lambda s: True, 0.1, 1.0) == 1.0
    assert bisect_largest(lambda s: False, 0.1, 1.0) == 0.1
    with pytest.raises(ValueError, match="lo"):
        bisect_largest(lambda s: True, 0.0, 1.0)
    d = torch.tensor([-3.0, 0.5, 2.0])
    b = torch.tensor([1.0, 1.0, 1.5])
    assert torch.equal(project_box(d, b), torch.tensor([-1.0, 0.5, 1.5]))


# ---------------------------------------------------------------- probes.weights


def test_path_norm_equals_explicit_path_enumeration():
    for bias in (False, True):
        model = _mlp(bias=bias)
        w1, w2 = model[0].weight.detach().double(), model[2].weight.detach().double()
        total = 0.0
        for k in range(w2.shape[0]):  # output unit
            for j in range(w2.shape[1]):  # hidden unit
                for i in range(w1.shape[1]):  # input unit
                    total += float(w2[k, j] ** 2 * w1[j, i] ** 2)
                if bias:  # path from the hidden bias unit
                    total += float(w2[k, j] ** 2 * model[0].bias[j].detach().double() ** 2)
            if bias:  # path from the output bias unit
                total += float(model[2].bias[k].detach().double() ** 2)
        before = [p.detach().clone() for p in model.parameters()]
        assert path_norm(model, torch.randn(8, 4)) == pytest.approx(total, rel=1e-12)
        # the model itself is untouched
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_weight_matrices_and_trainable_parameters_of_mlp():
    model = _mlp()
    mats = weight_matrices(model)
    assert list(mats) == ["0.weight", "2.weight"]
    params = trainable_parameters(model)
    assert list(params) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    emb = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2))
    assert list(weight_matrices(emb)) == ["1.weight"]


@pytest.mark.parametrize("variant", ["crate", "crate-c", "crate-n", "crate-t"])
def test_weight_matrices_of_crate_variants(variant):
    from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification

    cfg = CrateConfig(
        image_size=8,
        patch_size=4,
        num_channels=1,
        hidden_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_labels=3,
        variant=variant,
    )
    model = CrateForImageClassification(cfg)
    mats = weight_matrices(model)
    # patch projection + classifier + per block (U^T, output matrix, D)
    assert len(mats) == 2 + 3 * 2
    for i, layer in enumerate(model.crate.encoder.layer):
        out = [v for k, v in mats.items() if k.startswith(f"crate.encoder.layer.{i}.attention.") and "qkv" not in k]
        assert len(out) == 1
        assert torch.equal(out[0], layer.attention.output_matrix())
    norms = spectral_norms(mats)
    assert torch.isfinite(norms).all()
    x = torch.randn(2, 1, 8, 8)
    value = path_norm(model, {"pixel_values": x, "labels": torch.tensor([0, 1])})
    assert math.isfinite(value)
    # path_norm is the forward of the squared float64 copy on a ones image
    sq = CrateForImageClassification(cfg).double().eval()
    sq.load_state_dict({k: v.double() ** 2 if v.is_floating_point() else v for k, v in model.state_dict().items()})
    with torch.no_grad():
        expected = float(sq(torch.ones(1, 1, 8, 8, dtype=torch.float64)).logits.sum())
    assert value == pytest.approx(expected, rel=1e-12)
