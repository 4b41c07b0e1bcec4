"""Atomic, rotated training-state checkpoints on top of ``Accelerator.save_state``.

A checkpoint ``<output_dir>/checkpoint-<step>`` is written as
``.tmp-checkpoint-<step>``, completed with ``trainer_state.json`` (written
last) and then renamed in one ``os.replace``. Only folders with the final name
*and* the state file count as checkpoints, so a run killed while writing never
leaves one that ``--resume_from_checkpoint latest`` would pick and fail on.
Old checkpoints are renamed away before they are deleted for the same reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil

CHECKPOINT_PREFIX = "checkpoint-"
STATE_FILE = "trainer_state.json"
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def is_complete_checkpoint(path: str) -> bool:
    """True if ``path`` is a ``checkpoint-<step>`` folder holding a readable ``trainer_state.json``."""
    if not _CHECKPOINT_RE.match(os.path.basename(os.path.normpath(path))) or not os.path.isdir(path):
        return False
    try:
        with open(os.path.join(path, STATE_FILE), encoding="utf-8") as fh:
            json.load(fh)
    except (OSError, ValueError):
        return False
    return True


def list_checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """Complete checkpoints in ``output_dir`` as ``(step, path)``, oldest first."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        match = _CHECKPOINT_RE.match(name)
        path = os.path.join(output_dir, name)
        if match and is_complete_checkpoint(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(output_dir: str) -> str | None:
    """Path of the newest complete checkpoint in ``output_dir`` (None if there is none)."""
    found = list_checkpoints(output_dir)
    return found[-1][1] if found else None


def resolve_checkpoint(spec: str, output_dir: str) -> str | None:
    """``latest`` -> newest complete checkpoint in ``output_dir`` (None if none yet); a path -> validated path."""
    if spec == "latest":
        return latest_checkpoint(output_dir)
    if not os.path.isdir(spec):
        raise FileNotFoundError(f"resume_from_checkpoint: {spec!r} is not a folder (pass a checkpoint folder or 'latest')")
    if not os.path.isfile(os.path.join(spec, STATE_FILE)):
        raise ValueError(
            f"resume_from_checkpoint: {spec!r} has no {STATE_FILE}; it is not a complete checkpoint written by this trainer"
        )
    return spec


def read_state(path: str) -> dict:
    """The trainer state stored in a checkpoint."""
    with open(os.path.join(path, STATE_FILE), encoding="utf-8") as fh:
        return json.load(fh)


def _write_json_durable(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())


def _remove(path: str) -> None:
    """Rename ``path`` away (atomic) and delete it."""
    if not os.path.exists(path):
        return
    parent, name = os.path.split(os.path.normpath(path))
    trash = os.path.join(parent, f"{_TRASH_PREFIX}{name}-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def clean_partial(output_dir: str) -> None:
    """Delete leftovers of interrupted writes/deletes (``.tmp-*`` and ``.trash-*`` folders)."""
    if not os.path.isdir(output_dir):
        return
    for name in os.listdir(output_dir):
        if name.startswith((_TMP_PREFIX + CHECKPOINT_PREFIX, _TRASH_PREFIX + CHECKPOINT_PREFIX)):
            shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)


def rotate_checkpoints(output_dir: str, keep: int) -> list[str]:
    """Keep the newest ``keep`` complete checkpoints; return the removed paths."""
    if keep is None:
        return []
    found = list_checkpoints(output_dir)
    removed = [path for _, path in found[: max(0, len(found) - keep)]]
    for path in removed:
        _remove(path)
    return removed


def save_checkpoint(accelerator, output_dir: str, step: int, state: dict, keep: int | None = None) -> str:
    """``accelerator.save_state`` into ``output_dir/checkpoint-<step>`` atomically; every process must call it."""
    final = os.path.join(output_dir, f"{CHECKPOINT_PREFIX}{step}")
    tmp = os.path.join(output_dir, f"{_TMP_PREFIX}{CHECKPOINT_PREFIX}{step}")
    if accelerator.is_main_process:
        os.makedirs(output_dir, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(tmp)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _write_json_durable(os.path.join(tmp, STATE_FILE), {**state, "step": int(step)})
        if os.path.exists(final):
            _remove(final)
        os.replace(tmp, final)
        rotate_checkpoints(output_dir, keep)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, path: str) -> dict:
    """Restore model/optimizer/scheduler/RNG states from ``path`` and return its trainer state."""
    state = read_state(path)
    accelerator.load_state(path)
    return state


__all__ = [
    "CHECKPOINT_PREFIX",
    "STATE_FILE",
    "is_complete_checkpoint",
    "list_checkpoints",
    "latest_checkpoint",
    "resolve_checkpoint",
    "read_state",
    "clean_partial",
    "rotate_checkpoints",
    "save_checkpoint",
    "load_checkpoint",
]
