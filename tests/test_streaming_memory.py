"""The streaming path's memory helpers: blocked ‖aᵀb‖_{1,1} with reused buffers, FFN jobs with a release callback
between blocks, and glibc's malloc_trim wrapper; all give the unblocked numbers exactly."""

import torch

from hf_tdiag._memory import release_free_memory
from hf_tdiag.measures import schatten as S
from hf_tdiag.probes.spectrum_sources import _abs_product_sum, ffn_job


def test_blocked_abs_product_sum_reuses_buffers_and_matches_dense():
    g = torch.Generator().manual_seed(0)
    a, b = (
        torch.randn(8, 1500, generator=g, dtype=torch.float64),
        torch.randn(8, 1500, generator=g, dtype=torch.float64),
    )
    assert S.chunk_rows(1500) < 1500  # the blocked branch
    buffers = {}
    got = _abs_product_sum(a, b, buffers)
    torch.testing.assert_close(got, (a.T @ b).abs().sum(), rtol=1e-13, atol=0)
    assert len(buffers) == 2  # one full-width block buffer and one for the narrower last block, reused across calls
    again = _abs_product_sum(b, a, buffers)
    torch.testing.assert_close(again, (b.T @ a).abs().sum(), rtol=1e-13, atol=0)
    assert len(buffers) == 2


def test_ffn_job_with_release_between_blocks_is_bit_identical():
    g = torch.Generator().manual_seed(1)
    parts = [torch.randn(1200, 1000, generator=g), torch.randn(1200, 1000, generator=g)]  # 2.4M entries: streamed
    calls = []
    plain = ffn_job(parts, "auto")
    released = ffn_job(parts, "auto", release=lambda: calls.append(1))
    assert len(calls) >= 2
    for x, y in zip(plain, released):
        assert torch.equal(x, y)
    # against the dense definition: σ of M = Wᵀ, W = [parts stacked], its column norms and entrywise 1-norm
    W = torch.cat(parts).double()
    torch.testing.assert_close(plain[0], torch.linalg.svdvals(W), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(plain[1], W.norm(dim=1), rtol=1e-12, atol=0)
    torch.testing.assert_close(plain[2], W.abs().sum(), rtol=1e-12, atol=0)


def test_release_free_memory_runs():
    release_free_memory()  # glibc: malloc_trim(0); elsewhere a no-op
