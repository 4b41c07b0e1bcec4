import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test: tiny tensors, and OpenMP oversubscription costs more on a shared 2-core machine."""
    from hf_tdiag._threads import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
