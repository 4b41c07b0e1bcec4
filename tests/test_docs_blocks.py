"""Every fenced ```python and ```bash block of README.md and of the pages under docs/ runs when copied alone: in an
empty folder that holds only what the main job writes (``runs/main``, built here as a fixture: a random-weights
CRATE digits classifier, so the blocks document calls, not accuracy) and, for the commands "from the repository
root", links to the repository's ``recipes/``, ``scripts/``, ``benchmarks/`` and ``space/``; offline.

A block is marked by an HTML comment on the line before its fence: ``<!-- block: slow (why) -->`` runs it only with
``-m slow``; ``<!-- block: not-run (why) -->`` compiles (python) or parses (bash) it but does not run it, and the
reason is required; the blocks of docs/benchmarks.md are only parsed (:data:`PARSED_ONLY`). Blocks with the same
text (the README's quick starts repeat the docs' quick start) run once.

Python blocks run in a child forked from one server process that imported torch, transformers and hf_tdiag once
(each block gets fresh globals, its own working directory and its own output; the imports are what it shares), so
a block costs what its own code costs; bash blocks run in ``bash -e`` with the virtual environment first on PATH.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BLOCK_TIMEOUT_S = 900
LANGUAGES = ("python", "bash")
MARKER = re.compile(r"<!--\s*block:\s*(slow|not-run)\s*(?:\((.*)\))?\s*-->")
LINKED = ("recipes", "scripts", "benchmarks", "space")
# pages whose blocks are parsed but never run: benchmark commands take minutes and append to benchmarks/results/
PARSED_ONLY = {"docs/benchmarks.md": "a benchmark: minutes, and it records into benchmarks/results/"}


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # line of the opening fence
    language: str
    code: str
    mark: str | None = None  # None, "slow" or "not-run"
    reason: str = ""

    @property
    def key(self) -> str:
        return hashlib.sha1(f"{self.language}\n{self.code}".encode()).hexdigest()[:12]


def markdown_blocks(text: str, path: str = "<text>") -> list[Block]:
    """Every fenced block of ``text`` in a language of :data:`LANGUAGES`, with the marker on the line before it."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\w+)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        indent, language, start = fence.group(1), fence.group(2), i + 1
        end = next((j for j in range(start, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{path}: the ```{language} block opened on line {start} is never closed")
        marker = MARKER.search(lines[i - 1]) if i > 0 else None
        if language in LANGUAGES:
            body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[start:end]]
            mark, reason = (marker.group(1), (marker.group(2) or "").strip()) if marker else (None, "")
            if path in PARSED_ONLY:
                mark, reason = "not-run", PARSED_ONLY[path]
            blocks.append(Block(path, start, language, "\n".join(body) + "\n", mark, reason))
        i = end + 1
    return blocks


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def all_blocks() -> list[Block]:
    found = []
    for file in doc_files():
        found += markdown_blocks(file.read_text(encoding="utf-8"), str(file.relative_to(REPO)))
    return found


def unique_blocks() -> list[Block]:
    """One block per (language, text): the first place it appears; a not-run or slow mark anywhere wins."""
    first: dict[str, Block] = {}
    for block in all_blocks():
        kept = first.get(block.key)
        if kept is None or (block.mark and not kept.mark):
            first[block.key] = (
                block if kept is None else Block(**{**kept.__dict__, "mark": block.mark, "reason": block.reason})
            )
    return list(first.values())


def _params():
    params = []
    for block in unique_blocks():
        if block.mark == "not-run":
            continue
        marks = [pytest.mark.slow] if block.mark == "slow" else []
        params.append(pytest.param(block, id=f"{block.path}:L{block.line}-{block.language}", marks=marks))
    return params


# ---------------------------------------------------------------------------------------------- the block parser


def test_block_parser_on_a_hand_written_page():
    text = (
        "# t\n```python\nx = 1\n```\n<!-- block: not-run (needs the Hub) -->\n```bash\nls\n```\n"
        "- item:\n\n  <!-- block: slow -->\n  ```python\n  y = 2\n\n  z = 3\n  ```\n```text\nignored\n```\n"
    )
    assert markdown_blocks(text) == [
        Block("<text>", 2, "python", "x = 1\n"),
        Block("<text>", 6, "bash", "ls\n", "not-run", "needs the Hub"),
        Block("<text>", 12, "python", "y = 2\n\nz = 3\n", "slow", ""),
    ]
    with pytest.raises(ValueError, match="never closed"):
        markdown_blocks("```python\nx = 1\n")


def test_every_page_has_blocks_and_they_parse():
    blocks = all_blocks()
    assert len({b.path for b in blocks}) >= 10, "README.md and the guide pages hold the code blocks"
    for block in blocks:
        if block.language == "python":
            compile(block.code, f"{block.path}:{block.line}", "exec")
        else:
            proc = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, f"{block.path}:{block.line}: {proc.stderr}"
        if block.mark == "not-run":
            assert block.reason, f"{block.path}:{block.line}: a not-run block says why"


def test_the_readme_quick_starts_are_the_docs_quick_starts():
    """The README's python blocks are the quick start page's blocks, word for word (one text, run once)."""
    readme = {
        b.key for b in markdown_blocks((REPO / "README.md").read_text(encoding="utf-8")) if b.language == "python"
    }
    quick = {b.key for b in markdown_blocks((REPO / "docs" / "quickstart.md").read_text(encoding="utf-8"))}
    assert readme and readme <= quick


# ------------------------------------------------------------------------------------------------- running them

_SERVER = r"""
import json, os, sys, traceback
import torch, transformers, evaluate, matplotlib
import hf_tdiag, hf_tdiag.models.crate, hf_tdiag.diagnostics.srr, hf_tdiag.diagnostics.schatten
import hf_tdiag.diagnostics.concept_fidelity, hf_tdiag.diagnostics.attention_svm
out = sys.stdout
print(json.dumps({"ready": True}), file=out, flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.chdir(req["cwd"])
            fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdin = open(os.devnull)
            code = open(req["code"], encoding="utf-8").read()
            exec(compile(code, req["name"], "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    print(json.dumps({"pid": pid}), file=out, flush=True)
    _, wait = os.waitpid(pid, 0)
    print(json.dumps({"status": os.waitstatus_to_exitcode(wait)}), file=out, flush=True)
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "MPLBACKEND": "Agg"}
    env.pop("PYTHONSTARTUP", None)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


class ForkServer:
    """One interpreter that imported the heavy libraries; each block runs in a fork of it."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env()
        )
        assert json.loads(self._read(300)).get("ready"), "the block server did not start"

    def _read(self, timeout: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the block server exited")
        return line

    def run(self, code: str, name: str, cwd: Path, timeout: float) -> tuple[int, str]:
        script, log = cwd / "block.py", cwd.parent / "block.log"
        script.write_text(code, encoding="utf-8")
        request = {"code": str(script), "name": name, "cwd": str(cwd), "log": str(log)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self._read(60))["pid"]
        deadline = time.monotonic() + timeout
        try:
            status = json.loads(self._read(timeout))["status"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            json.loads(self._read(60))
            status = f"timed out after {time.monotonic() - deadline + timeout:.0f} s"
        return status, log.read_text(encoding="utf-8", errors="replace")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def block_server():
    server = ForkServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def main_job_folder(tmp_path_factory) -> Path:
    """``runs/main`` as the main job leaves it: a saved CRATE digits classifier and its processor."""
    import torch

    from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor

    root = tmp_path_factory.mktemp("main_job")
    torch.manual_seed(0)
    config = CrateConfig.from_preset("crate-digits", num_labels=10, id2label={i: str(i) for i in range(10)})
    CrateForImageClassification(config).save_pretrained(root / "runs" / "main")
    CrateImageProcessor.for_config(config).save_pretrained(root / "runs" / "main")
    return root / "runs" / "main"


def _work_folder(tmp_path: Path, main_job_folder: Path) -> Path:
    work = tmp_path / "work"
    (work / "runs").mkdir(parents=True)
    shutil.copytree(main_job_folder, work / "runs" / "main")
    for name in LINKED:
        (work / name).symlink_to(REPO / name, target_is_directory=True)
    return work


@pytest.mark.parametrize("block", _params())
def test_doc_block_runs_alone(block, block_server, main_job_folder, tmp_path):
    work = _work_folder(tmp_path, main_job_folder)
    where = f"{block.path}:{block.line}"
    if block.language == "python":
        status, output = block_server.run(block.code, where, work, BLOCK_TIMEOUT_S)
    else:
        proc = subprocess.run(
            ["bash", "-e", "-o", "pipefail"],
            input=block.code,
            cwd=work,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
        )
        status, output = proc.returncode, proc.stdout + proc.stderr
    assert status == 0, f"{where} failed ({status}):\n{output[-3000:]}"
