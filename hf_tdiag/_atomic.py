"""Atomic file writes: a reader of ``path`` sees the old content or the complete new one, never a partial file.

One guarantee everywhere: the data goes to a temporary file in the same folder, is flushed and fsync'ed, then
``os.replace``s the target, and the folder is fsync'ed (where the OS allows) so the rename survives a crash.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows: folders cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _naming(err: OSError, path: str) -> OSError:
    """``err`` with ``path`` as its file name (the same OSError subclass, from the errno), so the message names it."""
    if err.errno is None:
        return OSError(f"could not write {path!r}: {err}")
    return OSError(err.errno, err.strerror or str(err), path)


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8", newline: str | None = None
) -> Iterator[IO]:
    """``with atomic_open(path) as fh: fh.write(...)``: ``path`` is replaced only when the block succeeds."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode: expected 'w' or 'wb', got {mode!r}")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path!r} is a folder; expected a file path")
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.path.basename(path)}-", dir=directory)
    except OSError as err:
        raise _naming(err, path) from err
    try:
        kwargs = {} if "b" in mode else {"encoding": encoding, "newline": newline}
        with os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
        _fsync_dir(directory)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename is None:
            raise _naming(err, path) from err  # e.g. a full disk: "[Errno 28] No space left on device: 'out/x.json'"
        raise


def write_json(
    path: str | os.PathLike,
    obj: Any,
    *,
    indent: int | None = 2,
    sort_keys: bool = False,
    allow_nan: bool = True,
    default=None,
) -> str:
    """Write ``obj`` as JSON (trailing newline) atomically; return the path. ``default``: as in ``json.dumps``."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, allow_nan=allow_nan, default=default)
    with atomic_open(path) as fh:
        fh.write(text + "\n")
    return os.fspath(path)


def write_text(path: str | os.PathLike, text: str) -> str:
    """Write ``text`` atomically; return the path."""
    with atomic_open(path) as fh:
        fh.write(text)
    return os.fspath(path)


def write_csv(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> str:
    """Rows with possibly different keys as one CSV, atomically: the columns are the union of the keys in
    order of first appearance; a row without a column leaves its cell empty. Return the path."""
    rows = list(rows)
    fields: dict[str, None] = {}
    for row in rows:
        fields.update(dict.fromkeys(row))
    with atomic_open(path, newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields), restval="")
        writer.writeheader()
        writer.writerows(rows)
    return os.fspath(path)


def save_figure(fig, path: str | os.PathLike, dpi: int = 120) -> str:
    """``fig.savefig`` atomically (format from the suffix); return the path."""
    path = os.fspath(path)
    fmt = os.path.splitext(path)[1].lstrip(".") or "png"
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format=fmt, dpi=dpi, bbox_inches="tight")
    return path


STAGE_PREFIX = ".tmp-save-"


@contextlib.contextmanager
def staged_folder(folder: str | os.PathLike, last: tuple[str, ...] = ("config.json",)) -> Iterator[str]:
    """``with staged_folder(out) as stage: model.save_pretrained(stage)``: the files are written into a hidden
    folder inside ``out`` and moved into ``out`` only when the block succeeds, the names in ``last`` (the config,
    which makes a folder look like a model) at the end. A failed write (a full disk) leaves nothing in ``out``: never
    a config without its weights. Any error becomes an OSError naming ``out``."""
    folder = os.fspath(folder)
    try:
        os.makedirs(folder, exist_ok=True)
        stage = tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=folder)
    except OSError as err:
        raise _naming(err, folder) from err
    try:
        try:
            yield stage
        except (ValueError, TypeError):  # a wrong argument, not a failed write
            raise
        except Exception as err:  # a full disk: OSError, torch's RuntimeError, safetensors' SafetensorError
            reason = getattr(err, "strerror", None) or " ".join(str(err).split())[:200]
            raise OSError(f"could not save into {folder!r} ({reason}); nothing was left there") from err
        names = sorted(os.listdir(stage), key=lambda n: (n in last, last.index(n) if n in last else 0, n))
        for name in names:
            target = os.path.join(folder, name)
            if os.path.isdir(target) and not os.path.islink(target):
                raise IsADirectoryError(f"could not save into {folder!r}: {name!r} there is a folder")
            os.replace(os.path.join(stage, name), target)
        _fsync_dir(folder)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
