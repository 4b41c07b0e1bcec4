"""torch's intra-op thread count for the length of a block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ._validation import positive_int


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


SMALL_MODEL_PARAMETERS = 10_000_000


def pick_threads(requested: int | None = None, *, device="cpu", num_parameters: int | None = None) -> int | None:
    """The torch thread count to run with (``None``: leave torch's).

    ``requested`` (a ``--threads`` flag) wins; else an ``OMP_NUM_THREADS`` set in the environment is respected
    (torch already follows it); else one thread for models under ``SMALL_MODEL_PARAMETERS`` on CPU, whose
    small matrix products spend more time synchronising threads than computing (measured: ``hf-tdiag srr``
    on the digits CRATE runs several times faster on one thread than on all cores of a busy machine).
    """
    import os

    if requested is not None:
        return positive_int(requested, "threads")
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    if torch.device(device).type == "cpu" and num_parameters is not None and num_parameters < SMALL_MODEL_PARAMETERS:
        return 1
    return None


def model_threads(requested: int | None, model, device) -> int | None:
    """:func:`pick_threads` for a ``torch.nn.Module`` on ``device``."""
    return pick_threads(requested, device=device, num_parameters=sum(p.numel() for p in model.parameters()))
