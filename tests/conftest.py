import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

# Tests write only under temporary folders: every cache a library would put in the home folder (Hugging Face hub,
# datasets, evaluate and remote-code modules, the default Space model, matplotlib's font cache, Chromium) goes to one
# folder for this session, set before anything imports those libraries (they read the variables at import).
_SESSION_HOME = tempfile.mkdtemp(prefix="hf_tdiag_tests_")
for _name, _sub in (
    ("HF_HOME", "hf"),
    ("HF_TDIAG_CACHE", "hf_tdiag"),
    ("MPLCONFIGDIR", "matplotlib"),
    ("XDG_CACHE_HOME", "xdg-cache"),
    ("XDG_CONFIG_HOME", "xdg-config"),
):
    os.environ[_name] = os.path.join(_SESSION_HOME, _sub)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("HF_ENDPOINT", None)  # tests that need a Hub point a subprocess at tests/hub_server.py

import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))

REPO = Path(__file__).resolve().parents[1]


def _untracked_in_repo() -> set[str] | None:
    """Paths git does not track under the repository, ignored ones included, folders collapsed (None outside a git
    checkout); Python's byte-code caches are left out."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "--others", "--directory", "--no-empty-directory"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {p for p in out.splitlines() if "__pycache__" not in p and not p.startswith(".pytest_cache")}


def pytest_configure(config):
    config._hf_tdiag_untracked = _untracked_in_repo()


def pytest_sessionfinish(session, exitstatus):
    """Fail the run when a test left a new file in the repository (tests write only under tmp paths)."""
    before = getattr(session.config, "_hf_tdiag_untracked", None)
    after = _untracked_in_repo()
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)
    if before is None or after is None or hasattr(session.config, "workerinput"):
        return
    new = sorted(after - before)
    if new:
        session.config.get_terminal_writer().line(
            f"tests wrote into the repository (they must write only under tmp paths): {new[:10]}", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _run_in_tmp_path(tmp_path, monkeypatch):
    """Every test runs with its own tmp_path as the working directory, so default output folders land there.

    Under mutmut (scripts/mutation.sh) the active mutant is also kept in process-local state; dropping its
    environment variable here keeps it from leaking into the processes tests start (a recipe or ``python -c`` run
    with the checkout on PYTHONPATH would import the mutated package and fail reading mutmut's configuration from
    this tmp_path): child processes run the unmutated code, as console-script subprocesses already do."""
    monkeypatch.delenv("MUTANT_UNDER_TEST", raising=False)
    monkeypatch.chdir(tmp_path)
    yield
    from hf_tdiag._outputs import release_output_dirs

    release_output_dirs()  # output folders a command held in this process (as the CLI does after each command)


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test: tiny tensors, and OpenMP oversubscription costs more on a shared 2-core machine."""
    from hf_tdiag._threads import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
