"""Never lose a user's work, never measure a wrong number quietly (issue 29), the fast part: output folders
(refused, overwritten, inputs never replaced, unwritable folders found first), checkpoint rotation and resume per
run, image files read by their real range and orientation, device strings, failed writes naming the file, model
labels that stay apart, study folders of another grid. Each table row is one input a user might give; the
command-line and training runs that check the same rules end to end are in tests/test_never_lose_work.py (slow)."""

from __future__ import annotations

import argparse
import errno
import json
import os

import numpy as np
import pytest
from PIL import Image

from hf_tdiag import _atomic
from hf_tdiag._cli_args import device as device_type
from hf_tdiag._outputs import (
    MANIFEST_NAME,
    OutputExistsError,
    claim_output_dir,
    hold_output_dir,
    recognised_entries,
    release_output_dir,
)
from hf_tdiag.inputs import UserInputError, open_image, to_pil
from hf_tdiag.training import checkpointing as ck


def _tree(root) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (to prove nothing changed)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if name != MANIFEST_NAME:  # hf-tdiag's record of what it wrote
                out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


def _listing(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n != MANIFEST_NAME)


def _fill(folder, *names) -> None:
    """Write ``names`` into ``folder``; those prefixed ``run:`` as an earlier hf-tdiag run would (its manifest
    records them), the others as a user would (no record)."""
    os.makedirs(folder, exist_ok=True)
    by_run = [n[4:] for n in names if n.startswith("run:")]
    if by_run:
        hold_output_dir(str(folder), [n.rstrip("/") for n in by_run])
        _fill(folder, *by_run)
        release_output_dir(str(folder))
    for name in (n for n in names if not n.startswith("run:")):
        if name.endswith("/"):
            os.makedirs(os.path.join(folder, name), exist_ok=True)
        else:
            with open(os.path.join(folder, name), "w") as fh:
                fh.write(f"old {name}\n")


# ----------------------------------------------------------------------------------------- output folders

# (case, files in the folder, writes, overwrite, expected: "ok" or the error text, files left afterwards)
CLAIM_CASES = [
    ("new folder", None, ["srr.json"], False, "ok", []),
    ("empty folder", [], ["srr.json"], False, "ok", []),
    ("only a user's own file", ["notes.txt"], ["srr.json"], False, "ok", ["notes.txt"]),
    ("a model", ["config.json", "model.safetensors"], ["srr.json"], False, "config.json, model.safetensors", None),
    ("checkpoints", ["checkpoint-23/", "checkpoint-30/"], ["srr.json"], False, "checkpoint-23, checkpoint-30", None),
    ("own results", ["run:srr.json", "run:srr.png"], ["srr.json", "srr.png"], False, "srr.json, srr.png", None),
    ("another command's results", ["report.html"], ["srr.json"], False, "report.html", None),
    (
        "own results, overwrite",
        ["run:srr.json", "run:srr.png", "notes.txt"],
        ["srr.json", "srr.png"],
        True,
        "ok",
        ["notes.txt"],
    ),
    ("others' results, overwrite", ["report.html"], ["srr.json"], True, "ok", ["report.html"]),
    (
        "a model, overwrite",
        ["config.json", "model.safetensors"],
        ["srr.json"],
        True,
        "ok",
        ["config.json", "model.safetensors"],
    ),
]


@pytest.mark.parametrize("case, files, writes, overwrite, expected, left", CLAIM_CASES, ids=[c[0] for c in CLAIM_CASES])
def test_output_folder_is_refused_or_claimed(tmp_path, case, files, writes, overwrite, expected, left):
    folder = tmp_path / "out"
    if files is not None:
        _fill(folder, *files)
    before = _tree(folder) if folder.exists() else {}
    lines = []
    if expected != "ok":
        with pytest.raises(OutputExistsError) as info:
            claim_output_dir(folder, writes, overwrite=overwrite, notify=lines.append)
        message = str(info.value)
        assert expected in message and "--overwrite-output-dir" in message and str(folder) in message
        assert _tree(folder) == before  # nothing touched
        return
    claim_output_dir(folder, writes, overwrite=overwrite, notify=lines.append)
    assert folder.is_dir()
    assert _listing(folder) == sorted(left)
    for name in left:  # what stays is untouched, and a recognised one left behind is listed
        assert (folder / name).read_text() == f"old {name}\n"
        if name in recognised_entries(str(folder)):
            assert any(name in line and "left in" in line for line in lines)


def test_training_overwrite_removes_the_previous_runs_files_and_keeps_a_users_own(tmp_path):
    folder = tmp_path / "run"
    _fill(
        folder,
        "run:config.json",
        "run:model.safetensors",
        "run:README.md",
        "run:all_results.json",
        "run:report.html",
        "run:layer_srr.json",
        "run:main_job.json",
        "run:modeling_crate.py",
        "run:checkpoint-5/",
        "run:logs/",
        "notes.txt",
    )
    from hf_tdiag._outputs import MODEL_PATTERNS, RESULT_PATTERNS, TRAIN_PATTERNS

    lines = []
    removed = claim_output_dir(
        folder,
        overwrite=True,
        model_output=True,
        notify=lines.append,
        stale=(*TRAIN_PATTERNS, *MODEL_PATTERNS, *RESULT_PATTERNS),
    )
    assert _listing(folder) == ["notes.txt"]
    assert "checkpoint-5" in removed and "report.html" in removed and "main_job.json" in removed
    assert any("removed the previous run's" in line for line in lines)


# (case, input given, output file written in that folder) -> refused even with --overwrite-output-dir
INPUT_CASES = [
    ("report page beside a model: its JSON is config.json", "model", "config.json"),
    ("the weights", "model", "model.safetensors"),
    ("a file given as input", "texts.txt", "texts.txt"),
]


@pytest.mark.parametrize("case, given, name", INPUT_CASES, ids=[c[0] for c in INPUT_CASES])
def test_an_output_never_replaces_an_input(tmp_path, case, given, name):
    _fill(tmp_path / "model", "config.json", "model.safetensors")
    _fill(tmp_path, "texts.txt")
    folder = tmp_path / "model" if given == "model" else tmp_path
    before = _tree(tmp_path)
    with pytest.raises(ValueError, match="would replace") as info:
        claim_output_dir(folder, [name], overwrite=True, inputs=[str(tmp_path / given)])
    assert name in str(info.value)
    assert _tree(tmp_path) == before


def test_a_measurement_may_go_beside_the_model_it_measures(tmp_path):
    model = tmp_path / "model"
    _fill(model, "config.json", "model.safetensors", "all_results.json", "checkpoint-4/")
    before = _tree(model)
    claim_output_dir(model, ["report.html", "report.json"], inputs=[str(model)])  # the model is the input
    assert _tree(model) == before
    _fill(model, "run:report.html")  # an earlier report of it is another run's result
    with pytest.raises(OutputExistsError, match="report.html"):
        claim_output_dir(model, ["report.html", "report.json"], inputs=[str(model)])
    claim_output_dir(model, ["report.html", "report.json"], inputs=[str(model)], overwrite=True)
    assert _listing(model) == ["all_results.json", "checkpoint-4", "config.json", "model.safetensors"]


def test_a_new_model_never_replaces_its_own_input_model(tmp_path):
    _fill(tmp_path / "base", "config.json", "model.safetensors")
    with pytest.raises(ValueError, match="is also the input model folder"):
        claim_output_dir(tmp_path / "base", overwrite=True, model_output=True, inputs=[str(tmp_path / "base")])


@pytest.mark.parametrize("where", ["below a file", "an existing file"])
def test_an_unwritable_output_folder_is_found_before_any_work(tmp_path, where):
    (tmp_path / "afile").write_text("x")
    folder = tmp_path / "afile" / "sub" if where == "below a file" else tmp_path / "afile"
    with pytest.raises(ValueError) as info:
        claim_output_dir(folder, ["srr.json"])
    assert str(folder) in str(info.value)


# ----------------------------------------------------------------------------------------- checkpoints per run


def _checkpoint(root, step, run_id=None, settings=None):
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    state = {"completed_steps": step, "epoch": 0, "batches_in_epoch": step, "step": step}
    if run_id is not None:
        state["run_id"] = run_id
    if settings is not None:
        state["settings"] = settings
    (path / ck.STATE_FILE).write_text(json.dumps(state))
    return str(path)


def test_rotation_deletes_only_the_current_runs_checkpoints(tmp_path):
    for step in (23, 30):
        _checkpoint(tmp_path, step, run_id="other")
    for step in (5, 10, 15):
        _checkpoint(tmp_path, step, run_id="mine")
    removed = ck.rotate_checkpoints(str(tmp_path), keep=2, run_id="mine")
    assert removed == [str(tmp_path / "checkpoint-5")]
    assert [s for s, _ in ck.list_checkpoints(str(tmp_path))] == [10, 15, 23, 30]
    # without a run id (checkpoints written before run ids) the newest are kept, as before
    assert ck.rotate_checkpoints(str(tmp_path), keep=2) == [
        str(tmp_path / "checkpoint-10"),
        str(tmp_path / "checkpoint-15"),
    ]


def _train_args(tmp_path, **kw):
    from hf_tdiag.training.args import make_args

    return make_args(output_dir=str(tmp_path / "run"), **kw)


def test_a_fresh_run_refuses_another_runs_checkpoints_and_overwrite_removes_them(tmp_path):
    hold_output_dir(str(tmp_path / "run"), ["checkpoint-*"])  # written by an earlier hf-tdiag run
    _checkpoint(tmp_path / "run", 23, run_id="other")
    release_output_dir(str(tmp_path / "run"))
    with pytest.raises(OutputExistsError, match="checkpoint-23"):
        ck.claim_training_dir(_train_args(tmp_path))
    assert ck.claim_training_dir(_train_args(tmp_path, overwrite_output_dir=True), notify=None) is None
    assert not (tmp_path / "run" / "checkpoint-23").exists()  # `latest` can no longer pick the other run


def test_resuming_the_folders_run_needs_no_flag(tmp_path):
    args = _train_args(tmp_path, resume_from_checkpoint="latest")
    _checkpoint(tmp_path / "run", 4, run_id="mine", settings=ck.training_settings(args))
    _fill(tmp_path / "run", "all_results.json")
    assert ck.claim_training_dir(args) == str(tmp_path / "run" / "checkpoint-4")


# (changed flag, value): each changes what the checkpoint trained with -> refused, naming the flag and both values
RESUME_CASES = [
    ("learning_rate", 0.01),
    ("seed", 7),
    ("optimizer", "lion"),
    ("per_device_train_batch_size", 16),
    ("max_train_steps", 99),
    ("srr_weight", 0.5),
]


@pytest.mark.parametrize("name, value", RESUME_CASES, ids=[c[0] for c in RESUME_CASES])
def test_resume_with_a_changed_setting_is_refused(tmp_path, name, value):
    first = _train_args(tmp_path, learning_rate=0.003, max_train_steps=10)
    _checkpoint(tmp_path / "run", 4, run_id="mine", settings=ck.training_settings(first))
    again = _train_args(
        tmp_path, **{"learning_rate": 0.003, "max_train_steps": 10, name: value}, resume_from_checkpoint="latest"
    )
    with pytest.raises(ValueError) as info:
        ck.claim_training_dir(again)
    assert f"{name}: {getattr(first, name)!r} -> {value!r}" in str(info.value)


def test_resume_may_change_where_and_how_often_it_writes(tmp_path):
    first = _train_args(tmp_path, max_train_steps=10)
    _checkpoint(tmp_path / "run", 4, run_id="mine", settings=ck.training_settings(first))
    again = _train_args(
        tmp_path,
        max_train_steps=10,
        resume_from_checkpoint="latest",
        checkpointing_steps=2,
        with_tracking=True,
        disable_tqdm=True,
        logging_steps=3,
        overwrite_output_dir=True,
    )
    assert ck.claim_training_dir(again) == str(tmp_path / "run" / "checkpoint-4")


# ----------------------------------------------------------------------------------------- image files

RAMP16 = (np.arange(64, dtype=np.uint32).reshape(8, 8) * 1000).astype(np.uint16)  # 0 .. 63 000


def _save(path, array, **kw):
    Image.fromarray(array).save(path, **kw)
    return str(path)


IMAGE_CASES = [  # (file, array written, expected 8-bit values or an error text)
    ("16-bit.png", RAMP16, np.rint(RAMP16 * (255.0 / 65535.0))),
    ("16-bit.tif", RAMP16, np.rint(RAMP16 * (255.0 / 65535.0))),
    (
        "float-unit.tif",
        np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8),
        np.rint(np.linspace(0, 255, 64)).reshape(8, 8),
    ),
    (
        "float-255.tif",
        np.linspace(0, 255, 64, dtype=np.float32).reshape(8, 8),
        np.rint(np.linspace(0, 255, 64)).reshape(8, 8),
    ),
    (
        "float-1000.tif",
        np.linspace(0, 1000, 64, dtype=np.float32).reshape(8, 8),
        "got values from 0 to 1000 (a float image",
    ),
    ("float-nan.tif", np.full((8, 8), np.nan, dtype=np.float32), "contains NaN or inf"),
    (
        "int32.tif",
        (np.arange(64, dtype=np.int32).reshape(8, 8) * 2000),
        "got values from 0 to 126000 (a 32-bit integer",
    ),
    ("8-bit.png", np.arange(64, dtype=np.uint8).reshape(8, 8) * 4, np.arange(64).reshape(8, 8) * 4),
]


@pytest.mark.parametrize("name, array, expected", IMAGE_CASES, ids=[c[0] for c in IMAGE_CASES])
@pytest.mark.parametrize("reader", ["to_pil(path)", "to_pil(Image.open)", "open_image"])
def test_image_files_are_read_by_their_real_range_or_refused(tmp_path, name, array, expected, reader):
    path = _save(tmp_path / name, array)
    read = {"to_pil(path)": to_pil, "to_pil(Image.open)": lambda p: to_pil(Image.open(p)), "open_image": open_image}
    if isinstance(expected, str):
        with pytest.raises(ValueError) as info:
            read[reader](path)
        assert expected in str(info.value) and len(str(info.value).splitlines()) == 1
        if reader != "to_pil(Image.open)":
            assert name in str(info.value) and isinstance(info.value, UserInputError)
        return
    image = read[reader](path)
    assert image.mode == "L"
    np.testing.assert_array_equal(np.asarray(image), expected.astype(np.uint8))


@pytest.mark.parametrize(
    "orientation, turn",
    [
        (1, None),
        (3, Image.Transpose.ROTATE_180),
        (6, Image.Transpose.ROTATE_270),
        (8, Image.Transpose.ROTATE_90),
        (2, Image.Transpose.FLIP_LEFT_RIGHT),
    ],
)
@pytest.mark.parametrize("reader", [to_pil, open_image])
def test_exif_orientation_is_applied(tmp_path, orientation, turn, reader):
    pixels = np.zeros((4, 6), dtype=np.uint8)
    pixels[0, 0], pixels[3, 1] = 255, 128  # asymmetric, so every orientation is told apart
    stored = Image.fromarray(pixels)
    exif = stored.getexif()
    exif[0x0112] = orientation
    stored.save(tmp_path / "o.png", exif=exif)  # PNG keeps the pixels exact
    seen = reader(str(tmp_path / "o.png"))
    expected = stored if turn is None else stored.transpose(turn)  # what a viewer shows
    np.testing.assert_array_equal(np.asarray(seen), np.asarray(expected))


# ----------------------------------------------------------------------------------------- device strings


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


DEVICE_CASES = [
    ("meta", "holds no data"),
    ("bogus", "expected a torch device"),
    ("cuda:99", "CUDA"),
    pytest.param("cuda", "CUDA is not available", marks=pytest.mark.skipif(_cuda_count() > 0, reason="CUDA present")),
]


@pytest.mark.parametrize("text, named", DEVICE_CASES)
def test_device_strings_are_checked_by_the_parser(text, named):
    with pytest.raises(argparse.ArgumentTypeError, match=named):
        device_type(text)


# ----------------------------------------------------------------------------------------- failed writes


def test_a_full_disk_names_the_file_and_keeps_the_old_content(tmp_path, monkeypatch):
    target = tmp_path / "srr.json"
    target.write_text("old\n")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")  # what os.fsync says on a full disk, no file name

    monkeypatch.setattr(_atomic.os, "fsync", full)
    with pytest.raises(OSError) as info:
        _atomic.write_json(target, {"a": 1})
    assert info.value.errno == errno.ENOSPC and str(target) in str(info.value)
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["srr.json"]


def test_an_unwritable_folder_names_the_target_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OSError) as info:
        _atomic.write_text(tmp_path / "afile" / "out.txt", "y")
    assert str(tmp_path / "afile" / "out.txt") in str(info.value)


# ----------------------------------------------------------------------------------------- labels and studies


@pytest.mark.parametrize(
    "specs, labels",
    [
        (["a/model", "b/model"], ["a/model", "b/model"]),
        (["x/m1", "y/m2"], ["m1", "m2"]),
        (["r/a/model/", "r/b/model"], ["a/model", "b/model"]),
        (["m", "m"], ["m [1]", "m [2]"]),
        (["org/bert-tiny"], ["bert-tiny"]),
    ],
)
def test_models_with_the_same_folder_name_get_distinct_labels(specs, labels):
    from hf_tdiag.commands.srr import _model_labels

    assert _model_labels(specs) == labels


def test_a_study_folder_of_another_grid_is_refused(tmp_path):
    from hf_tdiag.study.grids import StudyGrid
    from hf_tdiag.study.runner import check_study_dir

    old = StudyGrid(name="g", axes={"lr": [1, 2]}, fixed={"x": 1})
    (tmp_path / "study.json").write_text(json.dumps({"grid": old.to_dict()}))
    check_study_dir(str(tmp_path), old, overwrite=False)  # the same grid continues
    other = StudyGrid(name="g", axes={"lr": [1, 2, 3]}, fixed={"x": 1})
    with pytest.raises(ValueError, match="another grid"):
        check_study_dir(str(tmp_path), other, overwrite=False)
    check_study_dir(str(tmp_path), other, overwrite=True)
    (tmp_path / "study.json").write_text('{"grid": ')
    with pytest.raises(ValueError, match="cannot be read"):
        check_study_dir(str(tmp_path), other, overwrite=False)


@pytest.mark.parametrize(
    "content, named",
    [
        ('{"key": "k1", "train": {}, "meas', "is damaged"),
        ('{"key": "k2", "train": {}, "measures": {}}', "not a complete"),
        ('{"key": "k1", "train": {}}', "not a complete"),
    ],
    ids=["truncated", "another run's", "no measures"],
)
def test_a_damaged_run_record_warns(tmp_path, content, named):
    from hf_tdiag.study.cache import read_record

    path = tmp_path / "k1.json"
    path.write_text(content)
    with pytest.warns(UserWarning, match=named):
        assert read_record(str(path), "k1") is None
    assert read_record(str(tmp_path / "missing.json"), "k1") is None  # not there: no warning (pytest.warns is closed)


def test_latest_refuses_a_folder_holding_checkpoints_of_two_runs(tmp_path):
    for step, run in ((5, "mine"), (23, "other")):
        _checkpoint(tmp_path / "run", step, run_id=run)
    with pytest.raises(ValueError, match="checkpoints of 2 different runs"):
        ck.claim_training_dir(_train_args(tmp_path, resume_from_checkpoint="latest"))


def test_the_cards_reproduction_command_never_carries_the_overwrite_flag(tmp_path):
    from hf_tdiag.training.model_card import _command

    command = _command(_train_args(tmp_path, overwrite_output_dir=True, learning_rate=0.01))
    assert "overwrite" not in command and "--learning_rate 0.01" in command


def test_the_overwrite_flag_takes_both_spellings_in_a_plain_parser():
    import argparse

    from hf_tdiag._outputs import add_overwrite_flag

    parser = argparse.ArgumentParser()
    add_overwrite_flag(parser)
    assert parser.parse_args([]).overwrite_output_dir is False
    for spelling in ("--overwrite-output-dir", "--overwrite_output_dir"):
        assert parser.parse_args([spelling]).overwrite_output_dir is True
