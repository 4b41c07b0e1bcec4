"""hf_tdiag.kernels.lapack: SciPy's own dsyrk / dsyevd through ctypes — the same numbers, bit for bit."""

import threading

import numpy as np
import pytest
from scipy.linalg import eigvalsh
from scipy.linalg.blas import dsyrk

from hf_tdiag.kernels import lapack as G


def test_the_cython_routines_are_found():
    assert G._routine("cython_blas", "dsyrk", 10) is not None
    assert G._routine("cython_lapack", "dsyevd", 11) is not None


@pytest.mark.parametrize("order", ["C", "F"])
def test_syrk_accumulate_is_scipys_dsyrk_in_place(order):
    rng = np.random.default_rng(0)
    blocks = [np.asarray(rng.standard_normal((r, 6)), order=order) for r in (5, 1, 9)]
    ref = np.zeros((6, 6), order="F")
    got = np.zeros((6, 6), order="F")
    for b in blocks:
        a, trans = (b.T, 0) if b.flags.c_contiguous else (b, 1)
        ref = dsyrk(1.0, a, beta=1.0, c=ref, trans=trans, lower=0, overwrite_c=1)
        assert G.syrk_accumulate(got, b) is got  # in place
    np.testing.assert_array_equal(np.triu(got), np.triu(ref))
    full = np.concatenate(blocks)
    np.testing.assert_allclose(np.triu(got), np.triu(full.T @ full), rtol=1e-13, atol=1e-13)


def test_symmetric_eigenvalues_is_scipys_evd_from_the_upper_triangle():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 12))
    a = np.asfortranarray(x.T @ x)
    ref = eigvalsh(a.copy(order="F"), lower=False, driver="evd")
    b = a.copy(order="F")
    b[np.tril_indices(12, -1)] = np.nan  # the lower triangle is never read
    got = G.symmetric_eigenvalues(b)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_allclose(got, np.linalg.eigvalsh(a), rtol=1e-12)
    one = np.full((1, 1), 4.0, order="F")
    np.testing.assert_array_equal(G.symmetric_eigenvalues(one), [4.0])


def test_a_c_ordered_matrix_takes_scipys_path():
    a = np.array([[2.0, 1.0], [1.0, 3.0]])  # C-ordered: dsyevd through ctypes needs Fortran order
    np.testing.assert_allclose(G.symmetric_eigenvalues(a), np.linalg.eigvalsh(a), rtol=1e-14)


def test_calls_from_threads_give_the_same_numbers():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 50))
    ref = G.symmetric_eigenvalues(G.syrk_accumulate(np.zeros((50, 50), order="F"), x))
    out = [None] * 4

    def work(i):
        out[i] = G.symmetric_eigenvalues(G.syrk_accumulate(np.zeros((50, 50), order="F"), x))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for o in out:
        np.testing.assert_array_equal(o, ref)
