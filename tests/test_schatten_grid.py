"""hf_tdiag.study.schatten_grid and recipes/schatten_trained_grid.py: cells, cache/resume, and every number vs the dense reference."""

from __future__ import annotations

import csv
import importlib.util
import json
import os

import numpy as np
import pytest
from test_schatten_reference import dense_reference_from_matrices

from hf_tdiag.study import schatten_grid as G

RECIPE = os.path.join(os.path.dirname(__file__), "..", "recipes", "schatten_trained_grid.py")
PNG = b"\x89PNG\r\n\x1a\n"


def vit_matrices(model, cell):
    """Explicit matrices by ViT parameter names (vit.layers.i.attention.{q,k,v,o}_proj, mlp.fc1/fc2), not the probe."""
    sd = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    dh, H = cell.head_dim, cell.num_heads
    layers = []
    for i in range(cell.num_layers):
        W = lambda name: sd[f"vit.layers.{i}.{name}.weight"]  # noqa: E731, B023
        q, k, v, o = W("attention.q_proj"), W("attention.k_proj"), W("attention.v_proj"), W("attention.o_proj")
        rows = [slice(h * dh, (h + 1) * dh) for h in range(H)]
        layers.append(
            {
                "qk": [q[r].T @ k[r] for r in rows],
                "v": [v[r].T @ o.T[r] for r in rows],
                "m_in": W("mlp.fc1").T,
                "m_out": W("mlp.fc2").T,
            }
        )
    return layers


def _recipe():
    spec = importlib.util.spec_from_file_location("schatten_trained_grid", RECIPE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cells_keys_and_validation():
    a = G.GridCell(2, 64)
    assert a.num_heads == 2 and a.key() == G.GridCell(2, 64).key()
    assert a.key() != G.GridCell(2, 64, steps=201).key() != G.GridCell(4, 64).key()
    cells = G.grid_cells("cpu")
    assert {(c.num_layers, c.hidden_size) for c in cells} == {(L, N) for L in (2, 4, 6, 8) for N in (64, 128, 256)}
    assert all(c.num_heads == c.hidden_size // 32 for c in cells)
    gpu = G.grid_cells("gpu")
    assert len(gpu) == 24 and all(c.num_heads == c.hidden_size // 64 for c in gpu)
    assert [c.steps for c in G.grid_cells("cpu", [2], [64], steps=7)] == [7]
    with pytest.raises(ValueError, match="hidden_size"):
        G.GridCell(2, 48)
    with pytest.raises(ValueError, match="num_layers"):
        G.GridCell(0, 64)
    with pytest.raises(ValueError, match="name"):
        G.grid_cells("huge")
    with pytest.raises(ValueError, match="jobs"):
        G.run_grid([], "x", jobs=0)


def test_tiny_grid_numbers_cache_and_figures(tmp_path, capsys, one_torch_thread):
    recipe = _recipe()
    out = tmp_path / "grid"
    assert recipe.main(["--output-dir", str(out), "--grid", "tiny", "--detail-cell", "2", "32"]) == 0
    assert "2 trained now" in capsys.readouterr().out
    cells = G.grid_cells("tiny")
    for cell in cells:
        rec = G.load_record(cell, str(out))
        # initialisation: the same seed rebuilds the same weights; trained: the deterministic run again
        model = G.build_model(cell)
        ref_init = dense_reference_from_matrices(vit_matrices(model, cell))
        assert rec["init"]["schatten_bound"] == pytest.approx(ref_init["ours"], rel=1e-9)
        assert rec["init"]["edelman_bound"] == pytest.approx(ref_init["edelman"], rel=1e-9)
        metrics = G.train(model, cell, G.digits_tensors())
        ref = dense_reference_from_matrices(vit_matrices(model, cell))
        assert rec["trained"]["schatten_bound"] == pytest.approx(ref["ours"], rel=1e-9)
        assert rec["trained"]["edelman_bound"] == pytest.approx(ref["edelman"], rel=1e-9)
        assert rec["trained"]["mean_p_opt_qk"] == pytest.approx(np.mean(ref["p_opt"][ref["types"] == "qk"]), abs=1e-12)
        assert rec["trained"]["frac_p0_m_in"] == np.mean(ref["p_opt"][ref["types"] == "m_in"] == 0)
        assert rec["metrics"]["test_accuracy"] == metrics["test_accuracy"]
    # the full reports read back (spectra included) carry the record's numbers
    rep_init, rep_trained = G.load_report_pair(rec, str(out))
    assert (
        rep_trained.schatten_bound == rec["trained"]["schatten_bound"]
        and rep_init.edelman_bound == rec["init"]["edelman_bound"]
    )
    assert [m.p_opt for m in rep_trained.matrices] == list(ref["p_opt"])
    assert rep_trained.to_json() == type(rep_trained).from_json(rep_trained.to_json()).to_json()
    with open(out / "grid.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["stage"], int(r["num_layers"])) for r in rows] == [
        ("init", 1),
        ("init", 2),
        ("trained", 1),
        ("trained", 2),
    ]
    by = {(r["stage"], int(r["num_layers"])): r for r in rows}
    for stage in ("init", "trained"):  # per-curve normalisation at L = 2 (vs depth); one width: N = 32 (vs width)
        assert float(by[(stage, 2)]["schatten_bound_norm_depth"]) == 1.0
        assert float(by[(stage, 1)]["edelman_bound_norm_depth"]) == pytest.approx(
            float(by[(stage, 1)]["edelman_bound"]) / float(by[(stage, 2)]["edelman_bound"]), rel=1e-12
        )
        assert float(by[(stage, 1)]["schatten_bound_norm_width"]) == 1.0
    for fig in ("proxies_vs_depth", "proxies_vs_width", "p_opt", "spectra"):
        assert (out / f"{fig}.png").read_bytes()[:8] == PNG
    # resume: everything cached; a damaged record is trained again
    first = G.load_record(cells[0], str(out))
    with open(out / "runs" / f"{cells[0].key()}.json", "w") as fh:
        fh.write("{not json")
    assert recipe.main(["--output-dir", str(out), "--grid", "tiny"]) == 0
    assert "1 trained now" in capsys.readouterr().out
    again = G.load_record(cells[0], str(out))
    assert again["trained"]["schatten_bound"] == pytest.approx(first["trained"]["schatten_bound"], rel=1e-12)
    data = json.loads((out / "grid.json").read_text())
    assert len(data["records"]) == 2 and len(data["rows"]) == 4
    # a smaller grid would drop a cell from the tables: refused, the tables kept; with the flag replaced, cache kept
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert recipe.main(["--output-dir", str(out), "--grid", "tiny", "--layers", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--overwrite-output-dir" in err and "grid.json" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    argv = ["--output-dir", str(out), "--grid", "tiny", "--layers", "1", "--overwrite-output-dir"]
    assert recipe.main(argv) == 0
    assert "0 trained now" in capsys.readouterr().out
    assert len(json.loads((out / "grid.json").read_text())["records"]) == 1
    assert G.load_record(cells[1], str(out)) is not None  # the dropped cell stays cached


def test_recipe_refuses_tables_of_another_grid_before_training(tmp_path, capsys):
    out = tmp_path / "grid"
    out.mkdir()
    (out / "grid.json").write_text('{"rows": [], "records": [{"key": "0123456789abcdef"}]}')
    (out / "spectra.png").write_bytes(b"an earlier figure")
    assert _recipe().main(["--output-dir", str(out), "--grid", "tiny"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("schatten_trained_grid: ") and "--overwrite-output-dir" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {
        "grid.json": b'{"rows": [], "records": [{"key": "0123456789abcdef"}]}',
        "spectra.png": b"an earlier figure",
    }


def test_grid_figures_plot_the_rows():
    from hf_tdiag.viz.schatten import p_opt_summary, plot_init_vs_trained, plot_p_opt_init_vs_trained

    def rows(scale):
        return [
            {
                "num_layers": L,
                "hidden_size": N,
                "schatten_bound": scale * L * N,
                "edelman_bound": scale * L * L * N,
                **{f"mean_p_opt_{t}": 0.1 * L * scale for t in ("qk", "v", "m_in", "m_out")},
                **{f"frac_p0_{t}": 0.5 for t in ("qk", "v", "m_in", "m_out")},
            }
            for L in (2, 4)
            for N in (64, 128)
        ]

    fig = plot_init_vs_trained(rows(1.0), rows(2.0), "num_layers")
    left, right = fig.axes[:2]
    ed = {ln.get_label(): ln for ln in right.get_lines()}["B_Edelman, N=64"]
    assert list(ed.get_xdata()) == [2, 4] and list(ed.get_ydata()) == pytest.approx([1.0, 4.0])
    assert "after training" in right.get_title() and "initialisation" in left.get_title()
    pfig = plot_p_opt_init_vs_trained(rows(1.0), rows(2.0))
    trained = {ln.get_label(): ln for ln in pfig.axes[0].get_lines()}["N=128, trained"]
    assert list(trained.get_ydata()) == pytest.approx([0.4, 0.8])
    assert p_opt_summary(rows(1.0))["qk"] == {"mean_p_opt": pytest.approx(0.3), "frac_p0": 0.5}


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = ("seconds", "cached")


def _without_timing(rec):
    return {
        **{k: v for k, v in rec.items() if k not in TIMING},
        "metrics": {k: v for k, v in rec["metrics"].items() if k != "train_seconds"},
    }


def test_failed_cell_is_named_and_the_others_recorded(tmp_path, monkeypatch):
    cells = G.grid_cells("tiny")
    real = G.run_cell

    def run_cell(cell, cache_dir, device=None):
        if cell.num_layers == 2:
            raise FloatingPointError("loss is nan")
        return real(cell, cache_dir, device)

    monkeypatch.setattr(G, "run_cell", run_cell)
    lines = []
    with pytest.raises(RuntimeError, match=r"1 of 2 cells failed \(L=2 N=32\); first: FloatingPointError: loss is nan"):
        G.run_grid(cells, str(tmp_path), threads=1, log=lines.append)
    assert G.load_record(cells[0], str(tmp_path)) is not None and G.load_record(cells[1], str(tmp_path)) is None
    failed = [ln for ln in lines if "failed" in ln]
    assert len(failed) == 1 and "Traceback" in failed[0] and "loss is nan" in failed[0]


def test_ray_flags_need_the_ray_executor(capsys):
    with pytest.raises(SystemExit):
        _recipe().parse_args(["--output-dir", "x", "--ray-address", "auto"])
    assert "--ray-address: only used with --executor ray" in capsys.readouterr().err
    args = _recipe().parse_args(["--output-dir", "x", "--executor", "ray", "--ray-num-cpus", "2"])
    assert args.executor_options == {"address": None, "num_cpus": 2, "num_gpus": None, "max_retries": 1}


@pytest.mark.slow
def test_ray_executor_records_equal_the_local_ones(tmp_path, monkeypatch):
    """A real local Ray instance (2 CPUs) trains the tiny grid: every record and report equals the local executor's
    (one torch thread in both), and a second Ray run finds everything cached."""
    pytest.importorskip("ray")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))  # Ray's workers
    cells = G.grid_cells("tiny")
    local = G.run_grid(cells, str(tmp_path / "local"), threads=1, log=lambda s: None)
    remote = G.run_grid(cells, str(tmp_path / "ray"), jobs=2, threads=1, executor="ray", log=lambda s: None)
    assert [r["cached"] for r in local + remote] == [False] * 4
    assert [_without_timing(r) for r in remote] == [_without_timing(r) for r in local]
    assert remote[0]["torch_threads"] == 1
    for cell in cells:
        for stage in ("init", "trained"):
            name = f"{cell.key()}_{stage}.json"
            assert (tmp_path / "ray" / "reports" / name).read_bytes() == (
                tmp_path / "local" / "reports" / name
            ).read_bytes()
    again = G.run_grid(cells, str(tmp_path / "ray"), threads=1, executor="ray", log=lambda s: None)
    assert [r["cached"] for r in again] == [True, True]
