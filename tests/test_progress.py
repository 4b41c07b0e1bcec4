"""Progress bars: off under TQDM_DISABLE and hf-tdiag --quiet, and plain lines (no carriage returns or cursor
moves) when the output is not a terminal."""

import io

import pytest

from hf_tdiag import _progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_outside_a_terminal_each_refresh_is_one_clean_line(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    out = io.StringIO()
    for _ in _progress.tqdm(range(3), desc="work", file=out, mininterval=0):
        pass
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert lines and all(line.startswith("work:") for line in lines) and "3/3" in lines[-1]


def test_in_a_terminal_the_bar_is_tqdm_s_own(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    out = _Terminal()
    for _ in _progress.tqdm(range(3), desc="work", file=out, mininterval=0):
        pass
    assert "\r" in out.getvalue()  # the terminal bar redraws in place


@pytest.mark.parametrize("value, shown", [("1", False), ("true", False), ("0", True), ("", True)])
def test_tqdm_disable_is_honoured(monkeypatch, value, shown):
    monkeypatch.setenv("TQDM_DISABLE", value)
    out = io.StringIO()
    list(_progress.tqdm(range(2), desc="x", file=out))
    assert bool(out.getvalue()) is shown
    out = io.StringIO()
    list(_progress.tqdm(range(2), desc="x", file=out, disable=True))
    assert out.getvalue() == ""


def test_log_lines_drop_control_sequences_and_blank_padding():
    out = io.StringIO()
    _progress.LogLines(out).write("\rbar 1   \r\x1b[A\rbar 2\n\r      \r")
    assert out.getvalue() == "bar 1\nbar 2\n"


def test_quiet_flag_before_or_after_the_command_sets_tqdm_disable(monkeypatch, tmp_path, capsys):
    from hf_tdiag.cli import build_parser, main

    parse = build_parser().parse_args
    assert parse(["--quiet", "schatten", "m"]).quiet and parse(["schatten", "m", "-q"]).quiet
    assert not parse(["schatten", "m"]).quiet
    monkeypatch.setenv("TQDM_DISABLE", "0")  # recorded, so the value main() sets is undone after the test
    for name in ("TRANSFORMERS_VERBOSITY", "DATASETS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    assert main(["schatten", str(tmp_path / "missing"), "--quiet", "--output-dir", str(tmp_path / "o")]) == 1
    import os

    assert os.environ["TQDM_DISABLE"] == "1"
    assert "error" in capsys.readouterr().err  # errors still print


def test_train_takes_dataset_like_the_measuring_commands():
    from hf_tdiag.training.args import build_parser

    for flag in ("--dataset", "--dataset-name", "--dataset_name"):
        assert build_parser().parse_args(["--output-dir", "o", flag, "cifar10"]).dataset_name == "cifar10"
