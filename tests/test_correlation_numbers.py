"""Kendall's τ-b and the granulated Kendall Ψ by value: a naive O(n²) τ-b written here, scipy as a second
reference, hand-worked tie cases, a hand-made two-axis grid, and the argument named in every error."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats
import torch

from hf_tdiag.measures.correlation import granulated_kendall, jiang_tau, kendall_tau


def naive_tau_b(x, y) -> float:
    """(n_c − n_d) / √((n₀ − n₁)(n₀ − n₂)), every pair counted once, tie counts n₁ (x) and n₂ (y)."""
    n = len(x)
    nc = nd = 0
    for i in range(n):
        for j in range(i + 1, n):
            s = np.sign(x[i] - x[j]) * np.sign(y[i] - y[j])
            nc += s > 0
            nd += s < 0
    n0 = n * (n - 1) / 2
    n1 = sum(c * (c - 1) / 2 for c in np.unique(x, return_counts=True)[1])
    n2 = sum(c * (c - 1) / 2 for c in np.unique(y, return_counts=True)[1])
    return float((nc - nd) / math.sqrt((n0 - n1) * (n0 - n2)))


@pytest.mark.parametrize(
    "x, y, expected",
    [
        # ties in x: pairs (0,1) tied in x; 5 concordant, 0 discordant; n0=6, n1=1, n2=0 -> 5/sqrt(5*6)
        ([1, 1, 2, 3], [1, 2, 3, 4], 5 / math.sqrt(30)),
        # ties in y: mirror image
        ([1, 2, 3, 4], [1, 1, 2, 3], 5 / math.sqrt(30)),
        # ties in both, on the same pair: that pair counts in neither; 5 concordant / sqrt(5*5) = 1
        ([1, 1, 2, 3], [5, 5, 6, 7], 1.0),
        # ties in both, different pairs: x ties (0,1), y ties (2,3); concordant (0,2),(0,3),(1,2),(1,3) -> 4/5
        ([1, 1, 2, 3], [1, 2, 3, 3], 4 / 5),
        # n = 2
        ([0.0, 1.0], [3.0, -1.0], -1.0),
        ([0.0, 1.0], [3.0, 4.0], 1.0),
    ],
)
def test_kendall_tau_hand_worked(x, y, expected):
    assert kendall_tau(x, y) == pytest.approx(expected, abs=1e-12)
    assert naive_tau_b(np.array(x, float), np.array(y, float)) == pytest.approx(expected, abs=1e-12)


def test_kendall_tau_matches_naive_and_scipy_on_random_ties():
    rng = np.random.default_rng(0)
    for n in (3, 7, 20):
        for _ in range(5):
            x = rng.integers(0, 4, n).astype(float)
            y = rng.integers(0, 4, n).astype(float)
            if np.all(x == x[0]) or np.all(y == y[0]):
                continue
            got = kendall_tau(x, y)
            assert got == pytest.approx(naive_tau_b(x, y), abs=1e-12)
            assert got == pytest.approx(scipy.stats.kendalltau(x, y, variant="b").statistic, abs=1e-12)


def test_kendall_tau_tau_b_not_tau_a():
    # τ-a would be 5/6 here (a tied pair counts 0 in the numerator and 6 pairs in the denominator)
    x, y = [1, 1, 2, 3], [1, 2, 3, 4]
    assert jiang_tau(x, y) == pytest.approx(10 / 12)
    assert kendall_tau(x, y) == pytest.approx(5 / math.sqrt(30))


def test_kendall_tau_accepts_tensors_with_grad_and_real_number_objects():
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    assert kendall_tau(x, [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert kendall_tau([Fraction(1, 2), Fraction(1, 3), Fraction(1, 4)], [1, 2, 3]) == pytest.approx(-1.0)


def test_kendall_tau_constant_sequence_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"^x: all 3 values are equal"):
        kendall_tau([2.0, 2.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"^y: all 3 values are equal"):
        kendall_tau([1.0, 2.0, 3.0], [5.0, 5.0, 5.0])
    with pytest.raises(ValueError, match=r"^x: all 2 values are equal"):
        kendall_tau([2.0, 2.0], [5.0, 5.0])
    with pytest.raises(ValueError, match=r"^x, y: expected at least 2"):
        kendall_tau([1.0], [1.0])


def test_kendall_tau_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"^x: contains NaN"):
        kendall_tau([1.0, float("nan"), 3.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"^y: contains NaN or inf values \(at positions \[2\]\)"):
        kendall_tau([1.0, 2.0, 3.0], [1.0, 2.0, float("inf")])
    with pytest.raises(TypeError, match=r"^x: expected a 1-D sequence"):
        kendall_tau([1j, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"^y: expected a 1-D sequence of real numbers, got shape \(2, 1\)"):
        kendall_tau([1.0, 2.0], [[1.0], [2.0]])
    with pytest.raises(ValueError, match=r"^x, y: expected the same length, got 2 and 3"):
        kendall_tau([1.0, 2.0], [1.0, 2.0, 3.0])


# A 2 x 2 grid, axes a and b, runs (a, b, measure, gap).
GRID = [(1, 1, 1.0, 1.0), (2, 1, 2.0, 2.0), (1, 2, 3.0, 4.0), (2, 2, 4.0, 3.0)]


def _split(runs):
    return [r[2] for r in runs], [r[3] for r in runs], {"a": [r[0] for r in runs], "b": [r[1] for r in runs]}


def test_granulated_kendall_hand_grid():
    m, g, hp = _split(GRID)
    res = granulated_kendall(m, g, hp)
    # axis a, groups b=1: measure 1,2 gap 1,2 -> +1; b=2: measure 3,4 gap 4,3 -> -1; mean 0
    # axis b, groups a=1: measure 1,3 gap 1,4 -> +1; a=2: measure 2,4 gap 2,3 -> +1; mean 1
    assert res.per_axis == pytest.approx({"a": 0.0, "b": 1.0})
    assert res.psi == pytest.approx(0.5)
    assert res.groups == {"a": 2, "b": 2}
    assert res.incomplete == {"a": 0, "b": 0} and res.missing_runs == 0
    # the same runs as a sequence of per-run dicts
    per_run = [{"a": r[0], "b": r[1]} for r in GRID]
    assert granulated_kendall(m, g, per_run).to_dict() == res.to_dict()


def test_granulated_kendall_three_groups_mean_not_median():
    # axis a over b in {1, 2, 3}: group taus +1, +1, -1 -> mean 1/3 (the median would be 1)
    runs = [(1, 1, 1.0, 1.0), (2, 1, 2.0, 2.0), (1, 2, 1.0, 1.0), (2, 2, 2.0, 2.0), (1, 3, 1.0, 2.0), (2, 3, 2.0, 1.0)]
    m, g, hp = _split(runs)
    res = granulated_kendall(m, g, hp)
    assert res.per_axis["a"] == pytest.approx(1 / 3)
    # axis b over a: a=1: measure 1,1,1 constant -> 0; a=2: measure 2,2,2 constant -> 0
    assert res.per_axis["b"] == pytest.approx(0.0)
    assert res.psi == pytest.approx(1 / 6)


def test_granulated_kendall_missing_run_counts_as_zero():
    m, g, hp = _split(GRID[:3])
    res = granulated_kendall(m, g, hp)
    # axis a: b=1 -> +1, b=2 has one run -> 0; axis b: a=1 -> +1, a=2 has one run -> 0
    assert res.per_axis == pytest.approx({"a": 0.5, "b": 0.5})
    assert res.psi == pytest.approx(0.5)
    assert res.missing_runs == 1 and res.incomplete == {"a": 1, "b": 1}
    # a grid value without any run: axis b gets a third group (b=3), empty -> 0; a: two groups of b=3 empty
    res = granulated_kendall(m, g, hp, axes_values={"a": [1, 2], "b": [1, 2, 3]})
    assert res.groups == {"a": 3, "b": 2}
    assert res.per_axis["a"] == pytest.approx(1 / 3)
    assert res.missing_runs == 3


def test_granulated_kendall_errors_name_the_argument():
    m, g, hp = _split(GRID)
    with pytest.raises(ValueError, match=r"^measure: contains NaN"):
        granulated_kendall([1.0, float("nan"), 3.0, 4.0], g, hp)
    with pytest.raises(ValueError, match=r"^gap: contains NaN"):
        granulated_kendall(m, [1.0, float("nan"), 3.0, 4.0], hp)
    with pytest.raises(ValueError, match=r"^measure, gap: expected the same length, got 4 and 3"):
        granulated_kendall(m, g[:3], hp)
    with pytest.raises(TypeError, match=r"^hparams: values of axis 'a' must be hashable .*got list"):
        granulated_kendall(m, g, {"a": [[1], [2], [1], [2]], "b": hp["b"]})
    with pytest.raises(
        ValueError, match=r"^axes_values: expected a mapping with exactly the axes \['a', 'b'\], got \['a', 'z'\]$"
    ):
        granulated_kendall(m, g, hp, axes_values={"a": [1, 2], "z": [1, 2]})
    with pytest.raises(
        ValueError, match=r"^axes_values: expected a mapping with exactly the axes \['a', 'b'\], got list$"
    ):
        granulated_kendall(m, g, hp, axes_values=["b", "a"])
    with pytest.raises(ValueError, match=r"^axes_values: axis 'b' lacks the run values \['2'\]$"):
        granulated_kendall(m, g, hp, axes_values={"a": [1, 2], "b": [1]})
