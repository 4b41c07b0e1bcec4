"""CPU kernels under the measures: what torch lacks, and how small batched linear algebra runs fastest.

The measures in :mod:`hf_tdiag.measures` are tensor math and set nothing process-wide; where the fastest way to
run a step is a property of the step itself, it is a kernel here:

* :mod:`.gram` — the one-triangle Gram matrix by BLAS ``syrk`` and NumPy's non-zero count;
* :mod:`.lapack` — SciPy's ``dsyrk`` / ``dsyevd`` through ctypes, releasing the GIL;
* :mod:`.small` — batched factorizations of small matrices (Cholesky, triangular solves, ``eigvalsh``, QR's R,
  singular values), always at one thread: each matrix is too small to split, and threads waiting for each other
  are what collapses on a busy machine.

How many threads the large products of a diagnostic use is decided once, at the diagnostic's entry
(:func:`hf_tdiag.diagnostics.entry.diagnostic_entry`, the ``threads`` kind of its declaration).
"""
