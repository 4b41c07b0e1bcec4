"""The paper experiments (hf_tdiag.experiments.attention_gd.paper) on tiny settings, their figures' data, and the recipe."""

import importlib.util
import itertools
import json
import os

import numpy as np
import pytest
import torch

pytest.importorskip("cvxpy")

from scipy.optimize import nnls  # noqa: E402
from script_files import load_script

from hf_tdiag.experiments.attention_gd import make_trajectory_data, score_gap  # noqa: E402
from hf_tdiag.experiments.attention_gd.paper import (  # noqa: E402
    QUICK,
    gamma_filtered_instances,
    run_convergence,
    run_multitoken_tau,
    run_nonlinear,
    run_svm_rank,
    run_trajectories,
    waterfill_support,
)
from hf_tdiag.viz import attention_svm as V  # noqa: E402


def _ldp(G):
    """argmin ‖x‖ s.t. G x ≥ 1 (Lawson & Hanson's NNLS reduction): an SVM solver independent of hf_tdiag."""
    n = G.shape[1]
    E = np.vstack([G.T, np.ones((1, G.shape[0]))])
    f = np.zeros(n + 1)
    f[-1] = 1.0
    u, _ = nnls(E, f)
    r = E @ u - f
    return -r[:n] / r[-1]


def test_waterfill_support_hand_worked_and_brute_force():
    g = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
    # λ = 0.2: μ_2 = (1.5 − 0.4)/2 = 0.55 > 0.5 → one token; λ = 0.5: μ_3 = (1.5 − 1)/3 > 0 → two; λ = 1: three
    assert [int(waterfill_support(g, lam)) for lam in (0.0, 0.2, 0.5, 1.0)] == [1, 1, 2, 3]
    rng = np.random.default_rng(0)
    for _ in range(5):
        scores = rng.normal(size=5)
        lam = float(rng.uniform(0.05, 2.0))
        best, best_k = -np.inf, None
        for k in range(1, 6):  # brute force over supports: the optimum restricted to the top-k tokens
            top = np.sort(scores)[::-1][:k]
            s = (top - (top.sum() - 2 * lam) / k) / (2 * lam)
            if (s >= 0).all():
                val = s @ top - lam * (s @ s)
                if val > best:
                    best, best_k = val, k
        assert int(waterfill_support(torch.tensor(scores), lam)) == best_k


def test_trajectories_directions_against_an_independent_svm():
    cfg = dict(QUICK["trajectories"], steps=60)
    res = run_trajectories(cfg)
    data = make_trajectory_data(seed=cfg["seed"], T=cfg["T"])
    X, z, opt = data.X.numpy(), data.z.numpy(), data.optimal.numpy()
    G = np.array(
        [np.outer(X[i, opt[i]] - X[i, t], z[i]).ravel() for i in range(2) for t in range(cfg["T"]) if t != opt[i]]
    )
    W = _ldp(G).reshape(2, 2)
    np.testing.assert_allclose(np.array(res["svm_directions"]["fro"]), (W @ z.T).T, rtol=1e-6, atol=1e-9)
    top2 = np.sort((X @ data.v.numpy()) * data.Y.numpy()[:, None], axis=1)[:, -2:]
    assert res["score_gap"] == pytest.approx(float((top2[:, 1] - top2[:, 0]).min()))
    assert res["passes_gamma_0.1"] == (res["score_gap"] >= 0.1)
    assert np.array(res["paths"]["W"]).shape == (2, 61, 2)
    fig = V.plot_trajectories(res)
    assert len(fig.axes) == 1


def test_gamma_filtered_instances_keep_only_gaps_of_gamma():
    kept, tried = gamma_filtered_instances(6, 8, 5, 3, 0.1, base_seed=7)
    assert len(kept) == 3 and tried >= 3
    for data in kept:
        sc = (data.Y[:, None] * (data.X @ data.v)).numpy()
        top2 = np.sort(sc, axis=1)[:, -2:]
        assert (top2[:, 1] - top2[:, 0]).min() >= 0.1
        assert float(score_gap(data)) >= 0.1


def test_convergence_rows_and_their_figures():
    cfg = dict(QUICK["convergence"], d=[8], runs=3, steps=120)
    res = run_convergence(cfg)
    row = res["rows"][0]
    for param in ("W", "KQ"):
        assert sum(row[param][k] for k in ("global", "local", "undetermined")) == pytest.approx(1.0)
        # a share of 3 runs: k/3 for k in 0..3
        assert row[param]["selects_optimal"] * 3 == pytest.approx(round(row[param]["selects_optimal"] * 3))
        assert 0 <= round(row[param]["selects_optimal"] * 3) <= 3
    assert 0 <= row["assumption_B1"] <= 1 and row["runs"] == 3 and len(res["runs"]) == 3
    fig = V.plot_convergence(res, param="KQ")
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == pytest.approx(
        [row["KQ"]["global"], row["KQ"]["local"], row["KQ"]["undetermined"], row["assumption_B1"]]
    )
    fig = V.plot_margins(res)
    xs = np.concatenate([c.get_offsets()[:, 0] for c in fig.axes[0].collections])
    assert sorted(xs) == pytest.approx(sorted(r["global_margin"] for r in res["runs"]))


def test_nonlinear_runs_respect_the_exclusion_rule():
    cfg = dict(QUICK["nonlinear"], d=[6], runs=2, steps=201, chunk=16, max_seeds=200)
    res = run_nonlinear(cfg)
    row = res["rows"][0]
    assert row["kept"] <= 2
    assert all(g <= 1e-6 for g in row["Gamma"])  # kept runs have every masked probability ≤ 1e-6
    for key in ("svm_eq", "gen_svm", "one_token"):
        assert all(-1 - 1e-12 <= c <= 1 + 1e-12 for c in row["final_correlation"][key])
    if row["kept"]:
        fig = V.plot_gamma(res)
        pts = fig.axes[0].collections[0].get_offsets()
        np.testing.assert_allclose(pts[:, 0], np.maximum(row["Gamma"], 1e-300))


def test_tau_and_svm_rank_rows():
    res = run_multitoken_tau(dict(QUICK["multitoken_tau"], runs=1, steps=200))
    for row in res["rows"]:
        assert row["within_tau"] == (row["max_selected"] <= row["tau"])
    res = run_svm_rank(dict(QUICK["svm_rank"], d=[3, 6]))
    for row in res["rows"]:
        if row["feasible"]:
            assert row["rank_fro"] <= min(row["n"], row["d"]) and row["rank_nuc"] <= row["rank_fro"] + 1e-9
    fig = V.plot_svm_rank(res)
    assert list(fig.axes[0].lines[0].get_ydata()) == [r["rank_fro"] for r in res["rows"] if r["feasible"]]


def test_recipe_quick_writes_a_png_and_json_per_figure(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "recipe_attention_svm", os.path.join(os.path.dirname(__file__), "..", "recipes", "attention_svm.py")
    )
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    out = tmp_path / "r"
    assert (
        recipe.main(["--quick", "--output-dir", str(out), "--only", "trajectories", "rank_m", "multitoken_lambda"]) == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["figures"] == ["fig2_trajectories", "rank_vs_m", "fig10_lambda"]
    for name in summary["figures"]:
        assert (out / f"{name}.png").exists()
    rank = json.loads((out / "rank_vs_m.json").read_text())
    for row in rank["rows"]:
        assert row["rank_mean"] <= row["m"]  # W = K Qᵀ with K, Q ∈ R^{d×m}
    lam = json.loads((out / "fig10_lambda.json").read_text())
    assert lam["rows"][0]["lam"] == 0.0 and lam["rows"][0]["predicted_mean_selected"] == 1.0
    assert list(itertools.chain(summary["timings_s"])) == ["trajectories", "rank_m", "multitoken_lambda"]
    assert summary["settings"]["rank_m"]["m"] == [1, 5] and set(summary["load_average_1_5_15"]) == set(
        summary["timings_s"]
    )
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert recipe.main(["--quick", "--output-dir", str(out), "--only", "rank_m"]) == 1  # its figure is there
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert recipe.main(["--quick", "--output-dir", str(out), "--only", "rank_m", "--overwrite-output-dir"]) == 0
    again = json.loads((out / "summary.json").read_text())  # a later --only run adds to it
    assert again["figures"] == ["fig2_trajectories", "fig10_lambda", "rank_vs_m"]
    assert set(again["timings_s"]) == {"trajectories", "rank_m", "multitoken_lambda"}
    (out / "rank_vs_m.png").unlink()
    assert recipe.main(["--replot", "--dpi", "50", "--output-dir", str(out)]) == 0
    assert (out / "rank_vs_m.png").exists()


def _recipe():
    return load_script("recipes/attention_svm.py", "recipe_attention_svm")


def test_recipe_refuses_a_folder_holding_its_earlier_figure_before_running(tmp_path, capsys):
    recipe = _recipe()
    out = tmp_path / "r"
    out.mkdir()
    (out / "rank_vs_m.json").write_text('{"earlier": true}')
    assert recipe.main(["--quick", "--output-dir", str(out), "--only", "rank_m"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("attention_svm: ") and "--overwrite-output-dir" in err, err
    assert "rank_vs_m.json" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {"rank_vs_m.json": b'{"earlier": true}'}


def test_recipe_refuses_a_summary_of_the_other_size_and_keeps_other_figures(tmp_path, capsys):
    """A --only run adds to a summary.json of its own size (other experiments' figures are not clashes), but a
    paper-size summary is never replaced by a quick run's without the flag."""
    recipe = _recipe()
    out = tmp_path / "r"
    out.mkdir()
    (out / "summary.json").write_text('{"size": "paper", "figures": ["fig13_tau"]}')
    (out / "fig13_tau.json").write_text('{"paper": true}')
    assert recipe.main(["--quick", "--output-dir", str(out), "--only", "rank_m"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "summary.json" in err and "--overwrite-output-dir" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["fig13_tau.json", "summary.json"]
    assert (out / "summary.json").read_text() == '{"size": "paper", "figures": ["fig13_tau"]}'
    assert recipe.claim(recipe.parse_args(["--paper", "--output-dir", str(out), "--only", "rank_m"])) == []


def test_nonlinear_chunk_trains_the_relu_head_of_each_instance():
    from hf_tdiag.experiments.attention_gd import ReLUHead, attention_loss, make_relu_head_data
    from hf_tdiag.experiments.attention_gd.paper.nonlinear import _chunk

    cfg = dict(QUICK["nonlinear"], steps=3, record_every=1)
    data, gd = _chunk(cfg, 4, [1, 2], False)
    for r, seed in enumerate([1, 2]):
        inst, a = make_relu_head_data(cfg["n"], cfg["T"], 4, seed=seed)
        W0 = gd.snapshots[r, 0]
        relu = float(attention_loss(inst, W0, ReLUHead(a)))
        assert float(gd.loss[r, 0]) == pytest.approx(relu, rel=1e-12)
        assert abs(relu - float(attention_loss(inst, W0))) > 1e-6  # the linear head would give another loss


def test_local_runs_record_both_parameterizations_step_by_step():
    from hf_tdiag.experiments.attention_gd.paper.local import run_local

    res = run_local(dict(QUICK["local"], runs=2, steps=20, snapshot_every=10))
    assert set(res["params"]) == {"W", "KQ"}
    for entry in res["params"].values():
        assert entry["steps"] == [0, 10, 20]
        assert len(entry["max_prob"]["mean"]) == 3
        assert entry["final_max_prob_mean"] == pytest.approx(entry["max_prob"]["mean"][-1], rel=1e-12)
        # the mean over inputs of a softmax's largest probability of T = 8 tokens lies in [1/8, 1]
        assert all(1 / 8 - 1e-12 <= m <= 1 + 1e-12 for m in entry["max_prob"]["mean"])
        assert round(entry["selects_optimal"] * 2) in (0, 1, 2)  # a share of 2 runs
        assert entry["selects_optimal"] * 2 == pytest.approx(round(entry["selects_optimal"] * 2))
        for norm in ("fro", "nuc"):  # the selections of these seeds are separable: both SVMs exist
            final = entry[f"final_corr_{norm}"]
            assert final["runs"] == 2 and -1 - 1e-9 <= final["min"] <= final["mean"] <= 1 + 1e-9
            assert entry[f"corr_{norm}"]["mean"][-1] == pytest.approx(final["mean"], rel=1e-12)
