"""The complexity baselines by hand: norms of matrices whose singular values are known, margins of logits written
out, bisections whose every probe is known, box projections coordinate by coordinate, and each check's message."""

import math

import pytest
import torch
from torch import nn

from hf_tdiag.measures.complexity import (
    bisect_largest,
    inverse_margin,
    l2,
    l2_norm,
    log_prod_of_spec,
    log_prod_spectral_norm,
    output_margins,
    project_box,
    spectral_norms,
    sum_of_spec,
)
from hf_tdiag.probes.weights import trainable_parameters, weight_matrices

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors: threads only contend


# ------------------------------------------------------------------------------------------------ norms


def _two_layer_net():
    """x -> LayerNorm -> W1 x + b1 -> W2 h + b2 with W1 = diag(3, 4) (σ = 4, ‖·‖²_F = 25), W2 = [1, 2] (σ = √5,
    ‖·‖²_F = 5), b1 = (1, 1), b2 = 0.5, LayerNorm weight (1, 1) and bias (0, 0)."""
    net = nn.Sequential(nn.LayerNorm(2), nn.Linear(2, 2), nn.Linear(2, 1))
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[3.0, 0.0], [0.0, 4.0]]))
        net[1].bias.copy_(torch.tensor([1.0, 1.0]))
        net[2].weight.copy_(torch.tensor([[1.0, 2.0]]))
        net[2].bias.copy_(torch.tensor([0.5]))
    return net


def test_norms_of_a_two_layer_net_by_hand():
    net = _two_layer_net()
    maps = weight_matrices(net)
    assert list(maps) == ["1.weight", "2.weight"]  # LayerNorm and bias vectors are not linear maps
    assert l2(maps) == 25.0 + 5.0  # Σ_i ‖W_i‖²_F over the two weight matrices only
    assert torch.equal(spectral_norms(maps), torch.tensor([4.0, math.sqrt(5.0)], dtype=torch.float64))
    assert log_prod_spectral_norm(maps) == pytest.approx(math.log(4.0 * math.sqrt(5.0)), rel=1e-14)
    assert log_prod_of_spec(maps) == pytest.approx(math.log(16.0 * 5.0), rel=1e-14)  # log Π σ²
    assert sum_of_spec(maps) == pytest.approx(2.0 * math.sqrt(80.0), rel=1e-14)  # d (Π σ²)^{1/d}, d = 2
    # ‖w‖₂ over every trainable parameter: the weights (30), b1 (2), b2 (0.25), LayerNorm weight (2) and bias (0)
    params = trainable_parameters(net)
    assert len(params) == 6
    assert l2_norm(params) == pytest.approx(math.sqrt(34.25), rel=1e-15)
    assert l2_norm(list(params.values())) == l2_norm(params)


def test_log_spectral_product_of_small_norms_is_negative_and_a_zero_matrix_an_error():
    # σ = 0.5 and 0.25: the log product is log(1/8) < 0, a perfectly good value (norms below 1 are no error)
    mats = [torch.tensor([[0.5, 0.0], [0.0, 0.1]]), torch.tensor([[0.0, 0.25]])]
    assert log_prod_spectral_norm(mats) == pytest.approx(math.log(0.125), rel=1e-7)
    assert log_prod_of_spec(mats) == pytest.approx(2 * math.log(0.125), rel=1e-7)
    assert log_prod_spectral_norm([torch.tensor([[1.0]])]) == 0.0
    for zero in ([torch.zeros(2, 3)], [torch.eye(2), torch.zeros(1, 1)]):
        with pytest.raises(ValueError, match="zero spectral norm"):
            log_prod_spectral_norm(zero)
        with pytest.raises(ValueError, match="zero spectral norm"):
            log_prod_of_spec(zero)


@pytest.mark.parametrize(
    "call, name",
    [(l2, "matrices"), (l2_norm, "tensors"), (log_prod_spectral_norm, "matrices"), (spectral_norms, "matrices")],
)
def test_norm_messages_name_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name}: expected at least one tensor, got none"):
        call([])
    with pytest.raises(TypeError, match=rf"^{name}: expected a sequence \(or dict\) of tensors, got a single"):
        call(torch.ones(2, 2))
    with pytest.raises(ValueError, match=rf"^{name}\[1\]: "):
        call([torch.ones(2, 2), torch.full((2, 2), float("nan"))])


# ------------------------------------------------------------------------------------------------ margins


def test_output_margins_written_out():
    logits = torch.tensor(
        [
            [2.0, 0.5, -1.0],  # y = 0: 2 − 0.5
            [2.0, 0.5, -1.0],  # y = 2: −1 − 2
            [1.0, 3.0, 3.0],  # y = 1: 3 − 3 (a tie with another class is margin 0)
            [-5.0, -7.0, -6.0],  # y = 0: −5 − (−6)
        ]
    )
    labels = torch.tensor([0, 2, 1, 0])
    got = output_margins(logits, labels)
    assert got.dtype == torch.float64
    assert got.tolist() == [1.5, -3.0, 0.0, 1.0]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8])
def test_output_margins_accept_every_integer_label_dtype(dtype):
    logits = torch.tensor([[0.0, 4.0, 1.0], [2.0, -1.0, 0.5]])
    got = output_margins(logits, torch.tensor([1, 0], dtype=dtype))
    assert got.tolist() == [3.0, 1.5]
    assert inverse_margin(logits, torch.tensor([1, 0], dtype=dtype), quantile=0.0) == 1 / 1.5**2


def test_output_margins_computed_in_float64():
    # float32 logits 1e8 and 1: the margin 99999999 exists in float64 only (float32 spacing at 1e8 is 8)
    logits = torch.tensor([[1e8, 1.0]], dtype=torch.float32)
    assert output_margins(logits, torch.tensor([0])).tolist() == [99999999.0]


def test_output_margins_shape_checks():
    for bad in (torch.zeros(3, 1), torch.zeros(3), torch.zeros(2, 3, 4)):
        with pytest.raises(ValueError, match=r"^logits: expected shape \(n, num_classes\) with num_classes >= 2"):
            output_margins(bad, torch.zeros(bad.shape[0], dtype=torch.int64))


def test_inverse_margin_percentile_by_hand():
    # margins 1, 2, …, 10 (label 0, the other class at 0): the 10th percentile, linear interpolation between order
    # statistics at position q (n − 1) = 0.9, is 1 + 0.9 · (2 − 1) = 1.9
    margins = torch.arange(1.0, 11.0)
    logits = torch.stack([margins, torch.zeros(10)], dim=1)[
        torch.randperm(10, generator=torch.Generator().manual_seed(0))
    ]
    labels = torch.zeros(10, dtype=torch.int64)
    assert inverse_margin(logits, labels) == pytest.approx(1 / 1.9**2, rel=1e-14)
    assert inverse_margin(logits, labels, quantile=0.5) == pytest.approx(1 / 5.5**2, rel=1e-14)  # the median
    assert inverse_margin(logits, labels, quantile=0) == 1.0  # the smallest margin
    assert inverse_margin(logits, labels, quantile=1) == 1 / 100  # the largest
    # margins below 1 are fine: 1/γ² > 1
    assert inverse_margin(0.25 * logits, labels, quantile=0) == 16.0
    assert inverse_margin(torch.tensor([[0.5, 0.0]]), torch.tensor([0])) == 4.0


def test_inverse_margin_zero_or_negative_percentile_is_an_error():
    logits = torch.tensor([[1.0, 1.0], [3.0, 0.0]])  # margins 0 and 3
    labels = torch.tensor([0, 0])
    with pytest.raises(ValueError, match=r"^logits: the 0% percentile output margin is 0 <= 0"):
        inverse_margin(logits, labels, quantile=0)
    assert inverse_margin(logits, labels, quantile=1) == 1 / 9
    with pytest.raises(ValueError, match="misclassifies"):
        inverse_margin(torch.tensor([[0.0, 2.0]]), torch.tensor([0]))  # margin −2


@pytest.mark.parametrize("quantile", [-0.1, 1.5, 2.5, float("nan"), float("inf")])
def test_inverse_margin_quantile_outside_the_unit_interval(quantile):
    logits, labels = torch.tensor([[2.0, 0.0]]), torch.tensor([0])
    with pytest.raises(ValueError, match=r"^quantile: expected a finite number in \[0, 1\], got"):
        inverse_margin(logits, labels, quantile=quantile)


# ------------------------------------------------------------------------------------------------ bisection


def _recording(threshold):
    calls = []

    def predicate(x):
        calls.append(x)
        return x <= threshold

    return predicate, calls


def test_geometric_bisection_probes_the_geometric_means():
    # [1, 256], true up to 20: hi and lo checked, then √(1·256) = 16 (true), √(16·256) = 64, √(16·64) = 32 (false)
    predicate, calls = _recording(20.0)
    assert bisect_largest(predicate, 1.0, 256.0, iters=3) == 16.0
    assert calls == [256.0, 1.0, 16.0, 64.0, 32.0]
    # the arithmetic bisection of the same bracket probes the midpoints
    predicate, calls = _recording(20.0)
    assert bisect_largest(predicate, 1.0, 256.0, iters=3, geometric=False) == 1.0
    assert calls == [256.0, 1.0, 128.5, 64.75, 32.875]


def test_bisection_default_takes_twelve_steps():
    # arithmetic on [0, 1] for x <= 0.3: after 12 halvings the bracket is 1/4096 wide and the answer its true end,
    # ⌊0.3 · 4096⌋ / 4096 = 1228 / 4096
    predicate, calls = _recording(0.3)
    assert bisect_largest(predicate, 0.0, 1.0, geometric=False) == 1228 / 4096
    assert len(calls) == 2 + 12
    # geometric on [1, 2^12] for x <= 2^7.3: log2 bisected 12 times from [0, 12], so the answer is 2^(k · 12/4096)
    # with k the largest such that k · 12 / 4096 <= 7.3, k = 2491
    predicate, calls = _recording(2**7.3)
    assert bisect_largest(predicate, 1.0, 2.0**12) == pytest.approx(2 ** (2491 * 12 / 4096), rel=1e-12)
    assert len(calls) == 2 + 12


def test_bisection_bracket_edges():
    assert bisect_largest(lambda x: True, 0.5, 2.0) == 2.0  # true at hi: hi
    assert bisect_largest(lambda x: False, 0.5, 2.0) == 0.5  # false even at lo: lo
    assert bisect_largest(lambda x: x <= 2.0, 0.5, 2.0) == 2.0  # true exactly at hi
    assert bisect_largest(lambda x: x < 0.5, 0.5, 2.0) == 0.5
    with pytest.raises(ValueError, match=r"^lo, hi: expected lo < hi, got lo=1.0, hi=1.0"):
        bisect_largest(lambda x: True, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"^lo, hi: expected lo < hi, got lo=2.0, hi=1.0"):
        bisect_largest(lambda x: True, 2.0, 1.0, geometric=False)
    with pytest.raises(ValueError, match=r"^lo: expected lo > 0 for a geometric bisection, got -1.0"):
        bisect_largest(lambda x: True, -1.0, 1.0)
    assert bisect_largest(lambda x: x <= -0.5, -1.0, 1.0, iters=1, geometric=False) == -1.0  # probed 0: false


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1"])
def test_bisection_messages_name_the_argument(bad):
    with pytest.raises(ValueError, match=r"^lo: expected a finite number, got"):
        bisect_largest(lambda x: True, bad, 2.0)
    with pytest.raises(ValueError, match=r"^hi: expected a finite number, got"):
        bisect_largest(lambda x: True, 0.5, bad)


@pytest.mark.parametrize("iters", [0, -3, 2.5])
def test_bisection_iters_must_be_positive(iters):
    with pytest.raises(ValueError, match=r"^iters: expected a positive integer, got"):
        bisect_largest(lambda x: True, 0.5, 2.0, iters=iters)


# ------------------------------------------------------------------------------------------------ box projection


def test_project_box_coordinate_by_coordinate():
    bound = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.5, 2.0])
    delta = torch.tensor([-3.0, -1.0, 0.25, 1.0, 1.5, 0.7, -0.7, -0.5, -2.5])
    # beyond the edge -> the edge; at the edge or inside -> unchanged; a zero half-width pins the coordinate to 0
    want = torch.tensor([-1.0, -1.0, 0.25, 1.0, 1.0, 0.0, 0.0, -0.5, -2.0])
    got = project_box(delta, bound)
    assert torch.equal(got, want)
    assert torch.equal(project_box(got, bound), got)  # a projection: idempotent
    assert torch.equal(project_box(delta.reshape(3, 3), bound.reshape(3, 3)), want.reshape(3, 3))


def test_project_box_checks():
    d = torch.tensor([0.5])
    with pytest.raises(TypeError, match=r"^delta, bound: expected torch.Tensors"):
        project_box([0.5], torch.ones(1))
    with pytest.raises(TypeError, match=r"^delta, bound: expected torch.Tensors"):
        project_box(d, [1.0])
    with pytest.raises(ValueError, match=r"^bound: expected shape \(1,\) to match delta, got \(2,\)"):
        project_box(d, torch.ones(2))
    with pytest.raises(ValueError, match=r"^bound: expected non-negative half-widths"):
        project_box(d, torch.tensor([-0.1]))
    assert torch.equal(project_box(d, torch.tensor([0.0])), torch.tensor([0.0]))
