"""``hf-tdiag pretrain``'s output folder follows every writing command's rule (hf_tdiag._outputs): locked while a run
holds it, another run's files refused without ``--overwrite-output-dir``, and with it only what the manifest lists
as written by hf-tdiag is removed; a user's files are never touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from script_files import REPO, folder_bytes

from hf_tdiag._outputs import (
    MANIFEST_NAME,
    FolderInUseError,
    ForeignFilesError,
    OutputExistsError,
    check_not_in_use,
    read_manifest,
)
from hf_tdiag.cli import main as cli_main
from hf_tdiag.training.simdino import pretrain
from hf_tdiag.training.simdino.args import PretrainSettings
from hf_tdiag.training.simdino.outputs import BACKBONE_DIR, RESULTS_FILE, claim_pretrain_dir

TINY = dict(
    objective="dino", backbone="vit-digits", max_train_steps=2, batch_size=16, warmup_steps=1, n_local=1,
    hidden_dim=16, bottleneck_dim=8, out_dim=12, track_every=0, probe=False,
)  # fmt: skip


def _flags(settings: dict) -> list[str]:
    flags = []
    for key, value in settings.items():
        flags += [f"--{key.replace('_', '-')}", str(value).lower()]
    return flags


def _one_line_error(capsys, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def _write(folder, name: str, text: str) -> None:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_rerun_with_overwrite_removes_only_what_the_earlier_run_wrote(tmp_path, capsys):
    folder = tmp_path / "run"
    _write(folder, "notes.txt", "mine, there before the first run")  # a user's file never blocks a run
    # SimDINO, 3 steps, a checkpoint after steps 1 and 2 of which the last one is kept
    kept = dict(TINY, objective="simdino", max_train_steps=3, checkpointing_steps=1, checkpoints_total_limit=1)
    first = pretrain(dict(kept, output_dir=str(folder)))
    assert (RESULTS_FILE, BACKBONE_DIR) == ("pretrain_results.json", "backbone")
    assert sorted(os.listdir(folder)) == sorted(
        [MANIFEST_NAME, "notes.txt", "backbone", "checkpoint-2", "pretrain_results.json"]
    )
    (record,) = read_manifest(str(folder))[0]
    assert sorted(record["written"]) == ["backbone", "checkpoint-2", "pretrain_results.json"]
    # resuming in the folder continues that run there (its outputs are not another run's): no flag needed
    resumed = pretrain(dict(kept, output_dir=str(folder), resume_from_checkpoint="latest"))
    assert resumed["resumed_from"] == str(folder / "checkpoint-2") and resumed["losses"] == first["losses"]
    _write(folder, "later.txt", "mine, added after it")
    _write(folder, "checkpoint-7/keep.txt", "mine, under a name a run writes")
    before = folder_bytes(folder)

    with pytest.raises(OutputExistsError, match="--overwrite-output-dir"):
        pretrain(dict(TINY, output_dir=str(folder), seed=1))
    capsys.readouterr()
    code = cli_main(["pretrain", "--output-dir", str(folder), *_flags(dict(TINY, seed=1))])
    assert "already holds another run's" in _one_line_error(capsys, code)
    assert folder_bytes(folder) == before  # refused: nothing changed

    code = cli_main(["pretrain", "--output-dir", str(folder), *_flags(dict(TINY, seed=1)), "--overwrite-output-dir"])
    assert code == 0
    assert sorted(os.listdir(folder)) == sorted(
        [MANIFEST_NAME, "notes.txt", "later.txt", "checkpoint-7", "backbone", "pretrain_results.json"]
    )  # checkpoint-2 (the first run's, unlisted by the second) removed; checkpoint-7 (the user's) kept
    after = folder_bytes(folder)
    for name in ("notes.txt", "later.txt", "checkpoint-7/keep.txt"):
        assert after[name] == before[name]
    second = json.loads((folder / "pretrain_results.json").read_text())
    assert second["settings"]["seed"] == 1 and second["losses"] != first["losses"]
    # continuing from this run's backbone into its own folder would replace the input: refused, even with the flag
    before = folder_bytes(folder)
    with pytest.raises(ValueError, match="would replace the input"):
        pretrain(dict(TINY, output_dir=str(folder), backbone=str(folder / "backbone"), overwrite_output_dir=True))
    assert folder_bytes(folder) == before


def test_overwrite_must_be_a_bool(tmp_path):
    with pytest.raises(TypeError, match="overwrite_output_dir: expected True or False, got 'yes'"):
        PretrainSettings(output_dir=str(tmp_path), overwrite_output_dir="yes")


def test_a_users_backbone_folder_is_never_replaced(tmp_path):
    folder = tmp_path / "run"
    _write(folder, "backbone/README.md", "my own model, not a pretraining's")
    before = folder_bytes(folder)
    for overwrite in (False, True):
        with pytest.raises(ForeignFilesError, match="backbone, which no hf-tdiag run recorded writing"):
            pretrain(dict(TINY, output_dir=str(folder), overwrite_output_dir=overwrite))
        assert folder_bytes(folder) == before and not (folder / MANIFEST_NAME).exists()


HOLDER_FLAGS = dict(TINY, max_train_steps=10**6, objective="simdino")  # runs until killed


def test_a_second_run_into_a_folder_a_running_pretraining_holds_is_refused(tmp_path, capsys):
    folder = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "hf_tdiag.cli", "pretrain", "--output-dir", str(folder), *_flags(HOLDER_FLAGS)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while not any(r.get("pid") == first.pid for r in read_manifest(str(folder))[0]):
            assert first.poll() is None and time.time() < deadline, "the first pretraining did not start"
            time.sleep(0.1)
        before = folder_bytes(folder)
        with pytest.raises(FolderInUseError, match=f"pid {first.pid}"):
            pretrain(dict(TINY, output_dir=str(folder)))
        for extra in ([], ["--overwrite-output-dir"]):
            code = cli_main(["pretrain", "--output-dir", str(folder), *_flags(TINY), *extra])
            assert "in use by another running hf-tdiag job" in _one_line_error(capsys, code)
        assert folder_bytes(folder) == before
        # the other processes of a distributed run only check the folder: their main process holds it
        settings = PretrainSettings(**TINY, output_dir=str(folder), overwrite_output_dir=True)
        assert claim_pretrain_dir(settings, is_main=False) is None
        assert folder_bytes(folder) == before
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()
        first.wait()
    check_not_in_use(folder)  # the lock went with the killed process
