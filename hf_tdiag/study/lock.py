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

__all__ = ["StudyLockedError", "study_lock", "check_unlocked", "LOCK_NAME"]

LOCK_NAME = ".study.lock"


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
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the lock
