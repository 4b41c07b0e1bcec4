"""hf_tdiag._threads.torch_threads: the count inside the block, and the caller's count afterwards."""

import pytest
import torch

from hf_tdiag._threads import torch_threads


def test_sets_and_restores_the_thread_count():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads():  # None leaves the count, but still undoes what the block sets
        assert torch.get_num_threads() == before
        torch.set_num_threads(1)
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="inside"):
        with torch_threads(1):
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before
