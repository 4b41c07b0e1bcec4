"""linear_probe_accuracy against hand-worked cases: standardised with the training set's statistics (not the test
set's), constant features left as they are, and the predictions of a logistic regression written out in the test."""

import numpy as np
import pytest

from hf_tdiag.measures.linear_probe import linear_probe_accuracy


def test_the_test_features_are_standardised_with_the_training_statistics():
    # train: class 0 at x = 0, class 1 at x = 2; test: the same classes shifted to 10 and 12. With the training
    # mean/std both test points lie far on the class-1 side -> accuracy 1/2; test statistics would give 1.
    train_x = np.array([[0.0], [0.0], [2.0], [2.0]])
    train_y = np.array([0, 0, 1, 1])
    test_x = np.array([[10.0], [12.0]])
    assert linear_probe_accuracy(train_x, train_y, test_x, np.array([0, 1])) == 0.5
    assert linear_probe_accuracy(train_x, train_y, test_x - 10.0, np.array([0, 1])) == 1.0


def test_a_constant_feature_is_not_divided_by_zero_and_the_score_is_the_fraction_right():
    rng = np.random.default_rng(0)
    x = np.c_[rng.normal(size=40), np.full(40, 3.0)]  # second column constant
    y = (x[:, 0] > 0).astype(int)
    flipped = y.copy()
    flipped[:5] = 1 - flipped[:5]  # five labels wrong out of 40 -> at most 35/40 can be right
    acc = linear_probe_accuracy(x, y, x, flipped)
    assert acc == pytest.approx(35 / 40)


def test_against_a_logistic_regression_written_out():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(1)
    x = rng.normal(size=(120, 5)) * [1, 10, 0.1, 3, 1] + [0, 5, 0, -2, 1]
    y = (x @ [1.0, 0.1, 5.0, -0.3, 0.0] + rng.normal(scale=0.8, size=120) > 0).astype(int)
    tr, te = slice(0, 80), slice(80, 120)
    mean, std = x[tr].mean(0), x[tr].std(0)
    clf = LogisticRegression(C=0.3, max_iter=2000).fit((x[tr] - mean) / std, y[tr])
    expected = float(np.mean(clf.predict((x[te] - mean) / std) == y[te]))
    assert linear_probe_accuracy(x[tr], y[tr], x[te], y[te], C=0.3) == expected
    assert 0.5 < expected < 1.0  # a case where the number is not trivially 0, 1/2 or 1
