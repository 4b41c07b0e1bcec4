"""torch's intra-op thread count for the length of a block."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def torch_threads(n: int | None = None) -> Iterator[None]:
    """Set ``torch.set_num_threads(n)`` for the block (``None``: leave it) and restore the caller's
    count afterwards, also on errors and whatever the block itself set."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
