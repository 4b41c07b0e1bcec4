"""hf_tdiag._validation: each check accepts what it promises and names argument, expectation and value otherwise."""

import math

import numpy as np
import pytest
import torch

from hf_tdiag._validation import (
    ArgumentTypeError,
    check_tensor,
    integer,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    real,
)


def test_integers_accept_ints_and_numpy_ints_and_return_python_ints():
    assert positive_int(3, "n") == 3
    out = non_negative_int(np.int64(0), "n")
    assert out == 0 and type(out) is int
    assert positive_int(None, "n", allow_none=True) is None
    assert integer(5, "seeds", low=2) == 5
    assert integer(3, "layer", low=0, high=4) == 3


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: positive_int(0, "batch_size"), "batch_size: expected a positive integer, got 0"),
        (lambda: positive_int(None, "batch_size"), "batch_size: expected a positive integer, got None"),
        (lambda: non_negative_int(-1, "max_iter"), "max_iter: expected an integer >= 0, got -1"),
        (lambda: positive_int(2.0, "n"), "n: expected a positive integer, got 2.0"),
        (lambda: integer(1, "seeds", low=2), "seeds: expected an integer >= 2, got 1"),
        (lambda: integer(4, "head", low=0, high=4), "head: expected an integer in [0, 4), got 4"),
        (lambda: positive_int(0, "limit", allow_none=True), "limit: expected a positive integer or None, got 0"),
        (lambda: positive_float(0.0, "eps"), "eps: expected a finite number > 0, got 0.0"),
        (lambda: non_negative_float(-0.5, "xi"), "xi: expected a finite number >= 0, got -0.5"),
        (lambda: real(math.nan, "lam"), "lam: expected a finite number, got nan"),
        (lambda: real(1.0, "rank_tol", low=0, high=1, high_open=True), "rank_tol: expected a finite number in [0, 1)"),
    ],
)
def test_messages_name_argument_expectation_and_value(call, message):
    with pytest.raises(ValueError) as excinfo:
        call()
    assert message in str(excinfo.value)


@pytest.mark.parametrize("value", [True, False, "3", [1]])
def test_wrong_types_are_type_errors_and_value_errors(value):
    # the checks this module replaced raised ValueError in most places, TypeError in others: both still catch it
    with pytest.raises(ArgumentTypeError, match="n: expected a positive integer"):
        positive_int(value, "n")
    with pytest.raises(TypeError):
        positive_int(value, "n")
    with pytest.raises(ValueError):
        real(value, "x")


def test_real_bounds_open_and_closed():
    assert real(0.0, "p", low=0) == 0.0
    with pytest.raises(ValueError):
        real(0.0, "p", low=0, low_open=True)
    assert real(1.0, "q", low=0, high=1) == 1.0
    with pytest.raises(ValueError):
        real(math.inf, "q")
    assert isinstance(real(3, "x"), float)


def test_check_tensor_shapes_dtypes_and_finiteness():
    x = torch.zeros(2, 3)
    assert check_tensor(x, "A", ndim=(2, 3)) is x
    assert isinstance(check_tensor(np.ones((2, 3)), "A", ndim=2, allow_numpy=True), torch.Tensor)
    with pytest.raises(TypeError, match=r"A: expected a torch.Tensor of shape \(rows, d\), got ndarray"):
        check_tensor(np.ones((2, 3)), "A", ndim=2)
    with pytest.raises(TypeError, match="A: expected a floating tensor .* got dtype torch.int64"):
        check_tensor(torch.ones(2, 3, dtype=torch.int64), "A")
    with pytest.raises(ValueError, match=r"A: expected shape \(rows, d\) or \(images, N, d\), got \(4,\)"):
        check_tensor(torch.ones(4), "A", ndim=(2, 3))
    with pytest.raises(ValueError, match=r"x: expected shape 2 or 3 or 4 dimensions, got \(4,\)"):
        check_tensor(torch.ones(4), "x", ndim=(2, 3, 4))
    with pytest.raises(ValueError, match=r"Z: expected shape \(\.\.\., N, d\), got \(4,\)"):
        check_tensor(torch.ones(4), "Z", min_ndim=2, shape="(..., N, d)")
    with pytest.raises(ValueError, match="non-empty tensor"):
        check_tensor(torch.ones(0, 3), "A")
    # empty leading (batch) dimensions pass when only the trailing ones must be non-empty
    check_tensor(torch.ones(0, 2, 3), "Z", nonempty_trailing=2)
    with pytest.raises(ValueError, match="non-empty trailing dimensions"):
        check_tensor(torch.ones(2, 0, 3), "Z", nonempty_trailing=2)
    bad = torch.ones(3, 3)
    bad[1, 2] = math.nan
    with pytest.raises(ValueError, match="A: contains NaN or inf"):
        check_tensor(bad, "A")
    check_tensor(bad, "A", finite=False)
    big = torch.full((4,), 3e38)  # finite entries whose float32 sum overflows: the exact scan decides
    assert check_tensor(big, "big") is big
