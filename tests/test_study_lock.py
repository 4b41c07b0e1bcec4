"""One study per folder, and no orphans: workers die with a killed study; a second study in the folder is refused."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hf_tdiag.study import StudyGrid, run_study
from hf_tdiag.study.lock import StudyLockedError, study_lock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SLOW_TRAIN = """
import os, time

def train(hparams, fixed, output_dir, max_examples=None):
    open(os.path.join(os.environ["STUDY_TEST_PIDS"], str(os.getpid())), "w").close()
    time.sleep(600)  # a run that outlives any test: only a dead worker stops it
"""


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_lock_refuses_a_second_holder_and_is_released(tmp_path):
    with study_lock(str(tmp_path)) as path:
        assert f"pid {os.getpid()}" in open(path).read()
        with pytest.raises(StudyLockedError, match=r"in use by another running study \(pid \d+"):
            with study_lock(str(tmp_path)):
                pass
    with study_lock(str(tmp_path)):  # released when the holder's block ends
        pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to see the worker processes")
def test_killed_study_takes_its_workers_along_and_its_lock_refuses_a_second_study(tmp_path):
    (tmp_path / "slow_train.py").write_text(SLOW_TRAIN)
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    out = tmp_path / "study"
    grid = "StudyGrid('t', axes={'a': [1, 2, 3, 4]})"
    script = textwrap.dedent(
        f"""
        from hf_tdiag.study import StudyGrid, run_study
        if __name__ == "__main__":
            run_study({grid}, {str(out)!r}, jobs=2, train_fn="slow_train:train", plot=False, progress=False, threads=1)
        """
    )
    env = dict(os.environ, STUDY_TEST_PIDS=str(pids_dir), PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    parent = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    workers: list[int] = []
    try:
        _wait_for(
            lambda: len(os.listdir(pids_dir)) == 2 or parent.poll() is not None, 180, "two workers to start training"
        )
        assert parent.poll() is None, parent.stderr.read().decode()
        workers = [int(p) for p in os.listdir(pids_dir)]
        assert all(_alive(p) for p in workers) and parent.pid not in workers

        # a second study on the same folder is refused with a message naming the folder and the holder
        with pytest.raises(
            StudyLockedError, match=rf"{out.name}.*in use by another running study \(pid {parent.pid}\b"
        ):
            run_study(
                StudyGrid("t", axes={"a": [1, 2, 3, 4]}),
                str(out),
                jobs=1,
                train_fn="slow_train:train",
                plot=False,
                progress=False,
            )
        cli = subprocess.run(
            [sys.executable, "-m", "hf_tdiag.cli", "study", "--grid", "tiny", "--output_dir", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 1 and "in use by another running study" in cli.stderr and "Traceback" not in cli.stderr

        parent.send_signal(signal.SIGKILL)  # no cleanup code runs in the study process
        parent.wait(timeout=30)
        _wait_for(lambda: not any(_alive(p) for p in workers), 20, f"workers {workers} to die with their parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for p in workers:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
    with study_lock(str(out)):  # the kernel released the dead study's lock: a restarted study may proceed
        pass


def test_check_unlocked_sees_a_held_lock_and_creates_nothing(tmp_path):
    from hf_tdiag.study.lock import LOCK_NAME, check_unlocked, study_lock

    check_unlocked(str(tmp_path / "never"))  # no folder, no lock file: nothing to refuse
    assert not (tmp_path / "never").exists()
    out = tmp_path / "study"
    with study_lock(str(out)):  # another open file description: flock refuses it even in this process
        held = (out / LOCK_NAME).read_text()
        with pytest.raises(StudyLockedError, match=r"study.*in use by another running study \(pid "):
            check_unlocked(str(out))
        assert (out / LOCK_NAME).read_text() == held  # the check wrote nothing into the holder's file
    check_unlocked(str(out))  # released
