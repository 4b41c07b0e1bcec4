"""The Space's default model: a small CRATE trained on scikit-learn's 8×8 digits on first use, cached on disk.

``ensure_default_model(variant)`` returns the folder of a ``save_pretrained`` model, training it with
:func:`hf_tdiag.training.train` (the project's digits recipe, short budget) the first time. The cache lives in
``$HF_TDIAG_CACHE`` (default ``~/.cache/hf_tdiag``); a file lock makes concurrent callers (threads or processes)
train once, and the finished folder appears atomically (a killed training leaves nothing half-written behind).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

CACHE_ENV = "HF_TDIAG_CACHE"
RECIPE_VERSION = 1
_thread_lock = threading.Lock()


def cache_root() -> Path:
    """``$HF_TDIAG_CACHE`` or ``~/.cache/hf_tdiag``."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "hf_tdiag")
    return Path(root)


def default_model_dir(variant: str = "crate", cache: str | os.PathLike | None = None) -> Path:
    """Folder the default model of ``variant`` is (or will be) saved in."""
    from hf_tdiag.models.crate import CRATE_VARIANTS

    if variant not in CRATE_VARIANTS:
        raise ValueError(f"variant: expected one of {list(CRATE_VARIANTS)}, got {variant!r}")
    root = Path(cache) if cache is not None else cache_root()
    return root / f"default-digits-{variant}-r{RECIPE_VERSION}"


def is_complete(folder: Path) -> bool:
    """True when ``folder`` holds a finished model (config, weights and processor)."""
    return all((folder / name).is_file() for name in ("config.json", "model.safetensors", "preprocessor_config.json"))


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with _thread_lock, open(path, "a+") as handle:
        try:
            import fcntl
        except ImportError:  # non-POSIX: the thread lock is all we have
            yield
            return
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def digits_test_images(limit: int | None = None):
    """Held-out digits as PIL images (mode ``L``) and their labels, in the form the digits recipe trains on."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    idx = np.arange(len(digits.target))[-360:]
    if limit is not None:
        idx = idx[:limit]
    images = [Image.fromarray(np.clip(digits.images[i] * 16, 0, 255).astype(np.uint8), mode="L") for i in idx]
    return images, [int(digits.target[i]) for i in idx]
