"""hf_tdiag.kernels.gram: the one-triangle Gram by BLAS syrk and NumPy's non-zero count, against torch."""

import importlib

import pytest
import torch

from hf_tdiag._threads import torch_threads

K = importlib.import_module("hf_tdiag.kernels.gram")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(3, 197, 160), (2, 160, 197), (2, 2, 300, 150)])
def test_lower_gram_is_the_smaller_side_gram_lower_triangle(shape, dtype):
    A = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    n, m = shape[-2:]
    ref = (A.double().mT @ A.double()) if n >= m else (A.double() @ A.double().mT)  # naive, in float64
    with torch_threads(1):
        G = K.lower_gram(A)
    assert G is not None and G.dtype == dtype and G.shape == ref.shape
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert float((G.double() - ref.tril()).abs().max() / ref.abs().max()) < tol
    assert bool((G.triu(1) == 0).all())  # only the lower triangle is written


def test_lower_gram_declines_where_torch_is_the_right_call():
    A = torch.randn(4, 197, 160)
    with torch_threads(1):
        assert K.lower_gram(torch.randn(5, 64, 64)) is None  # too small per matrix for a call each
        assert K.lower_gram(A.to(torch.bfloat16)) is None
        assert K.lower_gram(A.clone().requires_grad_()) is None  # the gradient path stays in torch
        with torch.no_grad():
            assert K.lower_gram(A.clone().requires_grad_()) is not None
    with torch_threads(2):
        assert K.lower_gram(A) is None  # torch's threaded matmul where more than one thread runs


def test_count_nonzero_equals_torch():
    Z = torch.relu(torch.randn(3, 2, 100, 80, generator=torch.Generator().manual_seed(2)))
    Z[0, 1] = 0.0
    got = K.count_nonzero(Z)
    assert got.dtype == torch.float64 and got.shape == (3, 2)
    assert torch.equal(got, torch.count_nonzero(Z, dim=(-2, -1)).double())
    assert float(got[0, 1]) == 0.0
    assert K.count_nonzero(torch.ones(4, 8, 8)) is None  # small samples: torch
    assert K.count_nonzero(Z.half()) is None


def test_srr_through_the_kernels_equals_the_torch_path(monkeypatch):
    from hf_tdiag.measures import sparse_rate_reduction

    g = torch.Generator().manual_seed(3)
    Z = torch.relu(torch.randn(4, 197, 192, generator=g))
    U = torch.linalg.qr(torch.randn(3, 192, 64, generator=g))[0]
    with torch_threads(1):
        fast = sparse_rate_reduction(Z, U)
        monkeypatch.setattr(K, "_applies", lambda A: False)
        monkeypatch.setattr(K, "_MIN_COUNT_ELEMENTS", 1 << 60)
        plain = sparse_rate_reduction(Z, U)
    assert torch.allclose(fast, plain, rtol=1e-6, atol=0)


def test_lower_gram_edges_one_matrix_square_and_the_work_threshold():
    g = torch.Generator().manual_seed(3)
    with torch_threads(1):
        one = torch.randn(300, 150, generator=g, dtype=torch.float64)  # a single matrix (no batch dimension)
        assert torch.allclose(K.lower_gram(one), (one.mT @ one).tril(), rtol=0, atol=1e-10)
        square = torch.randn(2, 170, 170, generator=g, dtype=torch.float64)  # not symmetric: AᵀA ≠ AAᵀ
        ref = (square.mT @ square).tril()
        assert not torch.allclose(ref, (square @ square.mT).tril())
        assert torch.allclose(K.lower_gram(square), ref, rtol=0, atol=1e-10)
        at = torch.randn(1, 1024, 64, generator=g, dtype=torch.float64)  # 64·64·1024 = 2^22: exactly the threshold
        assert 64 * 64 * 1024 == K._MIN_SYRK_WORK and K.lower_gram(at) is not None
        assert K.lower_gram(torch.randn(1, 1023, 64, dtype=torch.float64)) is None  # one row under it
        assert K.lower_gram(torch.randn(5000)) is None  # a vector has no Gram matrix here


def test_count_nonzero_edges_one_matrix_the_threshold_and_float64():
    z = torch.relu(torch.randn(64, 64, generator=torch.Generator().manual_seed(4)))  # 4096 = the threshold
    assert z.numel() == K._MIN_COUNT_ELEMENTS
    got = K.count_nonzero(z)
    assert got is not None and got.shape == () and got.dtype == torch.float64
    assert float(got) == float(torch.count_nonzero(z))
    assert K.count_nonzero(z[:, :63]) is None  # under it: torch's count
    batch = K.count_nonzero(torch.stack([z, z * 0]))
    assert batch.dtype == torch.float64 and batch.tolist() == [float(torch.count_nonzero(z)), 0.0]
