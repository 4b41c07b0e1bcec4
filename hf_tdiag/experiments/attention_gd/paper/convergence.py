"""Figs 5, 6 and 8: global vs local convergence as d grows, the probability of Assumption B.1, and margins.

For each d, ``runs`` instances that pass the γ filter (best token leads by ≥ 0.1 in every input) are
trained from zero (``W = 0``; ``Q = 0``, ``K = 0.1·N(0, 1)``) with normalized GD. Each run is
**global** (GD selects the optimal tokens and its direction correlates ≥ ``threshold`` with their Att-SVM
solution: Frobenius for ``W``, nuclear for ``(K, Q)``), **local** (another locally-optimal selection, same
correlation test) or **undetermined**; ``selects_optimal`` counts the runs whose softmax ends on the optimal
tokens whatever the direction. Assumption B.1 (as we read §4.2) holds when the negative gradient at ``W = 0``
already ranks every optimal token first (a separating first step). Fig. 8 compares the margin ``1/‖W_mm‖`` of the optimal
selection (0 when infeasible) with that of the selection a locally-converged run ends at.
"""

from __future__ import annotations

import torch

from ....measures.attention_svm import att_svm
from ..data import make_attention_data, passes_gap_filter, stack_data
from ..train import train_attention_batch
from ..verdicts import all_support, convergence_verdict, initial_gradient_separates

__all__ = ["run_convergence", "gamma_filtered_instances"]


def gamma_filtered_instances(
    n: int, T: int, d: int, runs: int, gamma: float, *, base_seed: int = 0, max_tries: int = 100000
):
    """The first ``runs`` instances (seeds ``base_seed, base_seed + 1, …``) passing the γ filter, and the seeds tried."""
    kept, seed = [], base_seed
    while len(kept) < runs:
        if seed - base_seed >= max_tries:
            raise ValueError(
                f"gamma: fewer than {runs} of {max_tries} instances pass the γ = {gamma} filter at n={n}, T={T}"
            )
        data = make_attention_data(n, T, d, seed=seed)
        if passes_gap_filter(data, gamma):
            kept.append(data)
        seed += 1
    return kept, seed - base_seed


def _verdicts(data, W: torch.Tensor, norm: str, threshold: float) -> list:
    return [convergence_verdict(data.run(r), W[r], norm=norm, threshold=threshold) for r in range(W.shape[0])]


def _run_d(cfg: dict, d: int, progress: bool) -> dict:
    datas, tried = gamma_filtered_instances(cfg["n"], cfg["T"], d, cfg["runs"], cfg["gamma"], base_seed=1000 * d)
    data = stack_data(datas)
    row = {"d": d, "runs": len(datas), "instances_tried": tried}
    glob = [att_svm(x.X, x.z, x.optimal) for x in datas]
    row["assumption_B1"] = sum(initial_gradient_separates(x) for x in datas) / len(datas)
    row["all_support"] = sum(all_support(s) for s in glob) / len(glob)
    row["global_svm_feasible"] = sum(s.feasible for s in glob) / len(glob)
    runs = []
    for param, norm in (("W", "fro"), ("KQ", "nuc")):
        gd = train_attention_batch(
            data,
            param=param,
            steps=cfg["steps"],
            lr=cfg["lr"],
            init_scale=cfg["kq_init_scale"],
            seed=d,
            record_every=cfg["steps"],
            progress=progress,
        )
        verdicts = _verdicts(data, gd.W, norm, cfg["threshold"])
        kinds = [v.kind for v in verdicts]
        row[param] = {k: kinds.count(k) / len(kinds) for k in ("global", "local", "undetermined")}
        row[param]["selects_optimal"] = sum(bool(torch.equal(v.selected, v.optimal)) for v in verdicts) / len(verdicts)
        if param == "W":
            runs = [
                {
                    "kind": v.kind,
                    "global_margin": glob[r].margin,
                    "selected_margin": v.svm.margin,
                    "correlation": v.correlation,
                }
                for r, v in enumerate(verdicts)
            ]
    row["margins"] = _margin_summary(runs)
    return row, runs


def _margin_summary(runs: list[dict]) -> dict:
    """Fig. 8's comparison: mean global margin by outcome, and how often a local run's margin beats the global one."""
    out = {}
    for kind in ("global", "local", "undetermined"):
        sel = [r for r in runs if r["kind"] == kind]
        out[kind] = {
            "runs": len(sel),
            "mean_global_margin": sum(r["global_margin"] for r in sel) / len(sel) if sel else None,
            "mean_selected_margin": sum(r["selected_margin"] for r in sel) / len(sel) if sel else None,
        }
    local = [r for r in runs if r["kind"] == "local"]
    out["local_margin_exceeds_global"] = (
        sum(r["selected_margin"] > r["global_margin"] for r in local) / len(local) if local else None
    )
    return out


def run_convergence(cfg: dict, progress: bool = False) -> dict:
    """One row per d: convergence shares for ``W`` and ``(K, Q)``, P(B.1), margins; plus every W-run for Fig. 8."""
    rows, per_run = [], []
    for d in cfg["d"]:
        row, runs = _run_d(cfg, d, progress)
        rows.append(row)
        per_run += [dict(r, d=d) for r in runs]
    return {"settings": dict(cfg), "rows": rows, "runs": per_run}
