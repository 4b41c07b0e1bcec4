"""End to end: ``hf-tdiag study`` on the 2x2 grid of real trainings, and a study killed with SIGKILL that continues."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from script_files import folder_bytes as _files
from script_files import load_script

from hf_tdiag.measures.correlation import granulated_kendall, kendall_tau
from hf_tdiag.study import GRIDS, MEASURES, MeasureSettings, load_records, run_key, run_study

FAST = MeasureSettings(max_examples=128)
FAST_KW = "MeasureSettings(max_examples=128)"


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    """``hf-tdiag study --grid tiny`` as a user runs it: the console entry point in a subprocess."""
    out = tmp_path_factory.mktemp("study_tiny")
    t0 = time.time()
    # one torch thread everywhere: training is bitwise reproducible only at equal thread counts
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_tdiag.cli",
            "study",
            "--grid",
            "tiny",
            "--output_dir",
            str(out),
            "--threads",
            "1",
            "--max_examples",
            "128",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    summary = json.loads((out / "table.json").read_text())
    return out, summary, time.time() - t0, cli


def _runs(out):
    runs = {}
    for name in sorted(os.listdir(out / "runs")):
        if name.endswith(".json"):
            runs[name] = (out / "runs" / name).read_bytes()
    return runs


@pytest.mark.slow  # the module fixture trains the tiny study grid: ~85 s on 2 idle cores
def test_tiny_grid_end_to_end(tiny_study):
    out, summary, seconds, cli = tiny_study
    print(f"2x2 grid end to end: {seconds:.1f}s")
    grid = GRIDS["tiny"]
    assert summary["complete"] and summary["n_runs"] == 4 and not summary["failures"]
    assert "study tiny: 4/4 runs finished (0 from the cache)" in cli.stdout and "| srr_mean |" in cli.stdout
    runs = [json.loads(b) for b in _runs(out).values()]
    assert len(runs) == 4
    assert {run_key(r["hparams"], grid.fixed, FAST) for r in runs} == {
        run_key(h, grid.fixed, FAST) for h in grid.runs()
    }
    for r in runs:
        t = r["train"]
        # the gap is validation loss minus training loss, as the trainer measured them
        assert t["generalization_gap"] == pytest.approx(t["eval_loss"] - t["train_loss"])
        assert t["variant"] == r["hparams"]["variant"] and t["steps"] <= grid.fixed["max_train_steps"]
        # each value is checked against an independent computation in test_study_measures.py; here: all present
        for m in MEASURES:
            # an under-trained smoke run may misclassify >= 10% of its examples: the inverse margin is then undefined
            undefined_margin = m == "inverse_margin" and "misclassifies at least 10%" in r["measure_errors"].get(m, "")
            assert isinstance(r["measures"][m], float) or (undefined_margin and r["measures"][m] is None), m
        assert len(r["srr_per_layer"]) == grid.fixed["num_hidden_layers"]
        assert r["measures"]["srr_last"] == pytest.approx(r["srr_per_layer"][-1])
        assert r["measures"]["srr_mean"] == pytest.approx(sum(r["srr_per_layer"]) / len(r["srr_per_layer"]))
    # no trained model is left behind unless asked
    assert (out / "work").is_dir() and os.listdir(out / "work") == []
    assert records_equal(load_records(str(out)), runs)
    table = {row["measure"]: row for row in summary["table"]}
    assert list(table) == list(MEASURES)
    gaps = [r["train"]["generalization_gap"] for r in runs]
    err_gaps = [r["train"]["train_accuracy"] - r["train"]["eval_accuracy"] for r in runs]
    error_table = {row["measure"]: row for row in summary["table_error_gap"]}
    for m in ("srr_mean", "l2", "pacbayes_flatness"):
        values = [r["measures"][m] for r in runs]
        assert table[m]["tau"] == pytest.approx(kendall_tau(values, gaps))
        assert table[m]["psi"] == pytest.approx(granulated_kendall(values, gaps, [r["hparams"] for r in runs]).psi)
        assert set(table[m]["psi_per_axis"]) == set(grid.axes)
        assert table[m]["psi_groups"] == {"variant": 2, "learning_rate": 2} and table[m]["missing_runs"] == 0
        expected = (
            kendall_tau(values, err_gaps) if len(set(err_gaps)) > 1 else None
        )  # tau-b undefined for a constant gap
        assert error_table[m]["tau"] == (None if expected is None else pytest.approx(expected))
    for name in ("table.json", "table.csv", "table.md", "runs.csv", "scatter.png"):
        assert (out / name).stat().st_size > 0


def records_equal(a, b):
    return sorted(json.dumps(r, sort_keys=True) for r in a) == sorted(json.dumps(r, sort_keys=True) for r in b)


@pytest.mark.slow  # kills a study process mid-run: ~30 s
def test_study_killed_mid_run_continues_and_loses_nothing(tmp_path, tiny_study):
    out = tmp_path / "study"
    script = textwrap.dedent(
        f"""
        from hf_tdiag.study import MeasureSettings, run_study
        if __name__ == "__main__":
            run_study("tiny", {str(out)!r}, settings={FAST_KW}, plot=False, progress=False, threads=1)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if (out / "runs").is_dir() and any(
                n.endswith(".json") and not n.startswith(".") for n in os.listdir(out / "runs")
            ):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the study finished before it could be killed"
        proc.kill()  # SIGKILL: no cleanup runs in the child
    finally:
        proc.kill()
        proc.wait()
    before = _runs(out)
    assert 1 <= len(before) < 4
    # a writer killed mid-write leaves at most a temporary file; it is never read as a result
    (out / "runs" / ".tmp-killed.json").write_text('{"key": "trunc')

    new = []
    summary = run_study(
        "tiny", str(out), jobs=2, settings=FAST, plot=False, progress=False, on_record=new.append, threads=1
    )
    assert summary["complete"] and summary["n_runs"] == 4 and summary["cached"] == len(before)
    assert len(new) == 4 - len(before)  # only the missing runs were trained
    after = _runs(out)
    assert all(after[name] == data for name, data in before.items())  # cached results untouched
    assert not any(n.startswith(".tmp-") for n in os.listdir(out / "runs"))
    # the continued study (cached runs + the interrupted run resumed from its checkpoint + fresh runs in two
    # worker processes) reaches the same results as the uninterrupted one: same seeds, settings, thread count
    reference = {json.loads(b)["key"]: json.loads(b) for b in _runs(tiny_study[0]).values()}
    for data in after.values():
        rec = json.loads(data)
        ref = reference[rec["key"]]
        assert rec["train"]["generalization_gap"] == pytest.approx(
            ref["train"]["generalization_gap"], rel=1e-5, abs=1e-7
        )
        for m in ("l2", "srr_mean", "sharpness_mag", "pacbayes_flatness"):
            assert rec["measures"][m] == pytest.approx(ref["measures"][m], rel=1e-5, abs=1e-7), m


@pytest.mark.slow  # shares the tiny study grid the module fixture trains
def test_srr_generalization_recipe_equals_the_cli_from_the_cache(tmp_path, tiny_study):
    """``recipes/srr_generalization.py`` as a user runs it, with the CLI's finished runs in its cache: same table."""
    cli_out, cli_summary, _, _ = tiny_study
    out = tmp_path / "recipe"
    (out / "runs").mkdir(parents=True)
    for name, data in _runs(cli_out).items():
        (out / "runs" / name).write_bytes(data)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    recipe = subprocess.run(
        [
            sys.executable,
            os.path.join(root, "recipes", "srr_generalization.py"),
            "--grid",
            "tiny",
            "--output_dir",
            str(out),
            "--threads",
            "1",
            "--max_examples",
            "128",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )
    assert recipe.returncode == 0, recipe.stderr[-3000:]
    # every run came from the cache: nothing was trained again, the cached records are untouched
    assert "study tiny: 4/4 runs finished (4 from the cache)" in recipe.stdout
    assert _runs(out) == _runs(cli_out)
    table = json.loads((out / "table.json").read_text())
    # value by value; only the cache count differs (the CLI trained all four runs, the recipe none)
    assert cli_summary["cached"] == 0 and table["cached"] == 4
    assert set(table) == set(cli_summary)
    for key in cli_summary:
        if key != "cached":
            assert table[key] == cli_summary[key], key
    assert table["table"] and table["table_error_gap"] and table["markdown"]


def _srr_generalization():
    return load_script("recipes/srr_generalization.py")


@pytest.mark.parametrize(
    ("earlier", "extra"),
    [
        ({"study.json": b'{"grid": {"name": "other"}}', "table.md": b"an earlier table"}, []),
        ({"study.json": b'{"grid": {"name": "other"}}'}, ["--summarize-only"]),
        ({"table.json": b'{"earlier": true}'}, []),  # tables without their study.json
    ],
    ids=["another-grid", "another-grid-summarize-only", "tables-without-study"],
)
def test_srr_generalization_recipe_refuses_an_earlier_study_before_training(tmp_path, capsys, earlier, extra):
    out = tmp_path / "study"
    out.mkdir()
    for name, data in earlier.items():
        (out / name).write_bytes(data)
    recipe = _srr_generalization()
    argv = ["--grid", "tiny", "--output-dir", str(out), "--threads", "1", *extra]
    assert recipe.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("srr_generalization: ") and "--overwrite-output-dir" in err
    assert _files(out) == earlier
    from hf_tdiag._outputs import adopt_outputs

    adopt_outputs(out, list(earlier))  # an earlier study's, as its manifest records (issue 45)
    recipe.claim_study_dir(recipe.add_arguments(recipe.ArgumentParser()).parse_args([*argv, "--overwrite-output-dir"]))
    assert _files(out) == earlier  # the check alone removes nothing: the study runner replaces the files


@pytest.mark.parametrize("overwrite", [False, True])
def test_cli_summarize_only_refuses_another_grids_folder(tmp_path, capsys, overwrite):
    from hf_tdiag.cli import main as cli_main

    out = tmp_path / "study"
    out.mkdir()
    earlier = {"study.json": b'{"grid": {"name": "other"}}', "table.md": b"another grid's table"}
    for name, data in earlier.items():
        (out / name).write_bytes(data)
    argv = ["study", "--grid", "tiny", "--output-dir", str(out), "--summarize-only", "--no-figures"]
    rc = cli_main(argv + (["--overwrite-output-dir"] if overwrite else []))
    err = capsys.readouterr().err
    if not overwrite:  # the tables would have been replaced by this grid's (empty) summary
        assert rc == 1 and "another grid" in err and "--overwrite-output-dir" in err
        assert _files(out) == earlier
    else:  # past the check (no runs of this grid cached: nothing to summarize)
        assert rc == 0 and "another grid" not in err
