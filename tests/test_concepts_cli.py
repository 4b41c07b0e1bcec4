"""concept_fidelity evaluate module, `hf-tdiag concept-fidelity`, compare_concepts and the figures."""

import json

import evaluate
import pytest
import torch
from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

import hf_tdiag
from hf_tdiag import CrateConfig, CrateForImageClassification
from hf_tdiag.cli import main
from hf_tdiag.diagnostics.concept_fidelity import compare_concepts, concept_fidelity
from hf_tdiag.measures.concepts import SemiNMF, match_concepts

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _vit_folder(path):
    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=10,
    )
    model = ViTForImageClassification(cfg).eval()
    model.save_pretrained(path)
    ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5], image_std=[0.5]).save_pretrained(path)
    return model


def _pixels(n=24):
    from sklearn.datasets import load_digits

    X = load_digits().images[:n]
    return torch.tensor(X, dtype=torch.float32)[:, None] / 8 - 1


def test_evaluate_module_matches_the_python_api(tmp_path):
    model = _vit_folder(tmp_path / "vit")
    pixels = _pixels(16)
    cf = evaluate.load(hf_tdiag.metric_path("concept_fidelity"))
    out = cf.compute(
        model=str(tmp_path / "vit"),
        pixel_values=pixels,
        layer=1,
        n_concepts=4,
        gram_weight=1.0,
        max_iter=30,
        refine_iter=10,
        power_iters=3,
        progress=False,
        return_report=True,
    )["report"]
    ref = concept_fidelity(
        model, pixels, 1, SemiNMF(4, gram_weight=1.0, max_iter=30, refine_iter=10), power_iters=3, progress=False
    )
    for key in (
        "kl",
        "delta_rec",
        "delta_gram",
        "bound_certified",
        "bound_certified_chain",
        "bound_estimated",
        "top1_agreement",
        "frac_kl_below_bound_certified",
        "frac_kl_below_bound_estimated",
    ):
        assert out[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-12), key
    assert out["constants_estimated"]["l_block"] == pytest.approx(ref["constants_estimated"]["l_block"], rel=1e-5)
    assert {"rec_loss", "gram_loss"} <= set(out["history"])
    assert len(out["per_image"]["kl"]) == 16
    # PIL images through evaluate's storage give the same activations as the processor's pixel values
    from hf_tdiag.inputs import digits_images

    images = digits_images(limit=16).images
    out2 = cf.compute(
        model=str(tmp_path / "vit"),
        images=images,
        layer=1,
        n_concepts=4,
        max_iter=30,
        bounds=False,
        progress=False,
        return_report=True,
        return_per_image=False,
    )["report"]
    processed = ViTImageProcessor.from_pretrained(tmp_path / "vit")(images=images, return_tensors="pt")["pixel_values"]
    assert torch.allclose(processed, pixels, atol=0.02)  # the same digits, rounded to uint8 first
    ref2 = concept_fidelity(model, processed, 1, SemiNMF(4, max_iter=30), bounds=False, progress=False)
    assert out2["delta_gram"] == pytest.approx(ref2["delta_gram"], rel=1e-6)
    assert "per_image" not in out2
    with pytest.raises(ValueError, match="layer"):
        cf.compute(model=model, pixel_values=pixels)


def test_compare_concepts_table_and_agreement():
    torch.manual_seed(0)
    model = CrateForImageClassification(
        CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2)
    ).eval()
    pixels = _pixels(20)
    out = compare_concepts(
        model,
        pixels,
        1,
        4,
        gram_weights=(0.0, 5.0),
        supervised=True,
        kl_weight=50.0,
        max_iter=30,
        refine_iter=15,
        supervised_iter=15,
        power_iters=3,
        progress=False,
    )
    assert [r["method"] for r in out["table"]] == ["plain", "gram(mu=5)", "supervised"]
    sup = out["estimators"]["supervised"]
    for label in ("plain", "gram(mu=5)"):
        ref = match_concepts(out["estimators"][label].components_, sup.components_)["mean_cosine"]
        assert out["agreement"][label]["mean_cosine"] == pytest.approx(ref)
    # the plain fit is the common start: its move is zero
    assert out["agreement"]["plain"]["update_cosine"] is None
    assert torch.allclose(sup.start_components_, out["estimators"]["plain"].components_)
    row = out["table"][1]
    assert row["delta_gram"] == pytest.approx(out["runs"]["gram(mu=5)"]["delta_gram"])
    assert out["runs"]["gram(mu=5)"]["delta_gram"] < out["runs"]["plain"]["delta_gram"]


def test_cli_writes_json_table_and_figures(tmp_path, capsys):
    _vit_folder(tmp_path / "vit")
    outdir = tmp_path / "out"
    code = main(
        [
            "concept-fidelity",
            str(tmp_path / "vit"),
            "--layer",
            "1",
            "--concepts",
            "4",
            "--dataset",
            "digits",
            "--limit",
            "24",
            "--gram-weight",
            "0",
            "2",
            "--supervised",
            "--max-iter",
            "20",
            "--refine-iter",
            "10",
            "--power-iters",
            "3",
            "--output-dir",
            str(outdir),
        ]
    )
    assert code == 0
    data = json.loads((outdir / "concept_fidelity.json").read_text())
    assert data["layer"] == 1 and data["inputs"]["count"] == 24 and data["inputs"]["kind"] == "images"
    assert set(data["runs"]) == {"plain", "gram(mu=2)", "supervised"}
    for name in ("heatmaps.png", "top_patches.png", "kl_vs_bound.png", "mu_sweep.png", "table.txt"):
        assert (outdir / name).stat().st_size > 0, name
    printed = capsys.readouterr().out
    assert "gram(mu=2)" in printed and "supervised" in printed
    assert (
        main(
            [
                "concept-fidelity",
                str(tmp_path / "vit"),
                "--layer",
                "9",
                "--dataset",
                "digits",
                "--limit",
                "8",
                "--output-dir",
                str(tmp_path / "out_bad_layer"),  # a fresh folder: the one above now holds results
            ]
        )
        == 1
    )
    assert "layer" in capsys.readouterr().err


def test_figures_draw_from_reports():
    from hf_tdiag.viz.concept_fidelity import plot_concept_heatmaps, plot_kl_vs_bound, plot_mu_sweep, plot_top_patches

    pixels = _pixels(6)
    codes = torch.rand(6, 16, 5)
    fig = plot_concept_heatmaps(pixels, codes, (4, 4), n_images=3, n_concepts=2)
    assert len(fig.axes) == 3 * 3 + 1  # images × (image + 2 concepts) + colorbar
    fig = plot_top_patches(pixels, codes, (4, 4), n_concepts=2, top=4)
    assert len(fig.axes) == 8
    rep = {"per_image": {"kl": [0.1, 0.2], "bound_certified": [1.0, 0.1]}, "frac_kl_below_bound_certified": 0.5}
    fig = plot_kl_vs_bound({"a": rep}, kind="certified")
    assert "50%" in fig.axes[0].get_legend().get_texts()[0].get_text()
    fig = plot_mu_sweep(
        [{"gram_weight": 0.0, "delta_gram": 0.1, "kl": 0.02}, {"gram_weight": 1.0, "delta_gram": 0.05, "kl": 0.01}]
    )
    assert list(fig.axes[0].lines[0].get_ydata()) == [0.1, 0.05]
    with pytest.raises(ValueError, match="grid"):
        plot_concept_heatmaps(pixels, codes, (3, 3))
    with pytest.raises(ValueError, match="bound"):
        plot_kl_vs_bound({"a": {"per_image": {"kl": [0.1]}}})


def test_agreement_numbers_against_brute_force():
    """compare_concepts' agreement: the best permutation by enumeration and the update cosine by hand (numpy)."""
    import itertools

    import numpy as np

    torch.manual_seed(0)
    model = CrateForImageClassification(
        CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2)
    ).eval()
    out = compare_concepts(
        model,
        _pixels(12),
        1,
        4,
        gram_weights=(0.0, 3.0),
        supervised=True,
        kl_weight=50.0,
        max_iter=20,
        refine_iter=10,
        supervised_iter=10,
        bounds=False,
        progress=False,
    )
    sup = out["estimators"]["supervised"].components_.double().numpy()
    start = out["estimators"]["supervised"].start_components_.double().numpy()
    for label in ("plain", "gram(mu=3)"):
        D = out["estimators"][label].components_.double().numpy()
        cos = (D / np.linalg.norm(D, axis=1, keepdims=True)) @ (sup / np.linalg.norm(sup, axis=1, keepdims=True)).T
        best = max(sum(cos[i, p[i]] for i in range(4)) for p in itertools.permutations(range(4))) / 4
        assert out["agreement"][label]["mean_cosine"] == pytest.approx(best, rel=1e-12)
        a, b = (D - start).ravel(), (sup - start).ravel()
        expected = None if np.linalg.norm(a) == 0 else float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        assert out["agreement"][label]["update_cosine"] == (
            pytest.approx(expected, rel=1e-9) if expected is not None else None
        )
