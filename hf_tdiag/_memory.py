"""Hand freed heap memory back to the operating system between the streaming paths' blocks (glibc ``malloc_trim``).

glibc raises its mmap threshold to the size of the last freed block (up to 32 MiB), so a loop that allocates and frees
blocks of a few MiB (a float64 copy of 8 MiB of a weight matrix, its absolute values, a read tensor) is served from
the heap after the first one, and the freed parts of the heap stay resident: the streaming Schatten path's peak
grew to several times the largest layer's weights on a decoder. ``malloc_trim(0)`` returns every free page
(also inside the heap); elsewhere than glibc this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["release_free_memory"]


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return None if libc is None else libc.malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    """``malloc_trim(0)`` where the C library is glibc; nothing elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
