import itertools

import numpy as np
import pytest
import scipy.stats
import torch

from hf_tdiag.measures.correlation import granulated_kendall, jiang_tau, kendall_tau


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
    assert kendall_tau(np.exp(x), y**3) == pytest.approx(kendall_tau(x, y))


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
    assert res.incomplete == {"bs": 0, "lr": 0} and res.missing_runs == 0
    # the same with a column mapping instead of per-run dicts
    cols = {"lr": [h["lr"] for h in hp], "bs": [h["bs"] for h in hp]}
    assert granulated_kendall(m, g, cols).to_dict() == res.to_dict()


def test_jiang_tau_is_tau_a_hand_worked():
    # pairs (0,1) tied in x -> 0, (0,2) C, (1,2) C: Jiang's tau = 2*2 / (3*2) = 2/3 (tau-b would be 2/sqrt(2*3))
    assert jiang_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / 3)
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / np.sqrt(6))
    assert jiang_tau([5.0], [1.0]) == 0.0 and jiang_tau([3, 3], [1, 2]) == 0.0
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=30), rng.normal(size=30)  # no ties: tau-a = tau-b
    assert jiang_tau(x, y) == pytest.approx(scipy.stats.kendalltau(x, y).statistic, abs=1e-12)


def test_granulated_kendall_ties_missing_runs_and_constant_groups_by_hand():
    # a in {0,1,2} x b in {0,1}; the run (a=2, b=1) is missing; gap tied in the group a=0
    hp = [{"a": 0, "b": 0}, {"a": 0, "b": 1}, {"a": 1, "b": 0}, {"a": 1, "b": 1}, {"a": 2, "b": 0}]
    meas = [1.0, 2.0, 3.0, 4.0, 5.0]
    gap = [1.0, 1.0, 0.5, 2.0, 3.0]
    res = granulated_kendall(meas, gap, hp)
    # axis b, m_b = |{0,1,2}| = 3 groups: a=0 constant gap -> 0 ; a=1 concordant -> 1 ; a=2 one run -> 0
    assert res.per_axis["b"] == pytest.approx(1 / 3)
    # axis a, m_a = 2 groups: b=0: (1,1) (3,.5) (5,3): D, C, C -> 2*1/6 = 1/3 ; b=1: (2,1) (4,2) -> 1
    assert res.per_axis["a"] == pytest.approx((1 / 3 + 1) / 2)
    assert res.psi == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert res.groups == {"a": 2, "b": 3}
    assert res.incomplete == {"a": 1, "b": 1} and res.missing_runs == 1
    # the grid's values can be given: a value no run has is a missing column of groups
    full = granulated_kendall(meas, gap, hp, axes_values={"a": [0, 1, 2, 3], "b": [0, 1]})
    assert full.missing_runs == 3 and full.groups == {"a": 2, "b": 4}
    assert full.per_axis["b"] == pytest.approx(1 / 4)  # the group a=3 has no run: counts 0 of 4
    with pytest.raises(ValueError, match="lacks the run values"):
        granulated_kendall(meas, gap, hp, axes_values={"a": [0, 1], "b": [0, 1]})


def test_all_tied_axis_counts_zero_and_one_axis_is_jiang_tau():
    # the measure is constant along b in every group: psi_b = 0 and it still counts in Psi
    hp = {"a": [0, 0, 1, 1, 2, 2], "b": [0, 1, 0, 1, 0, 1]}
    meas = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    gap = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    res = granulated_kendall(meas, gap, hp)
    assert res.per_axis == pytest.approx({"a": 1.0, "b": 0.0}) and res.psi == pytest.approx(0.5)
    rng = np.random.default_rng(3)
    m, g = rng.integers(0, 4, size=9).astype(float), rng.integers(0, 4, size=9).astype(float)
    assert granulated_kendall(m, g, {"seed": list(range(9))}).psi == pytest.approx(jiang_tau(m, g))


def _naive_psi(meas, gap, runs, theta):
    """Jiang et al.'s Eq. 2-3 written out literally: loops over axes, every group of the other axes, every ordered pair."""
    axes = list(theta)
    psis = []
    for k in axes:
        others = [a for a in axes if a != k]
        total, m_k = 0.0, 0
        for combo in itertools.product(*(theta[a] for a in others)):
            m_k += 1
            members = [i for i, r in enumerate(runs) if all(r[a] == v for a, v in zip(others, combo))]
            n = len(members)
            if n < 2:
                continue
            s = sum(np.sign(meas[i] - meas[j]) * np.sign(gap[i] - gap[j]) for i in members for j in members if i != j)
            total += s / (n * (n - 1))
        psis.append(total / m_k)
    return sum(psis) / len(psis), psis


@pytest.mark.parametrize("seed", range(5))
def test_granulated_kendall_matches_the_formula_written_out(seed):
    rng = np.random.default_rng(seed)
    theta = {"v": ["x", "y", "z"], "lr": [1, 2, 3], "wd": [0.0, 0.1]}
    runs = [dict(zip(theta, c)) for c in itertools.product(*theta.values())]
    runs = [r for r in runs if rng.random() > 0.2]  # missing runs
    meas = rng.integers(0, 4, size=len(runs)).astype(float)  # ties
    gap = rng.integers(0, 3, size=len(runs)).astype(float)
    expected, per_axis = _naive_psi(meas, gap, runs, theta)
    res = granulated_kendall(meas, gap, runs, axes_values=theta)
    assert res.psi == pytest.approx(expected, abs=1e-12)
    assert [res.per_axis[a] for a in theta] == pytest.approx(per_axis, abs=1e-12)


def test_psi_is_the_mean_of_the_axes_and_psi_k_the_mean_of_the_groups_not_a_median():
    # three axes chosen so that mean and median differ both across axes and across the groups of one axis
    theta = {"a": [0, 1], "b": [0, 1], "c": [0, 1, 2]}
    runs = [dict(zip(theta, c)) for c in itertools.product(*theta.values())]
    meas = [float(r["a"] + 10 * r["b"] + 100 * r["c"]) for r in runs]
    # gap follows a, b and c except in one a-group, where it goes against the measure
    gap = [
        float(r["a"] * (-1 if (r["b"], r["c"]) == (0, 0) else 1) + 10 * r["b"] - 100 * r["c"] * (r["a"] == 1))
        for r in runs
    ]
    expected, per_axis = _naive_psi(meas, gap, runs, theta)
    res = granulated_kendall(meas, gap, runs)
    assert res.psi == pytest.approx(expected, abs=1e-12)
    assert [res.per_axis[a] for a in theta] == pytest.approx(per_axis, abs=1e-12)
    assert np.median(per_axis) != pytest.approx(np.mean(per_axis))  # the example separates mean from median
    group_taus_a = [
        jiang_tau([meas[i] for i in idx], [gap[i] for i in idx])
        for idx in (
            [i for i, r in enumerate(runs) if (r["b"], r["c"]) == bc] for bc in itertools.product([0, 1], [0, 1, 2])
        )
    ]
    assert np.median(group_taus_a) != pytest.approx(np.mean(group_taus_a))
    assert res.per_axis["a"] == pytest.approx(np.mean(group_taus_a))


def test_granulated_kendall_bad_input():
    with pytest.raises(ValueError, match="one per run"):
        granulated_kendall([1, 2], [1, 2], {"a": [0]})
    with pytest.raises(ValueError, match="lacks axes"):
        granulated_kendall([1, 2], [1, 2], [{"a": 0}, {"b": 1}])
    with pytest.raises(TypeError, match="hparams"):
        granulated_kendall([1, 2], [1, 2], 5)
    with pytest.raises(ValueError, match="gap"):
        granulated_kendall([1, 2], [1, float("inf")], {"a": [0, 1]})
