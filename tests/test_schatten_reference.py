"""Brute-force dense reference for both bound proxies, and agreement of hf_tdiag.schatten_bounds with it.

``dense_reference`` forms every N×N / N×4N matrix explicitly from a BERT state dict
(hard-coded BERT parameter names, independent of the probe's discovery) and takes a plain
numpy SVD of each; it is also imported by ``benchmarks/bench_schatten.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel

import hf_tdiag


def bert_matrices(state_dict, num_layers, num_heads, prefix=None):
    """Explicit per-layer matrices (row-vector orientation) from a BERT state dict, by BERT parameter names."""
    sd = {k: v.detach().cpu().numpy().astype(np.float64) for k, v in state_dict.items()}
    if prefix is None:
        prefix = "encoder.layer" if "encoder.layer.0.attention.self.query.weight" in sd else "bert.encoder.layer"
    W = lambda i, name: sd[f"{prefix}.{i}.{name}.weight"]  # noqa: E731
    dh = W(0, "attention.self.query").shape[0] // num_heads
    layers = []
    for i in range(num_layers):
        wq, wk, wv = W(i, "attention.self.query"), W(i, "attention.self.key"), W(i, "attention.self.value")
        wo = W(i, "attention.output.dense")
        qk, vt = [], []
        for h in range(num_heads):
            rows = slice(h * dh, (h + 1) * dh)
            qk.append(wq[rows].T @ wk[rows])  # W_Q,hᵀ W_K,h
            vt.append(wv[rows].T @ wo.T[rows])  # W_V,hᵀ (W_O)ᵀ[rows of h]
        layers.append({"qk": qk, "v": vt, "m_in": W(i, "intermediate.dense").T, "m_out": W(i, "output.dense").T})
    return layers


def dense_reference(
    state_dict,
    num_layers,
    num_heads,
    L_phi=1.13,
    p_grid_m=None,
    rank_tol=1e-10,
    prefix=None,
    svd_call="values",
    convention="hf_tdiag",
):
    """B_Schatten, B_Edelman and per-matrix min contributions of a BERT state dict, one numpy SVD per explicit matrix."""
    layers = bert_matrices(state_dict, num_layers, num_heads, prefix)
    return dense_reference_from_matrices(layers, L_phi, p_grid_m, rank_tol, svd_call, convention)


SVD_CALLS = {
    # singular values only: np.linalg.svd(x, compute_uv=False)
    "values": lambda x: np.linalg.svd(x, compute_uv=False),
    # thin SVD with singular vectors: np.linalg.svd(x, full_matrices=False)
    "thin": lambda x: np.linalg.svd(x, full_matrices=False)[1],
    # numpy's defaults, as a plain call is written: np.linalg.svd(x) (full U and Vᵀ)
    "numpy_default": lambda x: np.linalg.svd(x)[1],
}


CONVENTIONS = ("hf_tdiag", "authors")


def dense_reference_from_matrices(
    layers, L_phi=1.13, p_grid_m=None, rank_tol=1e-10, svd_call="values", convention="hf_tdiag"
):
    """The same on explicit matrices: ``layers[i] = {"qk": [N×N]*H, "v": [N×N]*H, "m_in": N×I, "m_out": I×N or None}``.

    ``convention="hf_tdiag"`` sums σᵖ over the singular values above the rank threshold only;
    ``"authors"`` is the authors' public code (``schatten_p_power_from_svals``): for p > 0 the sum runs over
    **all** singular values of the dense SVD, round-off values of rank-deficient matrices included
    (p = 0 is the thresholded rank in both).
    Also returned, per matrix in the order of ``mins``: ``p_opt``, ``rank``, ``spectral``, ``stable_rank``,
    ``norm_2_1``, ``norm_1_1``,
    ``types``, and ``curves`` (c(W, p) on the grid).

    ``m_out = None`` stands for an identity M_out: norm 1 in the factors, no term of its own.
    ``svd_call`` picks how each matrix's SVD is called (``SVD_CALLS``: ``"values"``, ``"thin"``,
    ``"numpy_default"``); the spectra are the same, only the cost differs (the benchmark times all three).
    Matrix order of ``mins``: per layer, QK heads, Ṽ heads, M_in, M_out.
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention: expected one of {CONVENTIONS}, got {convention!r}")
    L = len(layers)
    num_heads = len(layers[0]["qk"])
    N = layers[0]["qk"][0].shape[0]
    m = math.ceil(L + math.log(N)) if p_grid_m is None else p_grid_m
    ps = [k / m for k in range(2 * m + 1)]

    def svd(x):
        s = SVD_CALLS[svd_call](x)
        tau = rank_tol * len(s) * max(s[0], 1.0)
        return s, s[s > tau]

    def col21(x):
        return float(np.sqrt((x**2).sum(axis=0)).sum())

    spec = [
        {
            "qk": [svd(x) for x in ly["qk"]],
            "v": [svd(x) for x in ly["v"]],
            "m_in": svd(ly["m_in"]),
            "m_out": None if ly["m_out"] is None else svd(ly["m_out"]),
        }
        for ly in layers
    ]
    nrm = lambda sv: 1.0 if sv is None else sv[0][0]  # noqa: E731
    alpha = []
    for i in range(L):
        a = 1.0
        for k in range(i + 1, L):
            s = sum(nrm(spec[k]["v"][h]) * (1 + 4 * nrm(spec[k]["qk"][h])) for h in range(num_heads))
            a *= L_phi * nrm(spec[k]["m_in"]) * nrm(spec[k]["m_out"]) * s
        alpha.append(a)

    def c(sv, p, gamma, a):
        all_s, kept = sv
        if p == 0:
            sp = float(len(kept))
        else:
            sp = float(np.sum((all_s if convention == "authors" else kept) ** p))
        scale = 1.0 if p == 0 else (gamma * a * L) ** (p / (p + 2))
        return sp ** (1 / (p + 2)) * scale * N ** ((p + 1) / (p + 2))

    out = {
        k: [] for k in ("mins", "p_opt", "rank", "spectral", "stable_rank", "norm_2_1", "norm_1_1", "types", "curves")
    }

    def add(typ, sv, x, gamma, a):
        curve = [c(sv, p, gamma, a) for p in ps]
        k = int(np.argmin(curve))  # first index on ties
        srank = float(np.sum(sv[1] ** 2) / sv[0][0] ** 2) if len(sv[1]) else 0.0
        for key, val in (
            ("mins", curve[k]),
            ("p_opt", ps[k]),
            ("rank", len(sv[1])),
            ("spectral", sv[0][0]),
            ("stable_rank", srank),
            ("norm_2_1", col21(x)),
            ("norm_1_1", float(np.abs(x).sum())),
            ("types", typ),
            ("curves", curve),
        ):
            out[key].append(val)

    for i in range(L):
        sp, ly = spec[i], layers[i]
        fin, fout = nrm(sp["m_in"]), nrm(sp["m_out"])
        for h in range(num_heads):
            add("qk", sp["qk"][h], ly["qk"][h], 2 * nrm(sp["v"][h]) * fout * fin, alpha[i])
        for h in range(num_heads):
            add("v", sp["v"][h], ly["v"][h], fout * fin, alpha[i])
        add("m_in", sp["m_in"], ly["m_in"], fout, alpha[i])
        if sp["m_out"] is not None:
            add("m_out", sp["m_out"], ly["m_out"], 1.0, alpha[i])
    mins = out["mins"]
    ours = sum(mins) + math.sqrt(L)

    total = 0.0
    for i in range(L):
        sp, ly = spec[i], layers[i]
        fin, fout = nrm(sp["m_in"]), nrm(sp["m_out"])
        xi = 0.0
        for h in range(num_heads):
            xi += (fout * fin * nrm(sp["v"][h]) * col21(ly["qk"][h])) ** (2 / 3)
            xi += (fout * fin * col21(ly["v"][h])) ** (2 / 3)
        xi += (fout * col21(ly["m_in"])) ** (2 / 3)
        if ly["m_out"] is not None:
            xi += col21(ly["m_out"]) ** (2 / 3)
        total += alpha[i] ** (2 / 3) * xi
    edelman = (1 + total) ** 1.5
    res = {k: np.array(v) for k, v in out.items()}
    res.update({"ours": ours, "edelman": edelman, "alpha": np.array(alpha), "p_grid": ps})
    return res


def _tiny_bert(L, H, A, vocab=64, seed=0, std=None):
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=H,
        num_hidden_layers=L,
        num_attention_heads=A,
        intermediate_size=4 * H,
        max_position_embeddings=32,
    )
    if std is not None:
        cfg.initializer_range = std
    return BertModel(cfg).eval()


@pytest.mark.parametrize("L,H,A,std", [(2, 128, 2, None), (4, 256, 4, None), (2, 128, 2, 0.2)])
def test_fast_path_matches_dense_reference_on_saved_miniature_shapes(tmp_path, L, H, A, std):
    model = _tiny_bert(L, H, A, std=std)
    folder = tmp_path / f"bert_uncased_L-{L}_H-{H}_A-{A}"
    model.save_pretrained(folder)
    rep = hf_tdiag.schatten_bounds(str(folder))  # the same path a Hub id takes
    reloaded = BertModel.from_pretrained(folder)
    ref = dense_reference(reloaded.state_dict(), L, A)
    assert rep.num_layers == L and rep.hidden_size == H and rep.num_heads == A
    assert rep.schatten_bound == pytest.approx(ref["ours"], rel=1e-9)
    assert rep.edelman_bound == pytest.approx(ref["edelman"], rel=1e-9)
    np.testing.assert_allclose([m.min_contribution for m in rep.matrices], ref["mins"], rtol=1e-9)
    np.testing.assert_allclose(rep.alpha, ref["alpha"], rtol=1e-9)
    # the in-memory model object gives the same numbers as its saved folder
    direct = hf_tdiag.schatten_bounds(model)
    assert direct.schatten_bound == pytest.approx(rep.schatten_bound, rel=1e-12)
    assert direct.edelman_bound == pytest.approx(rep.edelman_bound, rel=1e-12)


def test_dense_reference_agrees_on_low_rank_and_zero_heads():
    """Rank-deficient heads (zeroed query rows, rank-1 value rows, a zero FFN matrix) still agree exactly."""
    L, H, A = 2, 128, 2
    model = _tiny_bert(L, H, A, seed=3)
    dh = H // A
    with torch.no_grad():
        layer0 = model.encoder.layer[0]
        layer0.attention.self.query.weight[:dh] = 0.0  # QK of head 0 is the zero matrix
        layer0.attention.self.value.weight[dh : 2 * dh] = torch.outer(torch.randn(dh), torch.randn(H))  # Ṽ rank 1
        layer1 = model.encoder.layer[1]
        layer1.attention.self.key.weight[dh : dh + 10] = 0.0  # QK of head 1 has rank ≤ dh - 10
    rep = hf_tdiag.schatten_bounds(model)
    ref = dense_reference(model.state_dict(), L, A)
    assert rep.schatten_bound == pytest.approx(ref["ours"], rel=1e-9)
    assert rep.edelman_bound == pytest.approx(ref["edelman"], rel=1e-9)
    np.testing.assert_allclose([m.min_contribution for m in rep.matrices], ref["mins"], rtol=1e-9, atol=0)
    ranks = {(m.layer, m.head, m.type): m.rank for m in rep.matrices}
    assert ranks[(1, 0, "qk")] == 0
    assert ranks[(1, 1, "v")] == 1
    assert ranks[(2, 1, "qk")] == dh - 10
    assert ranks[(1, 1, "qk")] == dh
