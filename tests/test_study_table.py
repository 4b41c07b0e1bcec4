"""Study plumbing that does not train: grids, run keys, atomic cache files, the tau/Psi table, the CLI grid options."""

import argparse
import json
import os

import numpy as np
import pytest
import scipy.stats

from hf_tdiag.measures.correlation import granulated_kendall, kendall_tau
from hf_tdiag.study import (
    GRIDS,
    MeasureSettings,
    StudyGrid,
    correlation_table,
    load_records,
    run_key,
    summarize,
    write_json_atomic,
)


def test_grid_runs_are_the_cartesian_product():
    grid = StudyGrid("g", axes={"a": [1, 2], "b": ["x", "y", "z"]}, fixed={"c": 0})
    runs = grid.runs()
    assert len(runs) == 6 and len({json.dumps(r, sort_keys=True) for r in runs}) == 6
    assert {(r["a"], r["b"]) for r in runs} == {(a, b) for a in (1, 2) for b in "xyz"}
    with pytest.raises(ValueError, match="also grid axes"):
        StudyGrid("g", axes={"a": [1]}, fixed={"a": 2})
    with pytest.raises(ValueError, match="distinct"):
        StudyGrid("g", axes={"a": [1, 1]})
    digits = GRIDS["digits"]
    assert set(digits.axes) == {"variant", "per_device_train_batch_size", "learning_rate", "weight_decay"}
    assert digits.axes["variant"] == ["crate", "crate-c", "crate-n", "crate-t"]


def test_run_key_depends_on_every_setting():
    s = MeasureSettings()
    k = run_key({"a": 1, "b": 2}, {"c": 3}, s)
    assert k == run_key({"b": 2, "a": 1}, {"c": 3}, MeasureSettings())  # order-free, stable
    assert k != run_key({"a": 1, "b": 3}, {"c": 3}, s)
    assert k != run_key({"a": 1, "b": 2}, {"c": 4}, s)
    assert k != run_key({"a": 1, "b": 2}, {"c": 3}, MeasureSettings(pac_draws=20))


def test_write_json_atomic_never_leaves_a_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "runs" / "k.json"
    write_json_atomic(str(path), {"v": 1})
    assert json.loads(path.read_text()) == {"v": 1}

    def killed(fd):
        raise KeyboardInterrupt  # a kill after the new content is written to the temporary file, before the rename

    monkeypatch.setattr(os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(str(path), {"v": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(path.parent) == ["k.json"]
    with pytest.raises(ValueError):  # NaN never reaches the cache
        write_json_atomic(str(path), {"v": float("nan")})
    assert json.loads(path.read_text()) == {"v": 1}


def _records(seed=0):
    rng = np.random.default_rng(seed)
    grid = StudyGrid("g", axes={"variant": ["crate", "crate-c"], "lr": [1, 2, 3], "wd": [0.0, 0.1]})
    recs = []
    for hp in grid.runs():
        gap = float(rng.normal())
        recs.append(
            {
                "key": run_key(hp, grid.fixed, MeasureSettings()),
                "hparams": hp,
                "train": {
                    "generalization_gap": gap,
                    "reached_train_loss_target": True,
                    "train_accuracy": 1.0,
                    "eval_accuracy": float(rng.uniform(0.8, 1.0)),
                },
                "measures": {
                    "srr_mean": gap + 0.3 * float(rng.normal()),
                    "l2": float(rng.normal()),
                    "inverse_margin": None if hp["lr"] == 3 else float(rng.normal()),
                },
            }
        )
    return grid, recs


def test_correlation_table_matches_direct_computation():
    grid, recs = _records()
    rows = {
        r["measure"]: r
        for r in correlation_table(recs, measures=["srr_mean", "l2", "inverse_margin"], axes=list(grid.axes))
    }
    gap = [r["train"]["generalization_gap"] for r in recs]
    for m in ("srr_mean", "l2"):
        mv = [r["measures"][m] for r in recs]
        assert rows[m]["tau"] == pytest.approx(kendall_tau(mv, gap))
        g = granulated_kendall(mv, gap, [r["hparams"] for r in recs])
        assert rows[m]["psi"] == pytest.approx(g.psi)
        assert rows[m]["psi_per_axis"] == pytest.approx(g.per_axis)
        assert rows[m]["n_runs"] == 12
    # a measure undefined on some runs is ranked on the others only
    used = [r for r in recs if r["measures"]["inverse_margin"] is not None]
    assert rows["inverse_margin"]["n_runs"] == len(used) == 8
    assert rows["inverse_margin"]["tau"] == pytest.approx(
        kendall_tau([r["measures"]["inverse_margin"] for r in used], [r["train"]["generalization_gap"] for r in used])
    )
    assert rows["srr_mean"]["tau"] > 0.4  # built to correlate
    # against the 0-1 error gap: acc_train - acc_val, computed here from the records' accuracies
    err_rows = {r["measure"]: r for r in correlation_table(recs, measures=["l2"], axes=list(grid.axes), gap="error")}
    err_gap = [r["train"]["train_accuracy"] - r["train"]["eval_accuracy"] for r in recs]
    assert err_rows["l2"]["tau"] == pytest.approx(
        scipy.stats.kendalltau([r["measures"]["l2"] for r in recs], err_gap).statistic
    )
    assert err_rows["l2"]["gap"] == "error" and err_rows["l2"]["missing_runs"] == 0
    with pytest.raises(ValueError, match="gap"):
        correlation_table(recs, gap="accuracy")
    # with the grid's values, the runs where inverse_margin is undefined are missing runs of Jiang's formula
    im = correlation_table(recs, measures=["inverse_margin"], axes=list(grid.axes), axes_values=grid.axes)[0]
    assert im["missing_runs"] == 4 and im["psi_groups"] == {"variant": 6, "lr": 4, "wd": 6}
    assert im["psi_incomplete"] == {"variant": 2, "lr": 4, "wd": 2}


def test_summarize_writes_tables_plot_and_reloads(tmp_path):
    grid, recs = _records(1)
    for r in recs:
        write_json_atomic(str(tmp_path / "runs" / f"{r['key']}.json"), r)
    (tmp_path / "runs" / "garbage.json").write_text("{not json")
    loaded = load_records(str(tmp_path))
    assert len(loaded) == len(recs)  # the unreadable file is ignored
    summary = summarize(grid, loaded, str(tmp_path), plot=True)
    assert summary["complete"] and summary["n_runs"] == 12
    for kind in ("json", "csv", "markdown", "plot", "runs_csv"):
        assert os.path.getsize(summary["paths"][kind]) > 0
    table = json.loads((tmp_path / "table.json").read_text())
    assert [r["measure"] for r in table["table"]][:3] == ["srr_mean", "srr_last", "l2"]
    assert [r["gap"] for r in table["table_error_gap"]] == ["error"] * len(table["table"])
    md = (tmp_path / "table.md").read_text()
    assert "| srr_mean |" in md and "ψ variant" in md and "τ (reached)" in md and "Ψ (0–1 gap)" in md
    assert oct(os.stat(tmp_path / "table.json").st_mode & 0o777) != oct(0o600)  # not mkstemp's private mode
    # the second table ranks only the runs that reached the target training loss
    reached = [r for r in recs if r["hparams"]["lr"] != 1]
    for r in recs:
        r["train"]["reached_train_loss_target"] = r["hparams"]["lr"] != 1
    again = summarize(grid, recs, str(tmp_path), plot=False)
    row = {x["measure"]: x for x in again["table_reached_target"]}["srr_mean"]
    assert row["n_runs"] == len(reached) == 8
    assert row["tau"] == pytest.approx(
        kendall_tau([r["measures"]["srr_mean"] for r in reached], [r["train"]["generalization_gap"] for r in reached])
    )


def test_cli_grid_overrides():
    from hf_tdiag.commands.study import add_arguments, build_grid

    p = add_arguments(argparse.ArgumentParser())
    args = p.parse_args(
        [
            "--grid",
            "tiny",
            "--axis",
            "learning_rate=0.01,0.02,0.03",
            "--set",
            "max_train_steps=7",
            "--set",
            "preset=crate-digits",
        ]
    )
    grid = build_grid(args)
    assert grid.axes["learning_rate"] == [0.01, 0.02, 0.03]
    assert grid.fixed["max_train_steps"] == 7 and grid.fixed["preset"] == "crate-digits"
    assert len(grid.runs()) == 2 * 3
    with pytest.raises(ValueError, match="grid axis"):
        build_grid(p.parse_args(["--grid", "tiny", "--set", "variant=crate"]))
    with pytest.raises(ValueError, match="KEY=VALUE"):
        build_grid(p.parse_args(["--grid", "tiny", "--set", "oops"]))


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_every_grid_run_is_a_valid_trainer_configuration(name, tmp_path):
    from hf_tdiag.training.args import make_args

    grid = GRIDS[name]
    for hp in grid.runs():
        args = make_args(output_dir=str(tmp_path), **grid.fixed, **hp)
        assert args.variant == hp["variant"] and args.stop_at_train_loss == 0.01
