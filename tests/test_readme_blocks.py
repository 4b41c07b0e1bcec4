"""Every fenced ```python block of README.md runs when copied alone: each in a fresh interpreter, offline, in an
empty folder that holds only what the main job writes (``runs/main``, built here as a fixture)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK_TIMEOUT_S = 600

# Blocks known not to run alone, keyed by the sha1 of their text (so any edit of such a block makes it a normal,
# must-pass block again). Each names its section; the section's owner makes the block self-contained.
KNOWN_BROKEN: dict[str, str] = {}

# Blocks that take long (training, large fits), keyed like KNOWN_BROKEN: run with ``-m slow``.
SLOW: dict[str, str] = {
    "2f7653d9608e": "concepts: a layer sweep with both bounds, three fits and a supervised fit (minutes on 2 busy cores)",
    "d81bc138638c": "concepts: all-MiniLM-L6-v2 (22M parameters) with both bounds at layer 5",
}


def readme_python_blocks(text: str) -> list[tuple[int, str, str]]:
    """``(line number, section, code)`` of every fenced ```python block, in order."""
    blocks, section, start, buf = [], "intro", None, []
    for number, line in enumerate(text.splitlines(), 1):
        marker = re.match(r"<!-- section:([\w-]+) -->", line.strip())
        if marker:
            section = marker.group(1)
        elif line.startswith("## ") and start is None:
            section = re.sub(r"[^a-z0-9]+", "-", line[3:].lower()).strip("-")
        if start is None and line.strip() == "```python":
            start, buf = number, []
        elif start is not None and line.strip() == "```":
            blocks.append((start, section, "\n".join(buf) + "\n"))
            start = None
        elif start is not None:
            buf.append(line)
    if start is not None:
        raise ValueError(f"README.md: the python block opened on line {start} is never closed")
    return blocks


def block_key(code: str) -> str:
    return hashlib.sha1(code.encode()).hexdigest()[:12]


def _params():
    params = []
    for line, section, code in readme_python_blocks(README.read_text(encoding="utf-8")):
        key = block_key(code)
        marks = []
        if key in KNOWN_BROKEN:
            marks.append(pytest.mark.xfail(reason=f"README line {line} ({section}): {KNOWN_BROKEN[key]}", run=False))
        if key in SLOW:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(code, id=f"L{line}-{section}", marks=marks))
    return params


@pytest.fixture(scope="module")
def main_job_folder(tmp_path_factory) -> Path:
    """A folder laid out as the main job leaves it: ``runs/main`` holds a saved CRATE digits classifier and processor
    (random weights: the blocks document calls, not accuracy)."""
    import torch

    from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor

    root = tmp_path_factory.mktemp("readme")
    torch.manual_seed(0)
    config = CrateConfig.from_preset("crate-digits", num_labels=10, id2label={i: str(i) for i in range(10)})
    CrateForImageClassification(config).save_pretrained(root / "runs" / "main")
    CrateImageProcessor.for_config(config).save_pretrained(root / "runs" / "main")
    return root


def test_readme_has_python_blocks_and_they_parse():
    blocks = readme_python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 5
    for line, section, code in blocks:
        compile(code, f"README.md:{line} ({section})", "exec")


def test_block_parser_on_a_hand_written_readme():
    text = (
        "# t\n<!-- section:a -->\n```python\nx = 1\n```\n```bash\nls\n```\n## B part\n```python\ny = 2\n\nz = 3\n```\n"
    )
    assert readme_python_blocks(text) == [(3, "a", "x = 1\n"), (10, "b-part", "y = 2\n\nz = 3\n")]
    with pytest.raises(ValueError, match="never closed"):
        readme_python_blocks("```python\nx = 1\n")


@pytest.mark.parametrize("code", _params())
def test_readme_block_runs_alone(code, main_job_folder, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "runs").symlink_to(main_job_folder / "runs", target_is_directory=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "MPLBACKEND": "Agg"}
    env.pop("PYTHONSTARTUP", None)
    proc = subprocess.run(
        [sys.executable, "-"], input=code, cwd=work, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
    )
    assert proc.returncode == 0, f"block failed (key {block_key(code)}):\n{proc.stderr[-3000:]}"
