"""Figs 9 and 12: GD with the nonlinear head ``1ᵀReLU(Vᵀu)`` against the Gen-SVM equivalence and the one-token SVM.

As the authors' notebook: n = 3, T = 4, unit tokens and queries, ``V`` Gaussian with ``‖V‖_F = 1``, labels
±1 (instances without a −1 label are skipped), ``W`` from ``nn.Linear``'s initialization, normalized GD
(η = 0.1, 2001 steps). A run is dropped when some final probability lies in ``(1e-6, 1e-3]`` or none is
``≤ 1e-6`` (:func:`~hf_tdiag.experiments.attention_gd.gen_svm_excluded`), or when an SVM is infeasible,
until ``runs`` runs are kept per d. For each kept run the stored iterates are compared with
``W^SVMeq = W_fin + R·W_dir`` (the Gen-SVM equivalence, ``R`` fitted to the last iterate), ``W_dir``
(the Gen-SVM direction alone, "W^mm") and ``W^1token`` (the Att-SVM of the argmax tokens). Fig. 12 plots
``1 − corr(W, W^SVMeq)`` against ``Γ = max_{i, τ ∉ O_i} s_iτ``, the largest masked probability.
"""

from __future__ import annotations

import torch

from ....measures.attention_svm import att_svm
from ..data import make_relu_head_data, stack_data
from ..gen_svm import gen_svm_excluded, gen_svm_fit
from ..heads import ReLUHead
from ..train import train_attention_batch
from .common import batched_correlation

__all__ = ["run_nonlinear"]


def _chunk(cfg: dict, d: int, seeds: list[int], progress: bool):
    pairs = [make_relu_head_data(cfg["n"], cfg["T"], d, seed=s) for s in seeds]
    data = stack_data(p[0] for p in pairs)
    head = ReLUHead(torch.stack([p[1] for p in pairs]))
    gd = train_attention_batch(
        data,
        param="W",
        steps=cfg["steps"],
        lr=cfg["lr"],
        init=cfg["init"],
        head=head,
        seed=seeds[0],
        record_every=cfg["record_every"],
        snapshot_every=cfg["record_every"],
        progress=progress,
    )
    return data, gd


def _evaluate_run(data, W_final: torch.Tensor, snapshots: torch.Tensor, low: float, high: float):
    """``(reason, record)``: why the run is dropped, or its correlation curves and Γ."""
    probs = torch.softmax(torch.einsum("ntd,de,ne->nt", data.X, W_final, data.z), -1)
    reason = gen_svm_excluded(probs, low=low, high=high)
    if reason is not None:
        return reason, None
    fit = gen_svm_fit(data.X, data.z, W_final, threshold=high)
    single = att_svm(data.X, data.z, probs.argmax(-1))
    if not fit.svm.feasible or not single.feasible:
        return "infeasible", None
    refs = {"svm_eq": fit.W_pred, "gen_svm": fit.W_dir, "one_token": single.W}
    curves = {k: batched_correlation(snapshots, ref).tolist() for k, ref in refs.items()}
    gamma = float(probs[~fit.selected].max())
    return None, {"curves": curves, "Gamma": gamma, "mean_selected": float(fit.selected.sum(1).double().mean())}


def _run_d(cfg: dict, d: int, progress: bool) -> dict:
    kept, dropped, seed = [], {"ambiguous": 0, "finite": 0, "infeasible": 0, "no_negative_label": 0}, 1
    steps = None
    while len(kept) < cfg["runs"] and seed <= cfg["max_seeds"]:
        seeds = []
        while len(seeds) < cfg["chunk"] and seed <= cfg["max_seeds"]:
            if bool((make_relu_head_data(cfg["n"], cfg["T"], d, seed=seed)[0].Y < 0).any()):
                seeds.append(seed)
            else:
                dropped["no_negative_label"] += 1
            seed += 1
        data, gd = _chunk(cfg, d, seeds, progress)
        steps = gd.snapshot_steps.tolist()
        for r in range(len(seeds)):
            if len(kept) == cfg["runs"]:
                break
            reason, rec = _evaluate_run(data.run(r), gd.W[r], gd.snapshots[r], cfg["low"], cfg["high"])
            if reason is None:
                kept.append(rec)
            else:
                dropped[reason] += 1
    mean = (
        {
            k: torch.tensor([r["curves"][k] for r in kept], dtype=torch.float64).mean(0).tolist()
            for k in ("svm_eq", "gen_svm", "one_token")
        }
        if kept
        else {}
    )
    return {
        "d": d,
        "kept": len(kept),
        "dropped": dropped,
        "steps": steps,
        "mean_correlation": mean,
        "final_correlation": {k: [r["curves"][k][-1] for r in kept] for k in ("svm_eq", "gen_svm", "one_token")},
        "Gamma": [r["Gamma"] for r in kept],
        "mean_selected": [r["mean_selected"] for r in kept],
    }


def run_nonlinear(cfg: dict, progress: bool = False) -> dict:
    """One entry per d with the mean correlation curves of the three predictions, and Γ per kept run."""
    return {"settings": dict(cfg), "rows": [_run_d(cfg, d, progress) for d in cfg["d"]]}
