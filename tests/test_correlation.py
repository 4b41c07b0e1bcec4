import numpy as np
import pytest
import scipy.stats
import torch

from hf_tdiag.measures.correlation import granulated_kendall, kendall_tau


@pytest.mark.parametrize("seed", range(6))
def test_kendall_tau_matches_scipy_tau_b_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    # few distinct values -> many ties in both sequences
    x = rng.integers(0, 5, size=n).astype(float)
    y = (x + rng.integers(-3, 4, size=n)).astype(float) if seed % 2 else rng.integers(0, 4, size=n).astype(float)
    expected = scipy.stats.kendalltau(x, y, variant="b").statistic
    assert kendall_tau(x, y) == pytest.approx(expected, abs=1e-12)


def test_kendall_tau_continuous_matches_scipy_and_is_symmetric():
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=40), rng.normal(size=40)
    assert kendall_tau(x, y) == pytest.approx(scipy.stats.kendalltau(x, y).statistic, abs=1e-12)
    assert kendall_tau(x, y) == pytest.approx(kendall_tau(y, x))
    assert kendall_tau(x, x) == pytest.approx(1.0)
    assert kendall_tau(x, -x) == pytest.approx(-1.0)
    # rank-based: invariant under strictly increasing transforms
    assert kendall_tau(np.exp(x), y ** 3) == pytest.approx(kendall_tau(x, y))


def test_kendall_tau_hand_worked_ties():
    # pairs: (12)C (13)C (14)C (23) tie in x (24)C (34) tie in y -> (4 - 0)/sqrt(5*5)
    assert kendall_tau([1, 2, 2, 3], [1, 2, 3, 3]) == pytest.approx(0.8)
    assert kendall_tau(torch.tensor([1.0, 2.0, 2.0, 3.0]), [1, 2, 3, 3]) == pytest.approx(0.8)


def test_kendall_tau_bad_input():
    with pytest.raises(ValueError, match="same length"):
        kendall_tau([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="constant"):
        kendall_tau([1, 1, 1], [1, 2, 3])
    with pytest.raises(ValueError, match="NaN"):
        kendall_tau([1, float("nan"), 3], [1, 2, 3])
    with pytest.raises(ValueError, match="at least 2"):
        kendall_tau([1], [1])
    with pytest.raises(ValueError, match="1-D"):
        kendall_tau([[1, 2]], [[1, 2]])


def _hand_example():
    # lr in {a, b} x bs in {1, 2, 3}
    runs = [
        ({"lr": "a", "bs": 1}, 1.0, 1.0),
        ({"lr": "a", "bs": 2}, 2.0, 2.0),
        ({"lr": "a", "bs": 3}, 3.0, 0.0),
        ({"lr": "b", "bs": 1}, 5.0, 4.0),
        ({"lr": "b", "bs": 2}, 4.0, 5.0),
        ({"lr": "b", "bs": 3}, 6.0, 6.0),
    ]
    hp = [r[0] for r in runs]
    m = [r[1] for r in runs]
    g = [r[2] for r in runs]
    return hp, m, g


def test_granulated_kendall_hand_worked():
    hp, m, g = _hand_example()
    res = granulated_kendall(m, g, hp)
    # axis bs (groups = lr): lr=a: pairs C, D, D -> -1/3 ; lr=b: D, C, C -> +1/3 ; psi_bs = 0
    # axis lr (groups = bs): every pair concordant -> psi_lr = 1 ; Psi = (0 + 1) / 2
    assert res.per_axis["bs"] == pytest.approx(0.0)
    assert res.per_axis["lr"] == pytest.approx(1.0)
    assert res.psi == pytest.approx(0.5)
    assert res.groups == {"bs": 2, "lr": 3}
    assert res.skipped == {"bs": 0, "lr": 0}
    # the same with a column mapping instead of per-run dicts
    cols = {"lr": [h["lr"] for h in hp], "bs": [h["bs"] for h in hp]}
    assert granulated_kendall(m, g, cols).to_dict() == res.to_dict()


def test_granulated_kendall_equals_tau_for_one_axis_and_skips_undefined_groups():
    rng = np.random.default_rng(3)
    m, g = rng.normal(size=9), rng.normal(size=9)
    one = granulated_kendall(m, g, {"seed": list(range(9))})
    assert one.psi == pytest.approx(kendall_tau(m, g))
    # a group whose gap is constant is skipped; a single-run group is skipped
    hp = {"a": [0, 0, 1, 1, 2], "b": [0, 1, 0, 1, 0]}
    gap = [1.0, 1.0, 0.5, 2.0, 3.0]
    meas = [1.0, 2.0, 3.0, 4.0, 5.0]
    res = granulated_kendall(meas, gap, hp)
    # axis b (groups by a): a=0 constant gap (skipped), a=1 concordant (+1), a=2 single run (skipped)
    assert res.per_axis["b"] == pytest.approx(1.0)
    assert res.skipped["b"] == 2 and res.groups["b"] == 1
    # axis a (groups by b): b=0: meas 1,3,5 vs gap 1,0.5,3 -> C? (1,2) D, (1,3) C, (2,3) C -> 1/3 ; b=1: meas 2,4 gap 1,2 -> 1
    assert res.per_axis["a"] == pytest.approx((1 / 3 + 1) / 2)
    assert res.psi == pytest.approx(((1 / 3 + 1) / 2 + 1.0) / 2)


def test_granulated_kendall_bad_input():
    with pytest.raises(ValueError, match="one per run"):
        granulated_kendall([1, 2], [1, 2], {"a": [0]})
    with pytest.raises(ValueError, match="lacks axes"):
        granulated_kendall([1, 2], [1, 2], [{"a": 0}, {"b": 1}])
    with pytest.raises(TypeError, match="hparams"):
        granulated_kendall([1, 2], [1, 2], 5)
    with pytest.raises(ValueError, match="gap"):
        granulated_kendall([1, 2], [1, float("inf")], {"a": [0, 1]})
