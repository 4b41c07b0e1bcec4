"""The pretraining folder, claimed before any work as every writing command claims its folder
(:func:`hf_tdiag._outputs.claim_output_dir`): refused while another job holds it, refused when it holds another run's
backbone, results or checkpoints unless ``--overwrite-output-dir`` (which removes only what the folder's manifest
lists as written by hf-tdiag: a user's files stay), then locked and recorded in its manifest until the run ends.
Resuming from a checkpoint inside the folder continues that run in it."""

from __future__ import annotations

import os

from .args import PretrainSettings

RESULTS_FILE = "pretrain_results.json"
BACKBONE_DIR = "backbone"
PRETRAIN_OUTPUTS = (RESULTS_FILE, BACKBONE_DIR)
# what a pretraining run writes into its folder (its record in the folder's manifest)
PRETRAIN_RECORDS = (*PRETRAIN_OUTPUTS, "checkpoint-*")


def _inside(path: str, folder: str) -> bool:
    return os.path.dirname(os.path.abspath(os.path.normpath(path))) == os.path.abspath(folder)


# settings that may differ on resume: where and how often checkpoints are written, what is recorded along the way
# (the held-out tracking) and after the run (the probe); every other one is part of what the checkpoint trained with
RESUME_MAY_CHANGE = frozenset(
    {"output_dir", "overwrite_output_dir", "resume_from_checkpoint", "checkpointing_steps",
     "checkpoints_total_limit", "track_every", "track_samples", "probe"}
)  # fmt: skip


def check_resume_settings(s: PretrainSettings, path: str) -> None:
    """Refuse to resume from the checkpoint ``path`` with settings other than those it was trained with (save
    :data:`RESUME_MAY_CHANGE`): the restored optimizer, teacher and schedule position would mix two runs."""
    from ..checkpointing import changed_values, read_state

    stored = read_state(path).get("settings")
    changed = changed_values(stored, s.to_dict(), RESUME_MAY_CHANGE) if isinstance(stored, dict) else []
    if changed:
        raise ValueError(
            f"resume_from_checkpoint: {path!r} was trained with other settings ({'; '.join(changed)}); resume with "
            "the same settings, or start a new run (another --output-dir, or --overwrite-output-dir without "
            "--resume-from-checkpoint)"
        )


def claim_pretrain_dir(s: PretrainSettings, *, is_main: bool) -> str | None:
    """Hold ``s.output_dir`` for this run (the other processes of a distributed run only check it); return the
    checkpoint to resume from (None for a fresh run: no ``--resume-from-checkpoint``, or ``latest`` in a folder
    without a checkpoint)."""
    from ..._outputs import check_not_in_use, check_writable, claim_output_dir, hold_output_dir
    from ..checkpointing import resolve_checkpoint

    folder = os.fspath(s.output_dir)
    if is_main:  # a folder another job writes: say so before reading its checkpoints
        check_not_in_use(folder)
    path = resolve_checkpoint(s.resume_from_checkpoint, folder) if s.resume_from_checkpoint else None
    if path is not None:
        check_resume_settings(s, path)
    if path is not None and _inside(path, folder):
        if is_main:
            check_writable(folder)
            hold_output_dir(folder, PRETRAIN_RECORDS)
        return path
    claim_output_dir(
        folder,
        PRETRAIN_OUTPUTS,
        overwrite=bool(s.overwrite_output_dir),
        inputs=[p for p in (s.backbone, path) if p is not None and os.path.isdir(p)],
        stale=("checkpoint-*",),  # with PRETRAIN_OUTPUTS: PRETRAIN_RECORDS, the run's record
        remove=is_main,
        check_lock=is_main,
    )
    return path


__all__ = [
    "BACKBONE_DIR",
    "PRETRAIN_OUTPUTS",
    "PRETRAIN_RECORDS",
    "RESULTS_FILE",
    "RESUME_MAY_CHANGE",
    "check_resume_settings",
    "claim_pretrain_dir",
]
