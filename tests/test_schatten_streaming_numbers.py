"""The streamed spectra of measures/schatten.py against NumPy on the whole matrix: chunk_rows' budget arithmetic by
hand, the streamed Gram's upper triangle, the TSQR factor's RᵀR = AᵀA and σ(R) = σ(A), and streamed_singular_values
for several chunk sizes (one row, a non-divisor of the row count, more than all rows), tall and wide matrices,
bf16/fp16/fp32/fp64 blocks, both routes (Gram eigenvalues vs TSQR + SVD) and the rule that picks between them,
observed through the number of passes over the blocks."""

import numpy as np
import pytest
import torch

from hf_tdiag.measures import schatten as S

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
STEPS = [1, 3, 10**6]  # one row per block; 3 does not divide the row counts used below; more rows than the matrix


def _matrix(rows, cols, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g, dtype=torch.float64).to(dtype)


def _blocks(a, step):
    return [a[i : i + step] for i in range(0, a.shape[0], step)]


def _passes(a, step):
    """make_chunks for a's row blocks of ``step`` rows, and the list counting how often it was called (= passes)."""
    calls = []

    def make_chunks():
        calls.append(1)
        return iter(_blocks(a, step))

    return make_chunks, calls


def _np(a):
    return a.to(torch.float64).numpy()  # bf16/fp16/fp32 → float64 is exact: the reference sees the same numbers


def _with_spectrum(sigma, rows, seed=0):
    """A (rows, len(sigma)) float64 matrix U diag(σ) Vᵀ with random orthonormal U, V: its singular values are σ."""
    g = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(rows, len(sigma), generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(len(sigma), len(sigma), generator=g, dtype=torch.float64))[0]
    return u @ torch.diag(torch.tensor(sigma, dtype=torch.float64)) @ v.T


# ----------------------------------------------------------------------------------------- chunk_rows


def test_chunk_rows_is_the_entry_budget_over_the_columns_at_least_one():
    assert S.chunk_rows(10, 100) == 10  # 100 entries of a 10-column matrix: 10 rows
    assert S.chunk_rows(10, 109) == 10  # floor division
    assert S.chunk_rows(10, 9) == 1  # budget below one row: still one row
    assert S.chunk_rows(10, 15) == 1  # budget of one and a half rows: one row, not two
    assert S.chunk_rows(1, 7) == 7  # a one-column matrix: one row per entry
    assert S.chunk_rows(0, 7) == 7  # no columns counts as one
    assert S.CHUNK_ENTRIES == 2**20
    assert S.chunk_rows(3) == 349525  # default budget: 2^20 // 3
    assert S.chunk_rows(1024) == 1024
    assert S.chunk_rows(2**21) == 1


# ----------------------------------------------------------------------------------------- streamed_gram


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("rows, cols", [(7, 4), (4, 7)])  # tall, and wide (every block narrower than the Gram)
def test_streamed_gram_upper_triangle_is_numpys_gram(dtype, step, rows, cols):
    a = _matrix(rows, cols, dtype)
    seen = []
    gram = S.streamed_gram(iter(_blocks(a, step)), seen.append)
    assert gram.dtype == torch.float64 and gram.shape == (cols, cols)
    ref = _np(a).T @ _np(a)
    np.testing.assert_allclose(np.triu(gram.numpy()), np.triu(ref), rtol=1e-13, atol=1e-13)
    assert all(c.dtype == torch.float64 for c in seen)  # on_chunk sees every block once, as float64
    np.testing.assert_array_equal(torch.cat(seen).numpy(), _np(a))


def test_streamed_gram_of_non_contiguous_blocks():
    """Blocks that are transposed views (Fortran-ordered in NumPy) take the copying branch of dsyrk: same Gram."""
    w = _matrix(5, 9, torch.float64, seed=3)  # a = wᵀ (9, 5); its row blocks are column blocks of w, transposed
    blocks = [w[:, j : j + 4].T for j in range(0, 9, 4)]
    assert not blocks[0].is_contiguous()
    ref = w.numpy() @ w.numpy().T
    np.testing.assert_allclose(np.triu(S.streamed_gram(iter(blocks)).numpy()), np.triu(ref), rtol=1e-13, atol=1e-13)


# ----------------------------------------------------------------------------------------- streamed_r_factor


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("step", STEPS)
def test_streamed_r_factor_is_an_r_of_the_whole_matrix(dtype, step):
    a = _matrix(11, 4, dtype, seed=1)
    seen = []
    r = S.streamed_r_factor(iter(_blocks(a, step)), seen.append)
    assert r.dtype == torch.float64 and r.shape == (4, 4)
    np.testing.assert_array_equal(np.tril(r.numpy(), -1), 0.0)  # upper triangular
    np.testing.assert_allclose(r.numpy().T @ r.numpy(), _np(a).T @ _np(a), rtol=1e-12, atol=1e-12)  # RᵀR = AᵀA
    ref = np.linalg.svd(_np(a), compute_uv=False)
    np.testing.assert_allclose(torch.linalg.svdvals(r).numpy(), ref, rtol=1e-12)
    np.testing.assert_array_equal(torch.cat(seen).numpy(), _np(a))


# ----------------------------------------------------------------------------------------- streamed_singular_values


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("step", STEPS)
def test_streamed_singular_values_default_route_is_numpys_svd_in_one_pass(dtype, step):
    a = _matrix(13, 5, dtype, seed=2)  # a Gaussian 13×5: condition number well below 1000, the Gram route
    make_chunks, calls = _passes(a, step)
    seen = []
    sigma = S.streamed_singular_values(make_chunks, on_chunk=seen.append)  # the default method is "auto"
    np.testing.assert_allclose(sigma.numpy(), np.linalg.svd(_np(a), compute_uv=False), rtol=1e-10)
    assert len(calls) == 1  # the Gram is read in a single pass
    np.testing.assert_array_equal(torch.cat(seen).numpy(), _np(a))


@pytest.mark.parametrize("step", STEPS)
def test_streamed_singular_values_svd_route_is_numpys_svd_in_one_pass(step):
    a = _matrix(13, 5, torch.float32, seed=4)
    make_chunks, calls = _passes(a, step)
    seen = []
    sigma = S.streamed_singular_values(make_chunks, "svd", seen.append)
    ref = np.linalg.svd(_np(a), compute_uv=False)
    np.testing.assert_allclose(sigma.numpy(), ref, rtol=1e-12)
    assert len(calls) == 1  # TSQR only: no Gram pass first
    np.testing.assert_array_equal(torch.cat(seen).numpy(), _np(a))
    auto = S.streamed_singular_values(_passes(a, step)[0], "auto")
    np.testing.assert_allclose(auto.numpy(), sigma.numpy(), rtol=1e-10)  # the two routes agree


def test_streamed_singular_values_of_a_wide_matrix_streams_its_transpose():
    """A wide W (4×9) is streamed as row blocks of the tall Wᵀ (9×4), the way the probes do: σ(Wᵀ) = σ(W)."""
    w = _matrix(4, 9, torch.float16, seed=5)
    make_chunks = lambda: iter([w[:, j : j + 2].mT for j in range(0, 9, 2)])
    sigma = S.streamed_singular_values(make_chunks)
    np.testing.assert_allclose(sigma.numpy(), np.linalg.svd(_np(w), compute_uv=False), rtol=1e-10)


@pytest.mark.parametrize("step", [1, 3, 100])
def test_ill_conditioned_large_matrix_goes_to_tsqr_and_keeps_its_small_values(step):
    """σ from 1e3 down to 1e-3 (condition number 1e6): the Gram would lose the small values (relative error ~eps·κ²
    ~ 1e-4); the rule σ_min² ≥ 1e-6 σ_max² refuses it and the second (TSQR) pass returns them to ~1e-9."""
    sigma = [1e3, 3.0, 1.0, 0.1, 1e-3]
    a = _with_spectrum(sigma, 17, seed=6)
    make_chunks, calls = _passes(a, step)
    seen = []
    got = S.streamed_singular_values(make_chunks, on_chunk=seen.append)
    np.testing.assert_allclose(got.numpy(), sigma, rtol=1e-9)
    assert len(calls) == 2  # Gram pass, refused, then the TSQR pass
    assert len(seen) == len(_blocks(a, step))  # on_chunk saw the first pass only


def test_one_dominant_value_is_judged_against_the_largest():
    """σ = (1e4, 1, 1): σ_min²/σ₁² = 1e-8 < 1e-6, so TSQR (although σ_min²/σ₂² = 1)."""
    a = _with_spectrum([1e4, 1.0, 1.0], 9, seed=7)
    make_chunks, calls = _passes(a, 4)
    got = S.streamed_singular_values(make_chunks)
    np.testing.assert_allclose(got.numpy(), [1e4, 1.0, 1.0], rtol=1e-11)
    assert len(calls) == 2


def test_well_conditioned_small_matrix_stays_on_the_gram_route():
    """A Gram whose eigenvalues are all below 1 (σ ≤ 0.5) but within the condition limit: one pass."""
    sigma = [0.5, 0.2, 0.05]
    make_chunks, calls = _passes(_with_spectrum(sigma, 8, seed=8), 3)
    np.testing.assert_allclose(S.streamed_singular_values(make_chunks).numpy(), sigma, rtol=1e-10)
    assert len(calls) == 1


def test_condition_limit_is_inclusive():
    """σ = (1, 1e-3): σ_min² = 1e-6 σ_max² exactly (0.001·0.001 == 1e-6 in float64): the Gram is kept, one pass."""
    assert 0.001 * 0.001 == S.GRAM_MIN_RATIO * 1.0
    a = torch.tensor([[1.0, 0.0], [0.0, 0.001], [0.0, 0.0]], dtype=torch.float64)
    make_chunks, calls = _passes(a, 2)
    np.testing.assert_allclose(S.streamed_singular_values(make_chunks).numpy(), [1.0, 0.001], rtol=1e-15)
    assert len(calls) == 1


@pytest.mark.parametrize("method", ["auto", "svd"])
def test_one_column_matrix_has_its_norm_as_singular_value(method):
    a = _matrix(6, 1, torch.float32, seed=9)
    sigma = S.streamed_singular_values(_passes(a, 4)[0], method)
    np.testing.assert_allclose(sigma.numpy(), [np.linalg.norm(_np(a))], rtol=1e-13)


@pytest.mark.parametrize("method", ["auto", "svd"])
def test_zero_matrix_has_zero_singular_values(method):
    sigma = S.streamed_singular_values(_passes(torch.zeros(5, 3, dtype=torch.float16), 2)[0], method)
    np.testing.assert_array_equal(sigma.numpy(), np.zeros(3))


def test_unknown_method_is_named():
    with pytest.raises(ValueError, match="method: expected 'auto' or 'svd', got 'gram'"):
        S.streamed_singular_values(_passes(torch.ones(3, 2), 1)[0], "gram")


# ----------------------------------------------------------------------------------------- numbers given as lists


def test_python_lists_are_read_as_float64_numbers():
    """An int beyond int64 is still a number; None becomes NaN and is refused as such (not as a non-numeric list)."""
    assert float(S.norm_1_1([[2**64, 1]])) == 2.0**64 + 1
    np.testing.assert_allclose(S.singular_values([[3, 0], [0, 4]]).numpy(), [4.0, 3.0], rtol=1e-15)
    with pytest.raises(ValueError, match=r"matrix: contains NaN or inf values \(shape \(1, 2\)\)"):
        S.norm_1_1([[1.0, None]])
