"""In-place BLAS ``dsyrk`` and LAPACK ``dsyevd`` (values only) that release the GIL.

SciPy's f2py wrappers ``scipy.linalg.blas.dsyrk`` and ``scipy.linalg.eigvalsh`` hold the GIL for the whole
Fortran call, so the thread pool of :func:`hf_tdiag.schatten_bounds` ran its FFN jobs one at a time. The same
routines of the same library are reached here through SciPy's ``cython_blas`` / ``cython_lapack`` function
pointers, called by :mod:`ctypes` (which releases the GIL around a foreign call): the same arithmetic (bit for
bit), in place, without the GIL. Where those pointers cannot be had, SciPy's wrappers are used.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

try:  # loaded with this module, so thread limits set later (threadpoolctl) see SciPy's BLAS library
    from scipy.linalg import cython_blas as _cython_blas
    from scipy.linalg import cython_lapack as _cython_lapack
except ImportError:  # pragma: no cover - SciPy is a dependency
    _cython_blas = _cython_lapack = None

__all__ = ["syrk_accumulate", "symmetric_eigenvalues"]


@functools.cache
def _routine(module: str, name: str, num_args: int):
    """``name`` of ``scipy.linalg.<module>`` as a ctypes function of ``num_args`` pointers, or None."""
    try:
        capsule = {"cython_blas": _cython_blas, "cython_lapack": _cython_lapack}[module].__pyx_capi__[name]
        get_name = ctypes.pythonapi.PyCapsule_GetName
        get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        return ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * num_args))(get_pointer(capsule, get_name(capsule)))
    except (ImportError, KeyError, AttributeError, TypeError, ValueError):
        return None


def _int(v: int):
    return ctypes.byref(ctypes.c_int(v))


def _double(v: float):
    return ctypes.byref(ctypes.c_double(v))


def _char(c: bytes):
    return ctypes.c_char_p(c)


def syrk_accumulate(gram: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``gram += xᵀx`` on the upper triangle (``gram`` Fortran-ordered ``(n, n)`` float64, ``x (r, n)`` float64).

    Returns ``gram`` (the same array, updated in place; a new one only on SciPy's fallback)."""
    n, r = gram.shape[0], x.shape[0]
    dsyrk = _routine("cython_blas", "dsyrk", 10)
    if dsyrk is None:
        from scipy.linalg.blas import dsyrk as scipy_dsyrk

        a, trans = (x.T, 0) if x.flags.c_contiguous else (np.asfortranarray(x), 1)
        return scipy_dsyrk(1.0, a, beta=1.0, c=gram, trans=trans, lower=0, overwrite_c=1)
    if x.flags.c_contiguous:  # Fortran reads it as xᵀ (n × r): C += A Aᵀ
        trans, lda = b"N", n
    else:  # a Fortran-ordered copy (r × n): C += Aᵀ A
        x, trans, lda = np.asfortranarray(x), b"T", r
    one = _double(1.0)
    dsyrk(_char(b"U"), _char(trans), _int(n), _int(r), one, x.ctypes.data, _int(lda), one, gram.ctypes.data, _int(n))
    return gram


def symmetric_eigenvalues(a: np.ndarray) -> np.ndarray:
    """Eigenvalues, ascending, of the symmetric float64 ``a (n, n)`` given by its upper triangle (Fortran-ordered;
    overwritten): LAPACK ``dsyevd`` with the workspace it asks for (as ``scipy.linalg.eigvalsh(driver="evd")``)."""
    n = a.shape[0]
    dsyevd = _routine("cython_lapack", "dsyevd", 11)
    if dsyevd is None or not a.flags.f_contiguous:
        from scipy.linalg import eigvalsh

        return eigvalsh(a, lower=False, overwrite_a=True, check_finite=False, driver="evd")
    w = np.empty(n)
    info = ctypes.c_int(0)
    query, iquery = np.empty(1), np.empty(1, dtype=np.int32)
    args = (_char(b"N"), _char(b"U"), _int(n), a.ctypes.data, _int(max(1, n)), w.ctypes.data)
    dsyevd(*args, query.ctypes.data, _int(-1), iquery.ctypes.data, _int(-1), ctypes.byref(info))
    lwork, liwork = max(1, int(query[0])), max(1, int(iquery[0]))
    work, iwork = np.empty(lwork), np.empty(liwork, dtype=np.int32)
    dsyevd(*args, work.ctypes.data, _int(lwork), iwork.ctypes.data, _int(liwork), ctypes.byref(info))
    if info.value != 0:
        raise np.linalg.LinAlgError(f"dsyevd: the eigenvalue iteration did not converge (info={info.value})")
    return w
