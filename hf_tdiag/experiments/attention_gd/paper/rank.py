"""Rank experiments: the rank of ``W = KQᵀ`` vs the width m (appendix, n = T = 5) and of the SVM solutions vs d.

* ``run_rank_m``: GD on ``(K, Q) ∈ R^{d×m} × R^{d×m}`` for each m; the correlation of ``KQᵀ`` with the
  nuclear-norm SVM ``W⋆_mm`` of the tokens GD selects, and the numerical rank of ``KQᵀ`` (singular values
  above 1e-3 of the largest) — the paper: as m approaches or exceeds n, ``KQᵀ`` aligns with ``W⋆_mm``;
* ``run_svm_rank``: the rank (``numpy.linalg.matrix_rank``, tol 1e-7, as the notebook) of the Frobenius and
  nuclear SVM solutions of random feasible instances vs d, for several n (T = 5) and T (n = 5) — both have
  rank ≤ n, the nuclear one lower.
"""

from __future__ import annotations

import numpy as np
import torch

from ....measures.attention_svm import att_svm
from ..data import make_attention_data, stack_data
from ..train import train_attention_batch
from .common import batched_correlation, mean_std, numerical_rank

__all__ = ["run_rank_m", "run_svm_rank"]


def run_rank_m(cfg: dict, progress: bool = False) -> dict:
    """Per m: mean correlation of ``KQᵀ`` with the selection's ``W⋆_mm`` and mean rank of ``KQᵀ``."""
    data = stack_data(make_attention_data(cfg["n"], cfg["T"], cfg["d"], seed=r) for r in range(cfg["runs"]))
    cache: dict[tuple, torch.Tensor | None] = {}
    rows = []
    for m in cfg["m"]:
        gd = train_attention_batch(
            data,
            param="KQ",
            m=m,
            steps=cfg["steps"],
            lr=cfg["lr"],
            init_scale=cfg["kq_init_scale"],
            seed=m,
            record_every=cfg["steps"],
            progress=progress,
        )
        ids = torch.einsum("rntd,rde,rne->rnt", data.X, gd.W, data.z).argmax(-1)
        corrs, ranks, svm_ranks = [], [], []
        for r in range(ids.shape[0]):
            key = (r, tuple(ids[r].tolist()))
            if key not in cache:
                nuc = att_svm(data.X[r], data.z[r], ids[r], norm="nuc")
                cache[key] = nuc.W if nuc.feasible else None
            ranks.append(numerical_rank(gd.W[r]))
            if cache[key] is not None:
                corrs.append(float(batched_correlation(gd.W[r], cache[key])))
                svm_ranks.append(numerical_rank(cache[key]))
        mc, sc = mean_std(corrs)
        rows.append(
            {
                "m": m,
                "correlation_mean": mc,
                "correlation_std": sc,
                "rank_mean": mean_std(ranks)[0],
                "svm_rank_mean": mean_std(svm_ranks)[0],
                "feasible_runs": len(corrs),
            }
        )
    return {"settings": dict(cfg), "rows": rows}


def _feasible_ranks(n: int, T: int, d: int, runs: int, tol: float, max_tries: int):
    """Ranks of the Frobenius and nuclear solutions of the first ``runs`` feasible instances (seeds 0, 1, …)."""
    fro_r, nuc_r, seed = [], [], 0
    while len(fro_r) < runs and seed < max_tries:
        data = make_attention_data(n, T, d, seed=seed)
        seed += 1
        fro = att_svm(data.X, data.z, data.optimal)
        if not fro.feasible:
            continue
        nuc = att_svm(data.X, data.z, data.optimal, norm="nuc")
        if not nuc.feasible or nuc.norm != "nuc":
            continue
        fro_r.append(int(np.linalg.matrix_rank(fro.W.numpy(), tol=tol)))
        nuc_r.append(int(np.linalg.matrix_rank(nuc.W.numpy(), tol=tol)))
    return fro_r, nuc_r, seed


def run_svm_rank(cfg: dict, progress: bool = False) -> dict:
    """Mean rank of ``W_mm`` (Frobenius) and ``W⋆_mm`` (nuclear) vs d, for n ∈ cfg[n] at T = 5 and T ∈ cfg[T] at n = 5."""
    configs = [(n, cfg["T"][0]) for n in cfg["n"]] + [(cfg["n"][0], T) for T in cfg["T"][1:]]
    rows = []
    for n, T in configs:
        for d in cfg["d"]:
            fro_r, nuc_r, tried = _feasible_ranks(n, T, d, cfg["runs"], cfg["rank_tol"], cfg.get("max_tries", 500))
            rows.append(
                {
                    "n": n,
                    "T": T,
                    "d": d,
                    "feasible": len(fro_r),
                    "tried": tried,
                    "rank_fro": mean_std(fro_r)[0],
                    "rank_nuc": mean_std(nuc_r)[0],
                }
            )
    return {"settings": dict(cfg), "rows": rows}
