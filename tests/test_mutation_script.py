"""scripts/mutation.py's bookkeeping: verdict counts, the killed share, the merged JSON summary, test selection."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mutation():
    spec = importlib.util.spec_from_file_location("mutation_script", ROOT / "scripts" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tally_counts_each_exit_code_once(mutation):
    codes = {"m.a_1": 1, "m.a_2": 3, "m.a_3": 0, "m.a_4": 0, "m.a_5": 36, "m.a_6": None, "m.a_7": 5, "m.a_8": 2}
    t = mutation.tally(codes, {"m.a_4": "same value"})
    assert (t["generated"], t["killed"], t["timeout"], t["survived"], t["equivalent"]) == (8, 2, 1, 1, 1)
    assert (t["not_checked"], t["no_tests"], t["other"]) == (1, 1, 1)
    assert t["survivors"] == ["m.a_3", "m.a_7"]
    # (killed + timeout) / (generated - equivalent - not checked) = 3 / 6
    assert mutation.score(t) == "50.0"
    assert mutation.score({"generated": 2, "equivalent": 1, "not_checked": 1, "killed": 0, "timeout": 0}) == "-"


def _row(module, killed):
    keys = dict.fromkeys(("generated", "killed", "timeout", "survived", "equivalent", "no_tests", "not_checked"), 0)
    return {**keys, "generated": killed, "killed": killed, "module": module, "tests": [], "survivors": []}


def test_json_summary_keeps_the_modules_this_run_did_not_touch(mutation, tmp_path):
    path = tmp_path / "summary.json"
    mutation.write_json(path, [_row("hf_tdiag/measures/a.py", 3), _row("hf_tdiag/probes/b.py", 4)])
    mutation.write_json(path, [_row("hf_tdiag/measures/a.py", 5), _row("hf_tdiag/measures/c.py", 2)])
    data = json.loads(path.read_text())
    assert [m["module"] for m in data["modules"]] == [
        "hf_tdiag/measures/a.py",
        "hf_tdiag/measures/c.py",
        "hf_tdiag/probes/b.py",
    ]
    assert data["modules"][0]["killed"] == 5  # the new run replaces the module's old row
    assert data["packages"]["hf_tdiag/measures"]["killed"] == 7
    assert data["packages"]["hf_tdiag/probes"]["generated"] == 4
    # a record added by hand beside the script's entries survives the next write, which replaces the script's own
    path.write_text(json.dumps({**data, "run_by_hand": {"sampled": 80}, "packages": "stale"}), encoding="utf-8")
    mutation.write_json(path, [_row("hf_tdiag/measures/c.py", 1)])
    data = json.loads(path.read_text())
    assert data["run_by_hand"] == {"sampled": 80} and data["packages"]["hf_tdiag/measures"]["killed"] == 6


def test_test_selection_longest_prefix_then_names(mutation):
    mapping = {"hf_tdiag/study/": ["tests/test_study.py"], "hf_tdiag/study/measures.py": ["tests/test_study_m*.py"]}
    chosen = mutation.tests_for("hf_tdiag/study/measures.py", mapping)
    assert "tests/test_study.py" not in chosen and "tests/test_study_measures_numbers.py" in chosen
    assert "tests/test_bad_inputs.py" in chosen  # always selected
    assert mutation.tests_for("hf_tdiag/study/lock.py", mapping) == ["tests/test_bad_inputs.py", "tests/test_study.py"]
    # no entry: the test files naming the module
    assert "tests/test_mutation_script.py" not in mutation.tests_for("hf_tdiag/measures/coding_rate.py", {})
    assert "tests/test_coding_rate.py" in mutation.tests_for("hf_tdiag/measures/coding_rate.py", {})


def test_sample_draws_only_unchecked_mutants_reproducibly(mutation):
    codes = {f"m.f_{i}": (None if i % 3 else 1) for i in range(30)}
    draw = mutation.sample_of(codes, 5, seed=4)
    assert len(draw) == 5 == len(set(draw)) and all(codes[n] is None for n in draw)
    assert draw == mutation.sample_of(codes, 5, seed=4) and draw != mutation.sample_of(codes, 5, seed=5)
    assert mutation.sample_of(codes, 100, seed=0) == sorted(n for n, c in codes.items() if c is None)


def test_recheck_moves_each_recorded_survivor_to_its_new_verdict(mutation):
    recorded = {
        **_row("hf_tdiag/probes/b.py", 10),
        "generated": 20,
        "survived": 3,
        "no_tests": 1,
        "not_checked": 6,
        "survivors": ["b.f_1", "b.f_2", "b.f_3", "b.f_4"],
    }
    # f_1 now killed, f_2 times out, f_3 is now listed equivalent, f_4 was not retested (no verdict)
    row = mutation.rechecked_row(recorded, {"b.f_1": 1, "b.f_2": 36, "b.f_4": None}, {"b.f_3": "same value"})
    assert (row["killed"], row["timeout"], row["equivalent"]) == (11, 1, 1)
    assert (row["survived"], row["no_tests"], row["survivors"]) == (1, 0, ["b.f_4"])
    assert (row["generated"], row["not_checked"]) == (20, 6)  # the other counts stand
    assert mutation.score(row) == f"{100 * 12 / 13:.1f}"  # (11 + 1) / (20 - 1 - 6)


def test_a_failing_stats_run_names_the_failing_test(mutation, tmp_path):
    """mutmut swallows its stats run's output: the script reruns the selection as mutmut does (in mutants/, with
    MUTANT_UNDER_TEST=stats) and names the test that fails only there."""
    (tmp_path / "mutants").mkdir()
    (tmp_path / "mutants" / "test_pair.py").write_text(
        "import os\n\n"
        "def test_plain():\n    assert True\n\n"
        "def test_only_unmutated():\n    assert os.environ['MUTANT_UNDER_TEST'] != 'stats'\n"
    )
    fake_mutmut = [mutation.sys.executable, "-c", "print('failed to collect stats. runner returned 1')"]
    tool = {"mutmut": {"pytest_add_cli_args": ["-p", "no:cacheprovider"]}}
    env = {k: v for k, v in mutation.os.environ.items() if k != "PYTEST_ADDOPTS"}
    with pytest.raises(SystemExit) as stop:
        mutation.run_mutmut(fake_mutmut, tmp_path, env, tool, ["test_pair.py"])
    message = str(stop.value)
    assert "test_pair.py::test_only_unmutated" in message and "test_plain" not in message
    assert "test_only_unmutated" in (tmp_path / "stats_failure.log").read_text()
    # a run without the failure message returns quietly
    mutation.run_mutmut([mutation.sys.executable, "-c", "print('done')"], tmp_path, env, tool, ["test_pair.py"])


def test_a_failing_clean_test_run_names_the_failing_test_too(mutation, tmp_path):
    """mutmut's other unmutated run ("Failed to run clean test") stops a run the same way: named, not silent."""
    (tmp_path / "mutants").mkdir()
    (tmp_path / "mutants" / "test_one.py").write_text("def test_broken():\n    assert False\n")
    fake_mutmut = [mutation.sys.executable, "-c", "print('Failed to run clean test')"]
    tool = {"mutmut": {"pytest_add_cli_args": ["-p", "no:cacheprovider"]}}
    env = {k: v for k, v in mutation.os.environ.items() if k != "PYTEST_ADDOPTS"}
    with pytest.raises(SystemExit, match="test_one.py::test_broken"):
        mutation.run_mutmut(fake_mutmut, tmp_path, env, tool, ["test_one.py"])


def test_the_sync_removes_from_mutants_the_sources_the_checkout_no_longer_has(mutation, tmp_path, monkeypatch):
    """mutmut copies sources into mutants/ but never deletes one: a module renamed in the checkout is removed there
    (mutmut's own x.py.meta files stay, the module still in the checkout stays)."""
    repo = tmp_path / "repo"
    (repo / "hf_tdiag").mkdir(parents=True)
    (repo / "hf_tdiag" / "kept.py").write_text("x = 1\n")
    mutation.subprocess.run(["git", "init", "-q", str(repo)], check=True)
    work = tmp_path / "work"
    copies = work / "mutants" / "hf_tdiag"
    copies.mkdir(parents=True)
    for name in ("kept.py", "kept.py.meta", "gone.py", "gone.py.meta", "notes.md"):
        (copies / name).write_text("")
    monkeypatch.setattr(mutation, "ROOT", repo)
    mutation.sync_checkout(work)
    assert sorted(p.name for p in copies.iterdir()) == ["gone.py.meta", "kept.py", "kept.py.meta"]
    assert (work / "hf_tdiag" / "kept.py").read_text() == "x = 1\n"
