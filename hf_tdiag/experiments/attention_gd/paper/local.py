"""Local convergence (the authors' ``local_converge`` notebook) — GD converges in direction to the SVM solution of whatever tokens it selects.

``runs`` random instances (unit tokens, n = 6, T = 8, d = 10), GD from PyTorch's default ``nn.Linear``
initialization on ``W`` and on ``(K, Q)``; after training, the selection ``α`` is the argmax of each final
softmax, and the correlation of every stored iterate with ``W^mm_α`` (Frobenius) and ``W^mm_{⋆,α}`` (nuclear)
is recorded, with the mean largest softmax probability per step.
"""

from __future__ import annotations

import torch

from ....measures.attention_svm import att_svm
from ..data import make_attention_data, stack_data
from ..train import train_attention_batch
from .common import batched_correlation

__all__ = ["run_local"]


def _curves(values: torch.Tensor) -> dict:
    """Mean and standard deviation over runs (dim 0) per recorded step."""
    return {"mean": values.mean(0).tolist(), "std": values.std(0, unbiased=False).tolist()}


def _svm_references(data, ids: torch.Tensor):
    """Frobenius and nuclear SVM solutions of the selections ``ids (R, n)`` (None where infeasible)."""
    refs = {"fro": [], "nuc": []}
    for r in range(ids.shape[0]):
        fro = att_svm(data.X[r], data.z[r], ids[r])
        refs["fro"].append(fro.W if fro.feasible else None)
        nuc = att_svm(data.X[r], data.z[r], ids[r], norm="nuc") if fro.feasible else None
        refs["nuc"].append(nuc.W if nuc is not None and nuc.feasible else None)
    return refs


def run_local(cfg: dict, progress: bool = False) -> dict:
    """Softmax peakedness and correlation with the selection's SVM solutions per iteration, both parameterizations."""
    data = stack_data(make_attention_data(cfg["n"], cfg["T"], cfg["d"], seed=r) for r in range(cfg["runs"]))
    out = {"settings": dict(cfg), "params": {}}
    for param in ("W", "KQ"):
        gd = train_attention_batch(
            data,
            param=param,
            steps=cfg["steps"],
            lr=cfg["lr"],
            init=cfg["init"],
            seed=1,
            record_every=cfg["snapshot_every"],
            snapshot_every=cfg["snapshot_every"],
            progress=progress,
        )
        probs = torch.softmax(torch.einsum("rntd,rde,rne->rnt", data.X, gd.W, data.z), -1)
        ids = probs.argmax(-1)
        refs = _svm_references(data, ids)
        entry = {
            "steps": gd.snapshot_steps.tolist(),
            "max_prob": _curves(gd.max_prob),
            "selects_optimal": float((ids == data.optimal).all(-1).double().mean()),
            "final_max_prob_mean": float(gd.max_prob[:, -1].mean()),
        }
        for norm in ("fro", "nuc"):
            ok = [r for r, W in enumerate(refs[norm]) if W is not None]
            if not ok:
                entry[f"corr_{norm}"] = None
                continue
            ref = torch.stack([refs[norm][r] for r in ok])[:, None]
            corr = batched_correlation(gd.snapshots[ok], ref)  # (runs, steps)
            entry[f"corr_{norm}"] = _curves(corr)
            entry[f"final_corr_{norm}"] = {
                "mean": float(corr[:, -1].mean()),
                "min": float(corr[:, -1].min()),
                "runs": len(ok),
            }
        out["params"][param] = entry
    return out
