"""Every number the Att-SVM head diagnostic, its evaluate module and its CLI report, checked once against an
independent computation: the model's own hidden states and attention, the Att-SVM as a least-distance problem
solved by scipy's NNLS (Lawson & Hanson), numpy projectors."""

import json

import evaluate
import numpy as np
import pytest
import torch

pytest.importorskip("cvxpy")  # the evaluate module's nuclear path; the reference below needs only scipy
from scipy.optimize import nnls  # noqa: E402

import hf_tdiag  # noqa: E402
from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor  # noqa: E402
from hf_tdiag.cli import main as cli_main  # noqa: E402
from hf_tdiag.inputs import digits_images  # noqa: E402

LAYER, HEAD, IMAGES = 1, 2, 2  # LAYER: 0-based index into the model's blocks; the API takes block LAYER + 1


def _least_distance(G: np.ndarray) -> np.ndarray:
    """``argmin ‖x‖ s.t. G x ≥ 1`` by Lawson & Hanson's reduction to NNLS (ch. 23): ``min ‖E u − f‖, u ≥ 0`` with
    ``E = [Gᵀ; 1ᵀ]``, ``f = e_{n+1}``; then ``x = −r_{1:n} / r_{n+1}`` for the residual ``r = E u − f``."""
    n = G.shape[1]
    E = np.vstack([G.T, np.ones((1, G.shape[0]))])
    f = np.zeros(n + 1)
    f[-1] = 1.0
    u, _ = nnls(E, f, maxiter=50 * G.shape[0])
    r = E @ u - f
    assert abs(r[-1]) > 1e-12, "the reference LDP is infeasible"
    return -r[:n] / r[-1]


def _reference(model, pixel_values):
    """The diagnostic's numbers from scratch: no hf_tdiag code past the model itself."""
    block = model.crate.encoder.layer[LAYER]
    with torch.no_grad():
        out = model(pixel_values=pixel_values, output_attentions=True, output_hidden_states=True)
        X = block.layernorm_before(out.hidden_states[LAYER]).double().numpy()  # (B, N, d): the head's input
    attn = out.attentions[LAYER][:, HEAD].double().numpy()  # (B, N, N)
    p = block.attention.head_dim
    U = block.attention.qkv.weight[HEAD * p : (HEAD + 1) * p].detach().double().numpy()  # (p, d)
    W_h = U.T @ U / np.sqrt(p)
    B, N, d = X.shape
    sel = attn.argmax(-1)
    queries = [(b, q) for b in range(B) for q in range(N)]
    # the Att-SVM, one constraint per (query, token), written naively
    A = np.array(
        [np.outer(X[b, sel[b, q]] - X[b, t], X[b, q]).ravel() for b, q in queries for t in range(N) if t != sel[b, q]]
    )
    W_mm = _least_distance(A).reshape(d, d)  # vec in row-major order: ⟨δ zᵀ, W⟩ = (δ ⊗ z)·vec(W)
    head_m = np.array(
        [min((X[b, sel[b, q]] - X[b, t]) @ W_h @ X[b, q] for t in range(N) if t != sel[b, q]) for b, q in queries]
    )
    head_m /= np.linalg.norm(W_h)
    svm_m = np.array(
        [min((X[b, sel[b, q]] - X[b, t]) @ W_mm @ X[b, q] for t in range(N) if t != sel[b, q]) for b, q in queries]
    )
    svm_m /= np.linalg.norm(W_mm)
    # what the inputs can see: projector onto the centred tokens (left) and onto the queries (right)
    C = np.concatenate([X[b] - X[b].mean(0) for b in range(B)])
    Z = X.reshape(B * N, d)
    W_vis = (np.linalg.pinv(C) @ C) @ W_h @ (np.linalg.pinv(Z) @ Z)
    corr = lambda A, Bm: float((A * Bm).sum() / (np.linalg.norm(A) * np.linalg.norm(Bm)))  # noqa: E731
    maxp = attn.max(-1).reshape(-1)
    srt = np.sort(head_m)
    return {
        "correlation": corr(W_h, W_mm),
        "correlation_in_span": corr(W_vis, W_mm),
        "margin_ratio": float(head_m.min() * np.linalg.norm(W_mm)),
        "svm_margin": float(1 / np.linalg.norm(W_mm)),
        "head_margin_min": float(head_m.min()),
        "head_margin_median": float(srt[(len(srt) - 1) // 2]),
        "one_hot_fraction": float((maxp >= 0.9).mean()),
        "one_hot_fraction_all": float((maxp >= 0.9).mean()),
        "num_queries": B * N,
        "num_constraints": B * N * (N - 1),
        "objective": float(np.linalg.norm(W_mm)),
        "head_margins": head_m,
        "svm_margins": svm_m,
        "max_probs": maxp,
        "selected": sel.reshape(-1),
        "mean_based_ratio": float(head_m.mean() * np.linalg.norm(W_mm)),
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.manual_seed(0)
    model = CrateForImageClassification(
        CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2)
    ).eval()
    path = tmp_path_factory.mktemp("crate_numbers")
    model.save_pretrained(path)
    images = digits_images(limit=IMAGES).images
    pixel_values = CrateImageProcessor.for_config(model.config)(images=images, return_tensors="pt")["pixel_values"]
    return str(path), model, images, pixel_values, _reference(model, pixel_values)


SCALARS = (
    "correlation",
    "correlation_in_span",
    "margin_ratio",
    "svm_margin",
    "head_margin_min",
    "head_margin_median",
    "one_hot_fraction",
    "one_hot_fraction_all",
)


def _check(summary: dict, arrays: dict | None, ref: dict) -> None:
    # the head's margins come from float32 hidden states: an error of ~1e-6 of the margins' scale, which is large
    # relative to a margin near zero (the minimum here is ~0.011 of a scale ~0.6), and its size depends on the CPU's
    # float32 kernels; the margins' tolerance is therefore absolute, relative to their scale
    scale = float(np.abs(ref["head_margins"]).max())
    atol = {"head_margin_min": 2e-5 * scale, "head_margin_median": 2e-5 * scale}
    atol["margin_ratio"] = atol["head_margin_min"] * ref["objective"]
    for key in SCALARS:
        assert summary[key] == pytest.approx(ref[key], rel=2e-5, abs=atol.get(key, 1e-9)), key
    assert summary["num_queries"] == ref["num_queries"]
    assert summary["svm"]["num_constraints"] == ref["num_constraints"]
    assert summary["svm"]["objective"] == pytest.approx(ref["objective"], rel=1e-6)
    assert summary["svm"]["feasible"] and 0 <= summary["svm"]["duality_gap"] < 1e-8
    if arrays is not None:
        order = np.lexsort((np.array(arrays["query_index"])[:, 1], np.array(arrays["query_index"])[:, 0]))
        for key in ("head_margins", "max_probs", "selected"):
            tol = atol["head_margin_min"] if key == "head_margins" else 1e-7
            np.testing.assert_allclose(np.array(arrays[key])[order], ref[key], rtol=2e-5, atol=tol, err_msg=key)
        # a query's smallest margin away from the support depends on W_mm beyond its norm: cvxpy's accuracy
        np.testing.assert_allclose(
            np.array(arrays["svm_margins"])[order], ref["svm_margins"], rtol=1e-3, err_msg="svm_margins"
        )


def test_reference_can_tell_the_plausible_bugs_apart(setup):
    """The data distinguish min from mean margins and the projected from the unprojected head matrix."""
    ref = setup[4]
    assert abs(ref["mean_based_ratio"] - ref["margin_ratio"]) > 0.05 * abs(ref["margin_ratio"])
    assert abs(ref["correlation_in_span"] - ref["correlation"]) > 1e-2


def test_diagnostic_numbers_against_the_independent_computation(setup):
    _, model, _, pixel_values, ref = setup
    diag = hf_tdiag.attention_svm_diagnostic(model, pixel_values, LAYER + 1, HEAD, max_queries=None)
    _check(diag.summary(), diag.to_dict(), ref)
    # the active set is what the returned W_mm makes tight: recount it from margins recomputed with W_mm
    W = diag.svm.W.numpy()
    with torch.no_grad():
        out = model(pixel_values=pixel_values, output_hidden_states=True)
        X = model.crate.encoder.layer[LAYER].layernorm_before(out.hidden_states[LAYER]).double().numpy()
    tight = 0
    for (b, q), a in zip(diag.query_index.tolist(), diag.selected.tolist()):
        tight += sum(float((X[b, a] - X[b, t]) @ W @ X[b, q]) <= 1 + 1e-7 for t in range(X.shape[1]) if t != a)
    assert diag.svm.num_active == tight
    assert np.linalg.norm(W) == pytest.approx(ref["objective"], rel=1e-6)


def test_evaluate_module_numbers_against_the_independent_computation(setup):
    path, _, images, _, ref = setup
    out = evaluate.load(hf_tdiag.metric_path("attention_svm")).compute(
        model=path, images=images, layer=LAYER + 1, head=HEAD, max_queries=0, return_report=True
    )  # 0 = every query, as on the CLI
    _check(out["report"], out["report"], ref)
    assert out["svm_num_constraints"] == ref["num_constraints"] and out["correlation"] == out["report"]["correlation"]


def test_cli_numbers_against_the_independent_computation(setup, tmp_path):
    path, _, _, _, ref = setup
    rc = cli_main(
        [
            "attention-svm",
            path,
            "--layer",
            str(LAYER + 1),
            "--head",
            str(HEAD),
            "--dataset",
            "digits",
            "--limit",
            str(IMAGES),
            "--max-queries",
            "0",
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert rc == 0
    head = json.loads((tmp_path / "attention_svm.json").read_text())["heads"][0]
    _check(head, head, ref)
