"""Outputs are owned (issue 45): a command removes or replaces only files an earlier hf-tdiag run recorded writing in
the folder's manifest, never a path given as input; a folder a running job holds is refused; a failed final save
leaves no config without weights. The four cases that lost a user's files, each run as the issue wrote it, leave
those files byte-identical."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from hf_tdiag._outputs import (
    MANIFEST_NAME,
    FolderInUseError,
    ForeignFilesError,
    OutputExistsError,
    check_not_in_use,
    claim_output_dir,
    hold_output_dir,
    owned_entries,
    read_manifest,
    release_output_dir,
)
from hf_tdiag.cli import main as cli_main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tree(root) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes, hf-tdiag's manifest left out."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name != MANIFEST_NAME:
                path = os.path.join(dirpath, name)
                out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


def _user_files(folder, files: dict[str, str]) -> dict[str, bytes]:
    for name, text in files.items():
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
    return _tree(folder)


def _one_line_error(capsys, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


# --------------------------------------------------------------------------------------------- the converter


def _official_digits_checkpoint(seed: int = 0) -> dict[str, torch.Tensor]:
    """A state_dict in the official CRATE layout with the crate-digits sizes (8 px, 1 channel, patch 2, d=64, 4 layers
    of 4 heads of 16, 10 classes)."""
    g = torch.Generator().manual_seed(seed)
    dim, depth, inner, patch_dim, n = 64, 4, 64, 4, 16

    def r(*shape):
        return 0.3 * torch.randn(*shape, generator=g)

    sd = {
        "to_patch_embedding.1.weight": 1 + r(patch_dim),
        "to_patch_embedding.1.bias": r(patch_dim),
        "to_patch_embedding.2.weight": r(dim, patch_dim),
        "to_patch_embedding.2.bias": r(dim),
        "to_patch_embedding.3.weight": 1 + r(dim),
        "to_patch_embedding.3.bias": r(dim),
        "pos_embedding": r(1, n + 1, dim),
        "cls_token": r(1, 1, dim),
        "mlp_head.0.weight": 1 + r(dim),
        "mlp_head.0.bias": r(dim),
        "mlp_head.1.weight": r(10, dim),
        "mlp_head.1.bias": r(10),
    }
    for i in range(depth):
        p = f"transformer.layers.{i}"
        sd[f"{p}.0.norm.weight"], sd[f"{p}.0.norm.bias"] = 1 + r(dim), r(dim)
        sd[f"{p}.0.fn.qkv.weight"] = r(inner, dim)
        sd[f"{p}.0.fn.to_out.0.weight"], sd[f"{p}.0.fn.to_out.0.bias"] = r(dim, inner), r(dim)
        sd[f"{p}.1.norm.weight"], sd[f"{p}.1.norm.bias"] = 1 + r(dim), r(dim)
        sd[f"{p}.1.fn.weight"] = r(dim, dim)
    return sd


def test_convert_official_keeps_its_input_checkpoint_inside_the_output_folder(tmp_path, capsys):
    """Lost case 1: ``convert-official DIR/ck.safetensors --output-dir DIR --overwrite-output-dir`` deleted the input
    as "the previous run's" file. Now the checkpoint stays byte-identical and the conversion is made beside it."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForImageClassification

    folder = tmp_path / "DIR"
    folder.mkdir()
    sd = _official_digits_checkpoint()
    save_file(sd, str(folder / "ck.safetensors"))
    before = (folder / "ck.safetensors").read_bytes()
    argv = ["convert-official", str(folder / "ck.safetensors"), "--preset", "crate-digits", "--output-dir", str(folder)]
    assert cli_main([*argv, "--overwrite-output-dir"]) == 0, capsys.readouterr().err
    assert (folder / "ck.safetensors").read_bytes() == before
    model = AutoModelForImageClassification.from_pretrained(folder)
    assert torch.equal(model.classifier.weight, load_file(str(folder / "ck.safetensors"))["mlp_head.1.weight"])
    # converted again with the flag: the previous conversion is replaced, the input still kept
    assert cli_main([*argv, "--overwrite-output-dir"]) == 0
    assert (folder / "ck.safetensors").read_bytes() == before
    assert {"config.json", "model.safetensors", "preprocessor_config.json"} <= owned_entries(str(folder))
    assert "ck.safetensors" not in owned_entries(str(folder))


def test_convert_official_never_writes_over_its_input(tmp_path, capsys):
    """A checkpoint named like the converted weights (DIR/model.safetensors) would be replaced: refused, kept."""
    from safetensors.torch import save_file

    save_file(_official_digits_checkpoint(), str(tmp_path / "model.safetensors"))
    before = _tree(tmp_path)
    code = cli_main(
        ["convert-official", str(tmp_path / "model.safetensors"), "--preset", "crate-digits", "--output-dir",
         str(tmp_path), "--overwrite-output-dir"]
    )  # fmt: skip
    err = _one_line_error(capsys, code)
    assert "would replace the input" in err and "model.safetensors" in err
    assert _tree(tmp_path) == before


def test_a_failed_final_save_leaves_no_config_without_weights(tmp_path, capsys, monkeypatch):
    """A full disk while the converted model is written: the config written first goes with the failure; the folder
    holds only the user's files, and the error is one line naming the folder."""
    from safetensors.torch import save_file
    from transformers import PreTrainedModel

    save_file(_official_digits_checkpoint(), str(tmp_path / "ck.safetensors"))
    out = tmp_path / "out"
    before = _user_files(out, {"notes.txt": "mine\n"})

    def full_disk(self, save_directory, **kwargs):
        self.config.save_pretrained(save_directory)  # as Transformers does: the config first, then the weights
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    code = cli_main(["convert-official", str(tmp_path / "ck.safetensors"), "--preset", "crate-digits",
                     "--output-dir", str(out)])  # fmt: skip
    err = _one_line_error(capsys, code)
    assert "No space left on device" in err and str(out) in err
    assert _tree(out) == before and not any(n.startswith(".tmp-") for n in os.listdir(out))


# --------------------------------------------------------------------------------------------- the trainer

TINY = [
    "--hidden-size", "16", "--num-hidden-layers", "1", "--num-attention-heads", "2",
    "--per-device-train-batch-size", "32", "--max-train-samples", "64", "--max-eval-samples", "16",
    "--layer-srr-samples", "0", "--disable-tqdm", "--max-train-steps", "2",
]  # fmt: skip


def test_train_into_a_folder_holding_the_users_readme_is_refused(tmp_path, capsys):
    """Lost case 2: the user's README.md was replaced by the model card with exit 0. Refused before any work, with
    or without the flag (a Transformers user's README.md in the output folder is theirs; the model card is written
    only into a folder whose README.md hf-tdiag wrote)."""
    folder = tmp_path / "DIR"
    before = _user_files(folder, {"README.md": "# my project\n", "notes.txt": "notes\n"})
    for extra in ([], ["--overwrite-output-dir"]):
        err = _one_line_error(capsys, cli_main(["train", "--output-dir", str(folder), *TINY, *extra]))
        assert "README.md" in err and "no hf-tdiag run recorded writing" in err and "move them away" in err
        assert _tree(folder) == before and not (folder / MANIFEST_NAME).exists()


def test_train_overwrite_never_removes_an_applications_files(tmp_path, capsys):
    """Lost case 3: with --overwrite-output-dir, an application's config.json and logs/app.log and the user's
    README.md were removed as "the previous run's". Refused, all byte-identical."""
    folder = tmp_path / "DIR"
    before = _user_files(
        folder, {"README.md": "# app\n", "config.json": '{"app": true}\n', "logs/app.log": "started\n"}
    )
    err = _one_line_error(capsys, cli_main(["train", "--output-dir", str(folder), *TINY, "--overwrite-output-dir"]))
    assert all(name in err for name in ("README.md", "config.json", "logs"))
    assert _tree(folder) == before


HOLDER = """
import sys, time
from hf_tdiag.training.args import make_args
from hf_tdiag.training.checkpointing import claim_training_dir
claim_training_dir(make_args(output_dir=sys.argv[1], overwrite_output_dir=True), notify=None)
open(sys.argv[2], "w").close()
time.sleep(120)
"""


def test_a_second_training_into_a_folder_a_running_training_holds_is_refused(tmp_path, capsys):
    """Lost case 4: a second ``train --overwrite-output-dir`` into the folder a first training still writes. The first
    is a process that claimed the folder as the trainer does (the trainer's own claim) and is still running."""
    folder, ready = tmp_path / "DIR", tmp_path / "ready"
    first = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), str(folder), str(ready)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    try:
        deadline = time.time() + 60
        while not ready.exists():
            assert first.poll() is None and time.time() < deadline, "the first job did not start"
            time.sleep(0.05)
        (folder / "checkpoint-2").mkdir()  # what the first run is writing
        before = _tree(folder)
        err = _one_line_error(capsys, cli_main(["train", "--output-dir", str(folder), *TINY, "--overwrite-output-dir"]))
        assert "in use by another running hf-tdiag job" in err and f"pid {first.pid}" in err
        assert _tree(folder) == before and (folder / "checkpoint-2").is_dir()
        # every writing command is refused there, not only the trainer
        torch.save(_official_digits_checkpoint(), tmp_path / "ck.pth")
        code = cli_main(["convert-official", str(tmp_path / "ck.pth"), "--preset", "crate-digits",
                         "--output-dir", str(folder), "--overwrite-output-dir"])  # fmt: skip
        assert "in use by another running hf-tdiag job" in _one_line_error(capsys, code)
        assert _tree(folder) == before
        # the other processes of a distributed run only check: their main process holds the lock
        from hf_tdiag.training.args import make_args
        from hf_tdiag.training.checkpointing import claim_training_dir

        args = make_args(output_dir=str(folder), overwrite_output_dir=True)
        assert claim_training_dir(args, is_main=False, notify=None) is None
        assert _tree(folder) == before
    finally:
        first.kill()  # SIGKILL
        first.wait()
    check_not_in_use(folder)  # the lock went with the killed process: the folder is free again


def test_a_training_records_what_it_wrote_and_a_second_run_replaces_only_that(tmp_path, capsys):
    """The trainer's manifest lists its files; --overwrite-output-dir removes those and keeps the user's, including
    a user's file added later under a name hf-tdiag does not write."""
    folder = tmp_path / "run"
    assert cli_main(["train", "--output-dir", str(folder), *TINY, "--checkpointing-steps", "1"]) == 0
    runs, problem = read_manifest(str(folder))
    assert problem is None and len(runs) == 1 and runs[0]["finished"]
    assert {"config.json", "model.safetensors", "all_results.json", "README.md", "checkpoint-2"} <= set(
        runs[0]["written"]
    )
    (folder / "my_notes.md").write_text("keep me\n")
    first = _tree(folder)
    assert cli_main(["train", "--output-dir", str(folder), *TINY, "--overwrite-output-dir", "--seed", "5"]) == 0
    after = _tree(folder)
    assert after["my_notes.md"] == b"keep me\n"
    assert not any(k.startswith("checkpoint-") for k in after)  # the first run's checkpoints went
    assert after["model.safetensors"] != first["model.safetensors"]
    # the folder is free once train() returned: the manifest holds two finished runs
    assert [bool(r["finished"]) for r in read_manifest(str(folder))[0]] == [True, True]


def test_a_users_edit_of_a_written_file_makes_it_the_users(tmp_path):
    """A file hf-tdiag wrote and the user changed since (an edited model card) is no longer replaced."""
    folder = tmp_path / "out"
    hold_output_dir(str(folder), ["README.md", "srr.json"])
    (folder / "README.md").write_text("card\n")
    (folder / "srr.json").write_text("{}\n")
    release_output_dir(str(folder))
    assert owned_entries(str(folder)) == {"README.md", "srr.json"}
    (folder / "README.md").write_text("card, edited by hand with more words\n")
    assert owned_entries(str(folder)) == {"srr.json"}
    with pytest.raises(ForeignFilesError, match="README.md"):
        claim_output_dir(folder, ["README.md"], overwrite=True, notify=None)


def test_a_killed_runs_files_are_owned_by_pattern(tmp_path):
    """A run killed before it finished its record: what matches its patterns and was not there before is its own;
    a user's file that was there before it started is not."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "schatten_user.json").write_text("mine\n")
    hold_output_dir(str(folder), ["schatten*.json"])
    (folder / "schatten_run.json").write_text("{}\n")
    from hf_tdiag import _outputs

    held = _outputs._HELD.pop(os.path.realpath(str(folder)))  # as if killed: the record is never finished
    os.close(held["fd"])
    assert read_manifest(str(folder))[0][-1]["written"] is None
    assert owned_entries(str(folder)) == {"schatten_run.json"}


def test_a_folder_an_older_hf_tdiag_wrote_is_not_removed_and_the_message_says_why(tmp_path):
    """No manifest (an hf-tdiag before issue 45): its model is not removed even with the flag; the message names the
    files and says there is no manifest. Measuring commands may still add their files beside it."""
    folder = tmp_path / "old"
    before = _user_files(folder, {"config.json": "{}", "model.safetensors": "w", "all_results.json": "{}"})
    with pytest.raises(ForeignFilesError) as info:
        claim_output_dir(folder, overwrite=True, model_output=True, notify=None)
    assert f"no {MANIFEST_NAME}" in str(info.value) and "config.json" in str(info.value)
    assert _tree(folder) == before
    with pytest.raises(OutputExistsError, match="--overwrite-output-dir"):  # without the flag: as before
        claim_output_dir(folder, ["srr.json"], notify=None)
    lines = []
    claim_output_dir(folder, ["srr.json"], overwrite=True, notify=lines.append)
    assert _tree(folder) == before and any("left in" in line for line in lines)


def test_a_damaged_manifest_owns_nothing(tmp_path):
    folder = tmp_path / "out"
    before = _user_files(folder, {"srr.json": "{}"})
    (folder / MANIFEST_NAME).write_text('{"runs": [')
    with pytest.raises(ForeignFilesError, match="cannot be read"):
        claim_output_dir(folder, ["srr.json"], overwrite=True, notify=None)
    (folder / MANIFEST_NAME).write_text(json.dumps({"kind": "something else", "runs": []}))
    with pytest.raises(ForeignFilesError, match="not an hf-tdiag output manifest"):
        claim_output_dir(folder, ["srr.json"], overwrite=True, notify=None)
    assert _tree(folder) == before


def test_a_path_given_as_input_inside_the_folder_is_never_removed(tmp_path):
    """Even listed in a manifest (an earlier run wrote it), a file given as this run's input stays."""
    folder = tmp_path / "out"
    hold_output_dir(str(folder), ["srr.json", "layer_srr.json"])
    (folder / "srr.json").write_text("{}\n")
    (folder / "layer_srr.json").write_text("[]\n")
    release_output_dir(str(folder))
    removed = claim_output_dir(
        folder, ["srr.json"], overwrite=True, inputs=[str(folder / "layer_srr.json")], stale=["*srr*.json"], notify=None
    )
    assert removed == ["srr.json"] and (folder / "layer_srr.json").read_text() == "[]\n"


def test_a_running_study_holds_its_folder_against_every_writing_command(tmp_path):
    from hf_tdiag.study.lock import study_lock

    with study_lock(str(tmp_path / "study")):
        code = subprocess.run(
            [sys.executable, "-c", "import sys; from hf_tdiag._outputs import claim_output_dir as c; "
             "c(sys.argv[1], ['srr.json'])", str(tmp_path / "study")],
            cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert code.returncode == 1 and "FolderInUseError" in code.stderr and "a running study" in code.stderr
    assert FolderInUseError.__mro__[1] is OutputExistsError  # the recipes' one-line handler catches it


def test_the_trainers_failed_final_save_leaves_no_model_looking_folder(tmp_path, capsys, monkeypatch):
    from transformers import PreTrainedModel

    def full_disk(self, save_directory, **kwargs):
        self.config.save_pretrained(save_directory)
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 128 vs 0")  # torch's words

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    folder = tmp_path / "run"
    err = _one_line_error(capsys, cli_main(["train", "--output-dir", str(folder), *TINY]))
    assert "could not save the trained model" in err and str(folder) in err
    assert not (folder / "config.json").exists() and not any(n.startswith(".tmp-") for n in os.listdir(folder))
