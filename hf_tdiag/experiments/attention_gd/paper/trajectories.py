"""Fig. 2: 2-D trajectories of GD on ``W`` and on ``(K, Q)`` beside the Att-SVM / Att-SVM⋆ directions.

Two inputs of three 2-D tokens (n = d = m = 2), unit queries; the plot shows ``W_t z_i`` for every step
next to the directions ``W_mm z_i`` (Frobenius, for ``W``) and ``W⋆_mm z_i`` (nuclear, for ``(K, Q)``).
"""

from __future__ import annotations

import math

import torch

from ....measures.attention_svm import att_svm
from ..data import make_trajectory_data, passes_gap_filter, score_gap
from ..train import train_attention
from .common import batched_correlation

__all__ = ["run_trajectories"]


def _angle_deg(a: torch.Tensor, b: torch.Tensor) -> float:
    cos = float(a @ b / (a.norm() * b.norm()))
    return math.degrees(math.acos(max(-1.0, min(1.0, cos))))


def run_trajectories(cfg: dict, progress: bool = False) -> dict:
    """Trajectories ``W_t z_i`` of both parameterizations, the SVM directions and the final alignment."""
    data = make_trajectory_data(seed=cfg["seed"], T=cfg["T"])
    svm = {"fro": att_svm(data.X, data.z, data.optimal), "nuc": att_svm(data.X, data.z, data.optimal, norm="nuc")}
    out = {
        "settings": dict(cfg),
        "tokens": data.X.tolist(),
        "optimal": data.optimal.tolist(),
        "queries": data.z.tolist(),
        "score_gap": float(score_gap(data)),
        "passes_gamma_0.1": passes_gap_filter(data, 0.1),
        "svm_directions": {},
        "paths": {},
        "final_correlation": {},
        "final_angle_deg": {},
    }
    for norm, res in svm.items():
        out["svm_directions"][norm] = (res.W @ data.z.T).T.tolist()  # W_mm z_i, one row per input
    for param, norm in (("W", "fro"), ("KQ", "nuc")):
        run = train_attention(
            data,
            param=param,
            steps=cfg["steps"],
            lr=cfg["lr"],
            init_scale=cfg["kq_init_scale"],
            seed=cfg["seed"],
            snapshot_every=1,
            record_every=cfg["steps"],
            progress=progress,
        )
        out["paths"][param] = torch.einsum("sde,ne->nsd", run.snapshots, data.z).tolist()  # (input, step, 2)
        for ref_norm, res in svm.items():
            out["final_correlation"][f"{param}_vs_{ref_norm}"] = float(batched_correlation(run.W, res.W))
        out["final_angle_deg"][param] = [_angle_deg(run.W @ data.z[i], svm[norm].W @ data.z[i]) for i in range(2)]
    return out
