"""The schatten evaluate module, the `hf-tdiag schatten` command, the miniatures recipe and its figures."""

from __future__ import annotations

import csv
import importlib.util
import json
import os

import evaluate
import numpy as np
import pytest
import torch
from test_schatten_reference import dense_reference
from transformers import BertConfig, BertModel, GPTNeoXConfig, GPTNeoXModel

import hf_tdiag
from hf_tdiag.cli import main as cli_main

RECIPE = os.path.join(os.path.dirname(__file__), "..", "recipes", "schatten_bert_miniatures.py")
PNG = b"\x89PNG\r\n\x1a\n"


def _save_bert(folder, L, H, seed=0):
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=40,
        hidden_size=H,
        num_hidden_layers=L,
        num_attention_heads=H // 64,
        intermediate_size=4 * H,
        max_position_embeddings=16,
    )
    BertModel(cfg).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def miniatures(tmp_path_factory):
    root = tmp_path_factory.mktemp("miniatures")
    for i, (L, H) in enumerate([(1, 64), (2, 64), (1, 128), (2, 128)]):  # miniature names, small shapes
        _save_bert(root / f"bert_uncased_L-{L}_H-{H}_A-{H // 64}", L, H, seed=i)
    return root


def test_metric_on_folders_objects_and_add_batch(miniatures):
    folder = str(miniatures / "bert_uncased_L-2_H-128_A-2")
    direct = hf_tdiag.schatten_bounds(folder)
    metric = evaluate.load(hf_tdiag.metric_path("schatten"))
    out = metric.compute(models=[folder], return_report=True)  # one model: scalars, the full report on request
    assert out["schatten_bound"] == pytest.approx(direct.schatten_bound, rel=1e-12)
    assert out["edelman_bound"] == pytest.approx(direct.edelman_bound, rel=1e-12)
    assert (out["num_layers"], out["hidden_size"], out["num_heads"]) == (2, 128, 2)
    assert out["report"]["model"] == folder and out["report"]["matrices"][0]["type"] == "qk"
    model = BertModel.from_pretrained(folder)
    ref = dense_reference(model.state_dict(), 2, 2)
    mixed = metric.compute(models=[model, folder], L_phi=1.13)
    assert mixed["schatten_bound"] == [pytest.approx(ref["ours"], rel=1e-9)] * 2
    metric.add_batch(models=[folder])
    assert metric.compute()["edelman_bound"] == pytest.approx(ref["edelman"], rel=1e-9)
    with pytest.raises(ValueError, match="models"):
        metric.compute(models=[])
    with pytest.raises(ValueError, match="predictions"):
        metric.compute(predictions=[1])
    with pytest.raises(TypeError, match="models"):
        metric.compute(models=[model, 3])


def test_cli_schatten_writes_table_csv_json_and_figures(miniatures, tmp_path, capsys):
    folders = [str(miniatures / "bert_uncased_L-1_H-64_A-1"), str(miniatures / "bert_uncased_L-2_H-128_A-2")]
    rc = cli_main(
        [
            "schatten",
            *folders,
            "--csv",
            str(tmp_path / "s.csv"),
            "--json",
            str(tmp_path / "s.json"),
            "--matrices-csv",
            str(tmp_path / "m.csv"),
            "--plots",
            str(tmp_path / "plots"),
            "--p-grid-m",
            "4",
            "--workers",
            "2",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    reports = [hf_tdiag.schatten_bounds(f, p_grid_m=4) for f in folders]
    for r in reports:
        assert f"{r.schatten_bound:.6g}" in printed and f"{r.edelman_bound:.6g}" in printed
    with open(tmp_path / "s.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [float(r["schatten_bound"]) for r in rows] == [pytest.approx(r.schatten_bound, rel=1e-12) for r in reports]
    data = json.loads((tmp_path / "s.json").read_text())
    assert [d["edelman_bound"] for d in data] == [pytest.approx(r.edelman_bound, rel=1e-12) for r in reports]
    assert data[1]["p_grid"] == [k / 4 for k in range(9)]
    with open(tmp_path / "m.csv", newline="") as fh:
        mrows = list(csv.DictReader(fh))
    assert len(mrows) == sum(len(r.matrices) for r in reports)
    assert mrows[0]["shape"] == "64x64" and mrows[0]["type"] == "qk"
    pngs = sorted(os.listdir(tmp_path / "plots"))
    assert len(pngs) == 8 and all((tmp_path / "plots" / p).read_bytes()[:8] == PNG for p in pngs)


def test_cli_reports_unsupported_models_as_errors(tmp_path, capsys):
    GPTNeoXModel(
        GPTNeoXConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, vocab_size=20, intermediate_size=64)
    ).save_pretrained(tmp_path / "g")
    assert cli_main(["schatten", str(tmp_path / "g")]) == 1
    assert "'gpt_neox') is not a supported decoder" in capsys.readouterr().err
    assert cli_main(["schatten", str(tmp_path / "nothing-here")]) == 1
    with pytest.raises(SystemExit) as exit_info:  # refused by the parser, naming the flag
        cli_main(["schatten", str(tmp_path / "g"), "--workers", "0"])
    assert exit_info.value.code == 2
    assert "--workers: expected a positive integer, got '0'" in capsys.readouterr().err


def _recipe():
    spec = importlib.util.spec_from_file_location("schatten_bert_miniatures", RECIPE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_miniatures_recipe_on_local_copies(miniatures, tmp_path, capsys):
    recipe = _recipe()
    assert recipe.miniature_name(12, 768) == "bert_uncased_L-12_H-768_A-12"
    assert recipe.miniature_source("bert_uncased_L-2_H-128_A-2", None) == "google/bert_uncased_L-2_H-128_A-2"
    out = tmp_path / "out"
    rc = recipe.main(
        ["--output_dir", str(out), "--local_dir", str(miniatures), "--layers", "1", "2", "3", "--hidden", "64", "128"]
    )
    assert rc == 0
    assert "bert_uncased_L-3_H-128_A-2" in capsys.readouterr().err  # reported missing, skipped
    with open(out / "miniatures.csv", newline="") as fh:
        rows = {r["name"]: r for r in csv.DictReader(fh)}
    assert sorted(rows) == sorted(p.name for p in miniatures.iterdir())
    for name, row in rows.items():
        rep = hf_tdiag.schatten_bounds(str(miniatures / name))
        assert float(row["schatten_bound"]) == pytest.approx(rep.schatten_bound, rel=1e-12)
        assert float(row["edelman_bound"]) == pytest.approx(rep.edelman_bound, rel=1e-12)
    # per curve, as the paper: vs width at N = 128 (same L), vs depth at L = 2 (same N)
    val = lambda L, H, k: float(rows[f"bert_uncased_L-{L}_H-{H}_A-{H // 64}"][k])  # noqa: E731
    for L in (1, 2):
        assert val(L, 128, "schatten_bound_norm_width") == 1.0
        assert val(L, 64, "edelman_bound_norm_width") == pytest.approx(
            val(L, 64, "edelman_bound") / val(L, 128, "edelman_bound"), rel=1e-12
        )
    for H in (64, 128):
        assert val(2, H, "edelman_bound_norm_depth") == 1.0
        assert val(1, H, "schatten_bound_norm_depth") == pytest.approx(
            val(1, H, "schatten_bound") / val(2, H, "schatten_bound"), rel=1e-12
        )
    data = json.loads((out / "miniatures.json").read_text())
    assert data["normalized_at"] == {"hidden_size": 128, "num_layers": 2} and len(data["reports"]) == 4
    full = json.loads((out / "reports" / "bert_uncased_L-2_H-128_A-2.json").read_text())
    assert len(full["matrices"]) == 2 * (2 * 2 + 2) and "singular_values" in full["matrices"][0]
    for fig in (
        "proxies_vs_width",
        "proxies_vs_depth",
        "norm_scaling",
        "spectral_decay",
        "optimal_p",
        "optimal_p_histogram",
        "contribution_vs_p",
    ):
        assert (out / f"{fig}.png").read_bytes()[:8] == PNG
    with pytest.raises(SystemExit):
        recipe.main(["--output_dir", str(out), "--local_dir", str(tmp_path / "empty")])
    # a second run into the same folder is refused, the earlier tables kept; with the flag they are replaced
    before = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    argv = ["--output-dir", str(out), "--local-dir", str(miniatures), "--layers", "1", "--hidden", "64"]
    capsys.readouterr()
    assert recipe.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--overwrite-output-dir" in err and "miniatures.csv" in err, err
    assert {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert recipe.main([*argv, "--detail-model", "bert_uncased_L-1_H-64_A-1", "--overwrite-output-dir"]) == 0
    with open(out / "miniatures.csv", newline="") as fh:
        assert [r["name"] for r in csv.DictReader(fh)] == ["bert_uncased_L-1_H-64_A-1"]
    assert sorted(os.listdir(out / "reports")) == ["bert_uncased_L-1_H-64_A-1.json"]  # the earlier reports gone


def test_miniatures_recipe_refuses_its_earlier_results_before_reading_a_model(miniatures, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "reports").mkdir(parents=True)
    (out / "reports" / "bert_uncased_L-1_H-64_A-1.json").write_text('{"earlier": true}')
    (out / "notes.txt").write_text("mine")
    recipe = _recipe()
    assert (
        recipe.main(["--output-dir", str(out), "--local-dir", str(miniatures), "--layers", "1", "--hidden", "64"]) == 1
    )
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and err.startswith("schatten_bert_miniatures: ") and "--overwrite-output-dir" in err
    )
    assert "bert_uncased_L-1_H-64_A-1.json" in err
    assert {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()} == {
        "notes.txt": b"mine",
        os.path.join("reports", "bert_uncased_L-1_H-64_A-1.json"): b'{"earlier": true}',
    }


def test_scaling_figures_normalise_each_curve_as_the_paper():
    from hf_tdiag.viz.schatten import plot_proxies_vs_depth, plot_proxies_vs_width, scaling_curves

    rows = [
        {"num_layers": L, "hidden_size": N, "schatten_bound": 10.0 * L + N, "edelman_bound": 100.0 * L * N}
        for L in (2, 4)
        for N in (64, 128, 256)
    ]
    fig = plot_proxies_vs_width(rows)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "proxy / same curve at N=128"
    lines = {line.get_label(): line for line in ax.get_lines()}
    ours_l2 = lines["B_Schatten (spectrum-adaptive), L=2"]
    assert list(ours_l2.get_xdata()) == [64, 128, 256]
    assert list(ours_l2.get_ydata()) == pytest.approx([(20 + 64) / (20 + 128), 1.0, (20 + 256) / (20 + 128)])
    ed_l4 = lines["B_Edelman, L=4"]  # each curve by its own N = 128 value: 400·N / (400·128)
    assert list(ed_l4.get_ydata()) == pytest.approx([0.5, 1.0, 2.0])
    depth = plot_proxies_vs_depth(rows).axes[0]
    ours_n256 = {line.get_label(): line for line in depth.get_lines()}["B_Schatten (spectrum-adaptive), N=256"]
    assert list(ours_n256.get_xdata()) == [2, 4]
    assert list(ours_n256.get_ydata()) == pytest.approx([1.0, (40 + 256) / (20 + 256)])
    # a curve without the paper's point is normalised at its smallest x, and the label says so
    curves = scaling_curves([r for r in rows if r["hidden_size"] != 128], "hidden_size")
    assert curves[(4, "schatten_bound")]["at"] == 64 and list(curves[(4, "schatten_bound")]["y"]) == pytest.approx(
        [1.0, 296 / 104]
    )
    with pytest.raises(ValueError, match="edelman_bound"):
        plot_proxies_vs_width([{"num_layers": 2, "hidden_size": 128, "schatten_bound": 1.0}])
    with pytest.raises(ValueError, match="x_key"):
        scaling_curves(rows, "heads")


def test_norm_scaling_figure_plots_the_dense_norms_at_fixed_depth(miniatures):
    """The paper's norm-scaling figure: per type, the mean (2,1)/(1,1)/spectral norm vs N at L = 2, from the dense reference."""
    from hf_tdiag.viz.schatten import plot_norm_scaling

    folders = {H: str(miniatures / f"bert_uncased_L-2_H-{H}_A-{H // 64}") for H in (64, 128)}
    reports = [hf_tdiag.schatten_bounds(f) for f in folders.values()]
    reports.append(hf_tdiag.schatten_bounds(str(miniatures / "bert_uncased_L-1_H-64_A-1")))  # other depth: left out
    fig = plot_norm_scaling(reports, num_layers=2)
    refs = {H: dense_reference(BertModel.from_pretrained(f).state_dict(), 2, H // 64) for H, f in folders.items()}
    for ax, key in zip(fig.axes, ("norm_2_1", "norm_1_1", "spectral")):
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        for label, t in (("QK (per head)", "qk"), ("M_out", "m_out")):
            assert list(lines[label].get_xdata()) == [64, 128]
            expect = [np.mean(refs[H][key][refs[H]["types"] == t]) for H in (64, 128)]
            np.testing.assert_allclose(lines[label].get_ydata(), expect, rtol=1e-9)
    with pytest.raises(ValueError, match="num_layers = 3"):
        plot_norm_scaling(reports, num_layers=3)
