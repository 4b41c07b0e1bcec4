"""Atomic, rotated training-state checkpoints on top of ``Accelerator.save_state``.

A checkpoint ``<output_dir>/checkpoint-<step>`` is written as
``.tmp-checkpoint-<step>``, completed with ``trainer_state.json`` (written
last) and then renamed in one ``os.replace``. Only folders with the final name
*and* the state file count as checkpoints, so a run killed while writing never
leaves one that ``--resume-from-checkpoint latest`` would pick and fail on. A checkpoint damaged later (a
truncated or edited ``trainer_state.json``) is never silently ignored: ``latest`` falls back to the newest
intact one and says so, or stops with an error naming the damaged files.
Old checkpoints are renamed away before they are deleted for the same reason.

Each run has a ``run_id`` stored in its checkpoints' state: rotation deletes only the current run's checkpoints,
and a resumed run keeps the id of the checkpoint it resumed. The state also records the settings the run trains
with (:func:`training_settings`); resuming with a different value of one of them is refused
(:func:`changed_settings`), since the restored optimizer and schedule would keep the old value while the tracker
config and the model card recorded the new one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
import warnings
from collections.abc import Callable

from .._atomic import STAGE_PREFIX, write_json

CHECKPOINT_PREFIX = "checkpoint-"
STATE_FILE = "trainer_state.json"
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


REQUIRED_STATE_KEYS = ("completed_steps", "epoch", "batches_in_epoch")
RUN_ID_KEY = "run_id"
SETTINGS_KEY = "settings"
# arguments that may differ on resume: where and how often things are written or logged, evaluation-only sizes,
# and the resume/overwrite flags themselves; every other argument is part of what the checkpoint trained with
RESUME_MAY_CHANGE = frozenset(
    {
        "output_dir",
        "overwrite_output_dir",
        "resume_from_checkpoint",
        "checkpointing_steps",
        "checkpoints_total_limit",
        "with_tracking",
        "report_to",
        "logging_steps",
        "disable_tqdm",
        "push_to_hub",
        "hub_model_id",
        "hub_token",
        "hub_private_repo",
        "dataloader_num_workers",
        "num_threads",
        "per_device_eval_batch_size",
        "layer_srr_samples",
        "print_results",
        "func",
        "command",
    }
)


def new_run_id() -> str:
    """A fresh run id (12 hex digits)."""
    return uuid.uuid4().hex[:12]


def _plain(value):
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def training_settings(args) -> dict:
    """The arguments a checkpoint fixes (every one not in :data:`RESUME_MAY_CHANGE`), JSON-ready."""
    return {k: _plain(v) for k, v in sorted(vars(args).items()) if k not in RESUME_MAY_CHANGE}


def changed_values(stored: dict, now: dict, may_change=frozenset()) -> list[str]:
    """``name: stored value -> value now`` for each key of both whose value differs, save those that ``may_change``."""
    return [
        f"{k}: {stored[k]!r} -> {now[k]!r}"
        for k in sorted(stored)
        if k in now and k not in may_change and stored[k] != now[k]
    ]


def changed_settings(state: dict, args) -> list[str]:
    """``name: checkpoint value -> given value`` for each stored setting ``args`` changes (empty for a checkpoint
    written before settings were stored)."""
    stored = state.get(SETTINGS_KEY)
    if not isinstance(stored, dict):
        return []
    return changed_values(stored, training_settings(args))


def state_problem(path: str) -> str | None:
    """Why the checkpoint folder ``path`` cannot be resumed from (its state file is missing, unreadable,
    truncated or lacks a counter), naming the file; None when it can."""
    file = os.path.join(path, STATE_FILE)
    try:
        with open(file, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return f"{file!r} is missing"
    except OSError as err:
        return f"{file!r} cannot be read ({err.strerror or err})"
    except ValueError as err:
        return f"{file!r} is not valid JSON, probably truncated ({err})"
    if not isinstance(data, dict):
        return f"{file!r} holds a JSON {type(data).__name__}, not the trainer state object"
    missing = [k for k in REQUIRED_STATE_KEYS if k not in data]
    if missing:
        return f"{file!r} lacks the key(s) {missing}"
    bad = [k for k in REQUIRED_STATE_KEYS if isinstance(data[k], bool) or not isinstance(data[k], int) or data[k] < 0]
    if bad:
        return f"{file!r} has invalid {', '.join(f'{k}={data[k]!r}' for k in bad)} (expected non-negative integers)"
    return None


def is_complete_checkpoint(path: str) -> bool:
    """True if ``path`` is a ``checkpoint-<step>`` folder holding a readable, complete ``trainer_state.json``."""
    if not _CHECKPOINT_RE.match(os.path.basename(os.path.normpath(path))) or not os.path.isdir(path):
        return False
    return state_problem(path) is None


def _checkpoint_folders(output_dir: str) -> list[tuple[int, str]]:
    """Every ``checkpoint-<step>`` folder in ``output_dir``, complete or not, as ``(step, path)``, oldest first."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        match = _CHECKPOINT_RE.match(name)
        path = os.path.join(output_dir, name)
        if match and os.path.isdir(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def list_checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """Complete checkpoints in ``output_dir`` as ``(step, path)``, oldest first."""
    return [(step, path) for step, path in _checkpoint_folders(output_dir) if state_problem(path) is None]


def latest_checkpoint(output_dir: str) -> str | None:
    """Path of the newest complete checkpoint in ``output_dir`` (None if there is none)."""
    found = list_checkpoints(output_dir)
    return found[-1][1] if found else None


def _resolve_latest(output_dir: str, notify: Callable[[str], None]) -> str | None:
    damaged = []
    for _, path in reversed(_checkpoint_folders(output_dir)):
        problem = state_problem(path)
        if problem is None:
            if damaged:
                notify(
                    f"resume_from_checkpoint=latest: skipping damaged checkpoint(s): {'; '.join(damaged)}; "
                    f"resuming from {path!r}, the newest intact checkpoint"
                )
            return path
        damaged.append(problem)
    if damaged:
        raise ValueError(
            f"resume_from_checkpoint=latest: no intact checkpoint in {output_dir!r}: {'; '.join(damaged)}. "
            "Remove the damaged folder(s) to train from scratch, or pass a checkpoint folder explicitly"
        )
    return None


def resolve_checkpoint(spec: str, output_dir: str, notify: Callable[[str], None] | None = None) -> str | None:
    """``latest`` -> newest intact checkpoint in ``output_dir`` (None when there is no checkpoint folder at all;
    damaged newer ones are skipped with a message through ``notify``, default ``warnings.warn``; an error when
    every checkpoint is damaged); a path -> that folder, validated."""
    if spec == "latest":
        return _resolve_latest(output_dir, notify or (lambda text: warnings.warn(text, UserWarning, stacklevel=3)))
    if not os.path.isdir(spec):
        raise FileNotFoundError(
            f"resume_from_checkpoint: {spec!r} is not a folder (pass a checkpoint folder or 'latest')"
        )
    problem = state_problem(spec)
    if problem is not None:
        raise ValueError(
            f"resume_from_checkpoint: {spec!r} is not a complete checkpoint written by this trainer: {problem}"
        )
    return spec


def read_state(path: str) -> dict:
    """The trainer state stored in a checkpoint; ValueError naming the file when it is damaged."""
    problem = state_problem(path)
    if problem is not None:
        raise ValueError(f"checkpoint state: {problem}")
    with open(os.path.join(path, STATE_FILE), encoding="utf-8") as fh:
        return json.load(fh)


def _remove(path: str) -> None:
    """Rename ``path`` away (atomic) and delete it."""
    if not os.path.exists(path):
        return
    parent, name = os.path.split(os.path.normpath(path))
    trash = os.path.join(parent, f"{_TRASH_PREFIX}{name}-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def clean_partial(output_dir: str) -> None:
    """Delete leftovers of interrupted writes/deletes (``.tmp-checkpoint-*``, ``.trash-checkpoint-*`` and the final
    save's ``.tmp-save-*`` folders)."""
    if not os.path.isdir(output_dir):
        return
    for name in os.listdir(output_dir):
        if name.startswith((_TMP_PREFIX + CHECKPOINT_PREFIX, _TRASH_PREFIX + CHECKPOINT_PREFIX, STAGE_PREFIX)):
            shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)


def run_id_of(path: str) -> str | None:
    """The run id stored in a checkpoint's state (None for a checkpoint written before run ids, or damaged)."""
    try:
        with open(os.path.join(path, STATE_FILE), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data.get(RUN_ID_KEY) if isinstance(data, dict) else None


def rotate_checkpoints(output_dir: str, keep: int, run_id: str | None = None) -> list[str]:
    """Keep the newest ``keep`` complete checkpoints (of the run ``run_id`` only, when given: another run's
    checkpoints are never deleted); return the removed paths."""
    if keep is None:
        return []
    found = list_checkpoints(output_dir)
    if run_id is not None:
        found = [(step, path) for step, path in found if run_id_of(path) == run_id]
    removed = [path for _, path in found[: max(0, len(found) - keep)]]
    for path in removed:
        _remove(path)
    return removed


def save_checkpoint(accelerator, output_dir: str, step: int, state: dict, keep: int | None = None) -> str:
    """``accelerator.save_state`` into ``output_dir/checkpoint-<step>`` atomically; every process must call it.
    Rotation (``keep``) counts only the checkpoints of ``state["run_id"]`` when the state has one. A failed write
    (a full disk) is an OSError naming the checkpoint folder; the torn ``.tmp-`` folder is removed."""
    final = os.path.join(output_dir, f"{CHECKPOINT_PREFIX}{step}")
    tmp = os.path.join(output_dir, f"{_TMP_PREFIX}{CHECKPOINT_PREFIX}{step}")
    if accelerator.is_main_process:
        os.makedirs(output_dir, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(tmp)
    except (OSError, RuntimeError) as err:  # torch reports a full disk as an inline_container RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        reason = getattr(err, "strerror", None) or " ".join(str(err).split())[:200]
        raise OSError(f"checkpoint: could not write {final!r} ({reason}); free space or choose another folder") from err
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_json(os.path.join(tmp, STATE_FILE), {**state, "step": int(step)})
        if os.path.exists(final):
            _remove(final)
        os.replace(tmp, final)
        rotate_checkpoints(output_dir, keep, state.get(RUN_ID_KEY))
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, path: str) -> dict:
    """Restore model/optimizer/scheduler/RNG states from ``path`` and return its trainer state."""
    state = read_state(path)
    accelerator.load_state(path)
    return state


def _inside(path: str, folder: str) -> bool:
    return os.path.dirname(os.path.abspath(os.path.normpath(path))) == os.path.abspath(folder)


def claim_training_dir(args, *, is_main: bool = True, notify: Callable[[str], None] | None = print) -> str | None:
    """Before any work: refuse an output folder another running job holds, or that holds another run's model,
    checkpoints or results unless ``args.overwrite_output_dir`` (then the previous run's files that the folder's
    manifest lists are removed; files no hf-tdiag run recorded writing, a user's README.md or config.json, are
    refused even with the flag), and check it can be written. Resuming from a checkpoint inside the folder
    continues that run, so its files are not another run's; a resume whose settings differ from the checkpoint's
    (:func:`changed_settings`) is refused. On the main process the folder is then held (locked, recorded in its
    manifest) until :func:`hf_tdiag._outputs.release_output_dir`. Returns the checkpoint resumed from (None for a
    fresh run)."""
    from .._outputs import (
        MODEL_PATTERNS,
        RESULT_PATTERNS,
        TRAIN_PATTERNS,
        check_not_in_use,
        check_writable,
        claim_output_dir,
        hold_output_dir,
    )

    output_dir = os.fspath(args.output_dir)
    if is_main:  # a folder another training is writing: say so before reading its checkpoints (the other
        check_not_in_use(output_dir)  # processes of this run skip it: their main process takes the lock)
    inputs = [getattr(args, k, None) for k in ("model_name_or_path", "train_dir", "validation_dir", "dataset_path")]
    inputs = [p for p in inputs if isinstance(p, (str, os.PathLike)) and os.path.exists(p)]
    spec = getattr(args, "resume_from_checkpoint", None)
    if spec == "latest":
        runs = sorted({str(run_id_of(p)) for _, p in list_checkpoints(output_dir)} - {"None"})
        if len(runs) > 1:
            raise ValueError(
                f"resume_from_checkpoint=latest: {output_dir!r} holds checkpoints of {len(runs)} different runs "
                f"({', '.join(runs)}); pass the checkpoint folder to resume explicitly"
            )
    path = resolve_checkpoint(spec, output_dir, notify=lambda text: None) if spec else None  # resume() reports
    if path is not None:
        changed = changed_settings(read_state(path), args)
        if changed:
            raise ValueError(
                f"resume_from_checkpoint: {path!r} was trained with other settings ({'; '.join(changed)}); the "
                "restored optimizer and schedule would keep the checkpoint's values. Resume with the same settings, "
                f"or start a new run (another --output-dir, or --overwrite-output-dir without --resume-from-checkpoint)"
            )
        if _inside(path, output_dir):
            if is_main:
                check_writable(output_dir)
                hold_output_dir(output_dir, TRAIN_RECORDS)
            return path
        inputs.append(path)
    claim_output_dir(
        output_dir,
        overwrite=bool(getattr(args, "overwrite_output_dir", False)),
        inputs=inputs,
        stale=(*TRAIN_PATTERNS, *MODEL_PATTERNS, *RESULT_PATTERNS),
        model_output=True,
        notify=notify,
        remove=is_main,
        check_lock=is_main,
        records=TRAIN_RECORDS,
    )
    return path


# what a training run writes into its folder (its record in the folder's manifest)
TRAIN_RECORDS = (
    "config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "preprocessor_config.json",
    "README.md",
    "all_results.json",
    "srr_history.json",
    "layer_srr.*",
    "logs",
    "configuration_*.py",
    "modeling_*.py",
    "image_processing_*.py",
    "checkpoint-*",
)


__all__ = [
    "CHECKPOINT_PREFIX",
    "RUN_ID_KEY",
    "SETTINGS_KEY",
    "RESUME_MAY_CHANGE",
    "changed_settings",
    "changed_values",
    "claim_training_dir",
    "new_run_id",
    "run_id_of",
    "training_settings",
    "STATE_FILE",
    "is_complete_checkpoint",
    "state_problem",
    "REQUIRED_STATE_KEYS",
    "list_checkpoints",
    "latest_checkpoint",
    "resolve_checkpoint",
    "read_state",
    "clean_partial",
    "rotate_checkpoints",
    "save_checkpoint",
    "load_checkpoint",
]
