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


# the short recipe: small enough for seconds-to-a-minute on a CPU, good enough for meaningful attention maps
DEFAULT_TRAIN_KWARGS = dict(
    preset="crate-digits",
    num_train_epochs=30,
    per_device_train_batch_size=64,
    seed=0,
    layer_srr_samples=0,
    disable_tqdm=False,
)


def ensure_default_model(
    variant: str = "crate",
    *,
    cache: str | os.PathLike | None = None,
    force: bool = False,
    threads: int | None = 1,
    **train_overrides,
) -> Path:
    """Folder of the default digits CRATE of ``variant``; trains and caches it on first use.

    ``train_overrides`` change the short recipe (:data:`DEFAULT_TRAIN_KWARGS`, flags of
    :func:`hf_tdiag.training.train`) — e.g. ``max_train_steps`` for a quicker model in tests. ``threads``: torch
    intra-op threads while training (restored afterwards); the 50k-parameter model trains fastest on one thread,
    and far faster than with several on a busy machine. ``None`` leaves the setting alone.
    """
    target = default_model_dir(variant, cache)
    if is_complete(target) and not force:
        return target
    with _file_lock(target.parent / f".{target.name}.lock"):
        if is_complete(target) and not force:  # another process finished it while we waited
            return target
        from hf_tdiag._threads import torch_threads
        from hf_tdiag.training import train

        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            kwargs = {**DEFAULT_TRAIN_KWARGS, **train_overrides, "variant": variant, "output_dir": str(work)}
            with torch_threads(None if threads is None else int(threads)):
                train(**kwargs)
            if not is_complete(work):
                raise RuntimeError(f"default model: training finished but {work} has no complete model")
            for name in os.listdir(work):  # keep only the model folder contents, not checkpoints
                if name.startswith("checkpoint") or name.startswith("step_"):
                    shutil.rmtree(work / name, ignore_errors=True)
            if target.exists():
                shutil.rmtree(target)
            os.replace(work, target)  # atomic on one filesystem: a reader sees all or nothing
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    return target


__all__ = [
    "CACHE_ENV",
    "DEFAULT_TRAIN_KWARGS",
    "cache_root",
    "default_model_dir",
    "ensure_default_model",
    "is_complete",
]
