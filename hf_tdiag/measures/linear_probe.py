"""Linear-probe accuracy: how linearly separable the classes are in a representation.

A multinomial logistic regression (scikit-learn, L2-regularised, features standardised with the training
set's mean and standard deviation) is fitted on training features and scored on held-out features.
"""

from __future__ import annotations

import numpy as np


def linear_probe_accuracy(train_x, train_y, test_x, test_y, *, C: float = 1.0, max_iter: int = 2000) -> float:
    """Test accuracy of ``LogisticRegression(C)`` fitted on standardised ``train_x`` (n, d) → ``train_y``."""
    from sklearn.linear_model import LogisticRegression

    train_x, test_x = np.asarray(train_x, dtype=np.float64), np.asarray(test_x, dtype=np.float64)
    train_y, test_y = np.asarray(train_y), np.asarray(test_y)
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"train_x/test_x: expected (n, d) arrays of equal d, got {train_x.shape} and {test_x.shape}")
    if len(train_x) != len(train_y) or len(test_x) != len(test_y):
        raise ValueError("train_y/test_y: expected one label per row of the features")
    mean, std = train_x.mean(0), train_x.std(0)
    std[std == 0] = 1.0
    clf = LogisticRegression(C=C, max_iter=max_iter)
    clf.fit((train_x - mean) / std, train_y)
    return float((clf.predict((test_x - mean) / std) == test_y).mean())


__all__ = ["linear_probe_accuracy"]
