"""One study per folder: an exclusive lock on ``<study_dir>/.study.lock`` for as long as a study runs.

The lock is an OS file lock (``fcntl.flock`` on POSIX, ``msvcrt.locking`` on Windows)
on an open file, so the kernel releases it when the holder exits for any reason,
``kill -9`` included: a stale lock never blocks a restarted study. The file holds
the holder's pid and start time, only to make the refusal message useful.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
from collections.abc import Iterator

__all__ = [
    "LOCK_NAME",
    "OUTPUT_LOCK_NAME",
    "StudyLockedError",
    "acquire_folder",
    "check_unlocked",
    "folder_held_elsewhere",
    "study_lock",
]

LOCK_NAME = ".study.lock"
# what a study writes into its folder (its record in the folder's manifest, hf_tdiag._outputs)
STUDY_RECORDS = ("study.json", "table.*", "runs.csv", "*.png", "runs", "work")


class StudyLockedError(RuntimeError):
    """Another study is running in the same study folder."""


def _try_lock(fd: int) -> bool:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def _locked_error(study_dir: str, path: str) -> StudyLockedError:
    return StudyLockedError(
        f"study_dir: {study_dir!r} is in use by another running study ({_holder(path)}); wait for it to "
        f"finish, stop it, or use another output folder (--output-dir)"
    )


def check_unlocked(study_dir: str) -> None:
    """:class:`StudyLockedError` if a running study holds the folder's lock; creates and writes nothing."""
    path = os.path.join(study_dir, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:  # no study ever ran here
        return
    try:
        if not _try_lock(fd):
            raise _locked_error(study_dir, path)
    finally:
        os.close(fd)  # releases the lock taken for the check


@contextlib.contextmanager
def study_lock(study_dir: str) -> Iterator[str]:
    """Hold the study folder's lock for the block; :class:`StudyLockedError` if another study holds it."""
    os.makedirs(study_dir, exist_ok=True)
    path = os.path.join(study_dir, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _try_lock(fd):
            raise _locked_error(study_dir, path)
        started = datetime.datetime.now().isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode())
        from .._outputs import hold_output_dir, release_output_dir

        hold_output_dir(study_dir, STUDY_RECORDS)  # what the study writes goes into the folder's manifest
        try:
            yield path
        finally:
            release_output_dir(study_dir)
    finally:
        os.close(fd)  # closing the descriptor releases the lock


# --------------------------------------------------------------------------------------------- output folders
# Every writing command holds its output folder for as long as it runs (hf_tdiag._outputs.claim_output_dir): on
# POSIX an flock on the folder itself (no file is added), elsewhere on ``OUTPUT_LOCK_NAME`` inside it. Like the
# study lock, the kernel releases it when the holder exits, kill -9 included.
OUTPUT_LOCK_NAME = ".hf-tdiag.lock"


def _open_folder_lock(folder: str, create: bool) -> int | None:
    """A descriptor to lock ``folder`` with (None when there is nothing to lock: no lock file and ``create`` false)."""
    if os.name == "posix":
        return os.open(folder, os.O_RDONLY)
    path = os.path.join(folder, OUTPUT_LOCK_NAME)
    try:
        return os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    except FileNotFoundError:
        return None


def acquire_folder(folder: str) -> int | None:
    """Lock the existing ``folder`` for this process; the descriptor holding the lock (close it to release), or
    None when another process holds it."""
    fd = _open_folder_lock(folder, create=True)
    if _try_lock(fd):
        return fd
    os.close(fd)
    return None


def folder_held_elsewhere(folder: str) -> str | None:
    """Which kind of job holds ``folder`` (``"study"`` or ``"job"``), None when no other process does; creates and
    writes nothing. A folder this process holds counts as held elsewhere (flock is per open file), so callers
    skip the folders they hold themselves."""
    if not os.path.isdir(folder):
        return None
    try:
        check_unlocked(folder)
    except StudyLockedError:
        return "study"
    fd = _open_folder_lock(folder, create=False)
    if fd is None:
        return None
    try:
        return None if _try_lock(fd) else "job"
    finally:
        os.close(fd)
