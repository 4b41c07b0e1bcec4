"""attention_svm evaluate module round trip (offline), hf-tdiag attention-svm command, figures."""

import json

import evaluate
import numpy as np
import pytest
import torch

pytest.importorskip("cvxpy")

import hf_tdiag  # noqa: E402
from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor  # noqa: E402
from hf_tdiag.cli import main as cli_main  # noqa: E402
from hf_tdiag.inputs import digits_images  # noqa: E402


@pytest.fixture(scope="module")
def crate_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2)
    model = CrateForImageClassification(cfg).eval()
    path = tmp_path_factory.mktemp("crate_svm")
    model.save_pretrained(path)
    return str(path), model


def test_evaluate_round_trip_matches_the_probe(crate_dir):
    path, model = crate_dir
    module = evaluate.load(hf_tdiag.metric_path("attention_svm"))
    images = digits_images(limit=4).images
    pixel_values = CrateImageProcessor.for_config(model.config)(images=images, return_tensors="pt")["pixel_values"]
    expected = hf_tdiag.attention_svm_diagnostic(model, pixel_values, 1, 0, max_queries=20)
    out = module.compute(model=path, images=images, layer=1, head=0, max_queries=20, return_report=True)["report"]
    assert out["correlation"] == pytest.approx(expected.correlation, rel=1e-9)
    assert out["margin_ratio"] == pytest.approx(expected.margin_ratio, rel=1e-9)
    assert out["num_queries"] == 20 and len(out["head_margins"]) == 20
    assert out["svm"]["feasible"] and out["svm"]["duality_gap"] < 1e-8
    json.dumps(out)
    # pixel values and add_batch give the same numbers
    out_pv = module.compute(
        model=model, pixel_values=pixel_values, layer=1, head=0, max_queries=20, return_report=False
    )
    assert out_pv["correlation"] == pytest.approx(out["correlation"], rel=1e-9)
    assert "head_margins" not in out_pv
    module.add_batch(images=images[:2])
    module.add_batch(images=images[2:])
    out_b = module.compute(model=path, layer=1, head=0, max_queries=20, return_report=True)["report"]
    np.testing.assert_allclose(out_b["head_margins"], out["head_margins"], rtol=1e-9)


def test_command_writes_json_and_figures(crate_dir, tmp_path, capsys):
    path, _ = crate_dir
    out_dir = tmp_path / "o"
    rc = cli_main(
        [
            "attention-svm",
            path,
            "--dataset",
            "digits",
            "--layer",
            "1",
            "--head",
            "all",
            "--limit",
            "3",
            "--max-queries",
            "12",
            "--output-dir",
            str(out_dir),
        ]
    )
    assert rc == 0
    data = json.loads((out_dir / "attention_svm.json").read_text())
    heads = data["heads"]
    num_heads = CrateConfig.from_preset("crate-digits").num_attention_heads
    assert [h["head"] for h in heads] == list(range(num_heads))
    for h in heads:
        assert h["num_queries"] == 12 and -1 <= h["correlation"] <= 1
        assert (out_dir / f"attention_svm_l1_h{h['head']}.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "margin ratio" in printed and "wrote" in printed
    assert cli_main(["attention-svm", path, "--dataset", "digits", "--layer", "9", "--head", "0"]) == 1
    assert cli_main(["attention-svm", path, "--dataset", "digits", "--layer", "1", "--head", "x"]) == 1
    assert cli_main(["attention-svm", path, "--dataset", "digits", "--layer", "1", "--queries", "a,b"]) == 1


def test_figures_for_the_recipe_rows():
    from hf_tdiag.viz.attention_svm import plot_correlation_curves, plot_gen_svm, plot_global_frequency, plot_rank

    fig = plot_correlation_curves({"W": ([0, 1, 2], [0.1, 0.5, 0.99])})
    assert len(fig.axes[0].lines) == 2  # curve + threshold
    fig = plot_global_frequency(
        [
            {"d": 2, "global": 0.2, "local": 0.5, "undetermined": 0.3},
            {"d": 8, "global": 1.0, "local": 0.0, "undetermined": 0.0},
        ]
    )
    assert len(fig.axes[0].lines) == 3
    fig = plot_rank([{"n": 2, "m": 4, "rank": 2}, {"n": 4, "m": 4, "rank": 4}])
    assert list(fig.axes[0].lines[0].get_ydata()) == [2, 4]
    fig = plot_gen_svm([{"correlation": 0.97, "direction_correlation": 0.9, "mean_selected": 2.0}])
    assert len(fig.axes) == 2
    with pytest.raises(ValueError, match="curves"):
        plot_correlation_curves({})
