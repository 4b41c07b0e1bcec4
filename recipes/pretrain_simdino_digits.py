#!/usr/bin/env python
"""SimDINO vs DINO vs random initialisation on scikit-learn's digits: pretrain a tiny backbone with each objective
for a few seeds, then a linear probe on its frozen features of the held-out digits; the training curves' stability
(loss variance over the last quarter of the steps) and a collapse check (the coding rate of the teacher's projections
and the effective rank of its backbone features on held-out images, over training).

    python recipes/pretrain_simdino_digits.py --work-dir runs/simdino --output benchmarks/results/simdino_digits.json \
        --figure docs/figures/simdino_curves.png                       # ~15 min on 2 busy cores
    python recipes/pretrain_simdino_digits.py --work-dir runs/simdino_quick --steps 20 --seeds 0  # about a minute

Each run's folder (``<work-dir>/<backbone>/<objective>-seed<k>``) holds its checkpoints, the teacher backbone
(``backbone/``, loads with ``AutoModel``) and ``pretrain_results.json``; a folder already holding results is read,
not retrained, so an interrupted sweep continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import torch

from hf_tdiag.training.simdino import pretrain
from hf_tdiag.training.simdino.pretrain import RESULTS_FILE, build_backbone, digits_pixel_values, probe_accuracy

OBJECTIVES = ("simdino", "dino")


def stability(losses: list[float], history: list[dict]) -> dict:
    """Loss variance (and its std relative to the mean) over the last quarter of the steps; the collapse check:
    the teacher's rate and rank at the start, their minimum over training and at the end."""
    tail = losses[-max(2, len(losses) // 4) :]
    mean = statistics.fmean(tail)
    var = statistics.variance(tail)
    out = {"loss_tail_mean": mean, "loss_tail_variance": var, "loss_tail_rel_std": var**0.5 / abs(mean)}
    for key in ("rate", "rank"):
        values = [h[key] for h in history]
        out.update({f"{key}_start": values[0], f"{key}_min": min(values), f"{key}_end": values[-1]})
    return out


def summary(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": len(values)}


def run_one(work: str, backbone: str, objective: str, seed: int, steps: int) -> dict:
    folder = os.path.join(work, backbone, f"{objective}-seed{seed}")
    path = os.path.join(folder, RESULTS_FILE)
    if not os.path.exists(path):
        settings = dict(output_dir=folder, objective=objective, backbone=backbone, seed=seed, max_train_steps=steps)
        settings.update(warmup_steps=max(1, steps // 10), track_every=max(1, steps // 12))
        pretrain(settings)
    with open(path) as fh:
        result = json.load(fh)
    return {
        "seed": seed,
        "probe_accuracy": result["probe_accuracy"],
        "runtime_s": result["runtime_s"],
        **stability(result["losses"], result["history"]),
        "losses": result["losses"],
        "history": result["history"],
    }


def random_init(backbone: str, seed: int) -> dict:
    torch.manual_seed(seed)
    model = build_backbone(backbone)
    return {"seed": seed, "probe_accuracy": probe_accuracy(model, digits_pixel_values(model.config))}


def figure(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backbones = list(results)
    fig, axes = plt.subplots(len(backbones), 3, figsize=(13, 3.4 * len(backbones)), squeeze=False)
    for row, backbone in enumerate(backbones):
        for objective, color in zip(OBJECTIVES, ("tab:blue", "tab:orange")):
            for k, run in enumerate(results[backbone][objective]["runs"]):
                label = objective if k == 0 else None
                axes[row, 0].plot(run["losses"], color=color, alpha=0.6, lw=0.8, label=label)
                steps = [h["step"] for h in run["history"]]
                axes[row, 1].plot(steps, [h["rate"] for h in run["history"]], color=color, marker=".", label=label)
                axes[row, 2].plot(steps, [h["rank"] for h in run["history"]], color=color, marker=".", label=label)
        out_dim = results[backbone]["dino"]["runs"][0].get("out_dim", 256)
        axes[row, 0].axhline(
            math.log(out_dim), ls="--", color="gray", lw=0.8, label=f"log {out_dim} (uniform DINO output)"
        )
        for ax, title in zip(
            axes[row], ("training loss", "teacher rate R_eps(z) (held out)", "effective rank of features")
        ):
            ax.set_title(f"{backbone}: {title}", fontsize=9)
            ax.set_xlabel("step")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", required=True, help="Folder of the runs (one sub-folder per run).")
    parser.add_argument(
        "--output", default=None, help="JSON file of the table (default: <work-dir>/simdino_digits.json)."
    )
    parser.add_argument("--figure", default=None, help="PNG of the curves (default: none).")
    parser.add_argument("--backbones", nargs="+", default=["crate-digits", "vit-digits"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300, help="Pretraining steps per run.")
    args = parser.parse_args(argv)
    output = args.output or os.path.join(args.work_dir, "simdino_digits.json")
    start, load = time.time(), os.getloadavg()
    results = {}
    for backbone in args.backbones:
        table = {"random_init": {"runs": [random_init(backbone, s) for s in args.seeds]}}
        for objective in OBJECTIVES:
            table[objective] = {
                "runs": [run_one(args.work_dir, backbone, objective, s, args.steps) for s in args.seeds]
            }
        for entry in table.values():
            runs = entry["runs"]
            entry["probe_accuracy"] = summary([r["probe_accuracy"] for r in runs])
            for key in ("loss_tail_variance", "loss_tail_rel_std", "rank_min", "rank_end", "rate_min", "rate_end"):
                if key in runs[0]:
                    entry[key] = summary([r[key] for r in runs])
        results[backbone] = table
        print(backbone, {k: round(v["probe_accuracy"]["mean"], 4) for k, v in table.items()}, flush=True)
    machine = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "load_average_start": load,
        "load_average_end": os.getloadavg(),
        "wall_s": time.time() - start,
    }
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as fh:
        json.dump({"machine": machine, "steps": args.steps, "seeds": args.seeds, "results": results}, fh, indent=1)
    if args.figure:
        figure(results, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
