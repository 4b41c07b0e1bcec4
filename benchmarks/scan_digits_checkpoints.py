#!/usr/bin/env python
"""The checkpoints of one digits training run scanned with SRR and Schatten, ranked against each checkpoint's
held-out accuracy (the numbers of docs/results/scan.md).

Trains a CRATE digits classifier with hf-tdiag's trainer (``crate-digits`` preset, the trainer's 16 px digits
recipe, ``--epochs`` epochs, a checkpoint at every epoch's end, all kept), then runs
``hf_tdiag.scan("<run>/checkpoint-*", ["srr", "schatten"], {"images": "digits"}, max_samples=64)``: each checkpoint's
``trainer_state.json`` logs the test-split accuracy measured at its step, and the scan's comparison gives Kendall's
τ of every measure against it. Writes ``benchmarks/results/scan_digits_checkpoints.json`` (the per-checkpoint
measures and accuracies, τ of the headline measures, timings and the load average) and prints a Markdown table.

    python benchmarks/scan_digits_checkpoints.py                  # 10 epochs, about 5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HEADLINE = ("srr.srr_mean_over_layers", "srr.srr_last_layer", "schatten.schatten_bound", "schatten.edelman_bound")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--output", default=os.path.join(HERE, "results", "scan_digits_checkpoints.json"))
    args = p.parse_args(argv)

    import hf_tdiag
    from hf_tdiag.training import train

    with tempfile.TemporaryDirectory(prefix="scan_digits_") as root:
        run = os.path.join(root, "run")
        t0 = time.perf_counter()
        results = train(output_dir=run, num_train_epochs=args.epochs, checkpointing_steps="epoch",
                        checkpoints_total_limit=None, disable_tqdm=True, layer_srr_samples=0, seed=0)  # fmt: skip
        train_seconds = time.perf_counter() - t0
        load_before = os.getloadavg()[0]
        t0 = time.perf_counter()
        scan = hf_tdiag.scan(os.path.join(run, "checkpoint-*"), ["srr", "schatten"], {"images": "digits"},
                             max_samples=64, output_dir=os.path.join(root, "scan"), progress=False, figures=False)  # fmt: skip
        scan_seconds = time.perf_counter() - t0
        from hf_tdiag.zoo.compare import folder_metadata

        measures = scan.measures.set_index("model")
        rows = []
        for model in measures.index:
            step = int(os.path.basename(model).split("-")[-1])
            info = folder_metadata(model)  # what the checkpoint's trainer_state.json logged at its step
            rows.append({"step": step, "epoch": info.get("epoch"), "eval_accuracy": info.get("eval_accuracy"),
                         **{m: float(measures.loc[model, m]) for m in HEADLINE}})  # fmt: skip
        taus = {r["measure"]: r["tau"] for r in scan.correlations if r["target"] == "eval_accuracy"}
    out = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_before_scan": load_before,
            "load_after_scan": os.getloadavg()[0],
        },  # fmt: skip
        "training": {
            "epochs": args.epochs,
            "seconds": round(train_seconds, 1),
            "final_eval_accuracy": results.get("eval_accuracy"),
        },  # fmt: skip
        "scan": {"checkpoints": len(rows), "seconds": round(scan_seconds, 1), "failures": scan.failures},
        "checkpoints": rows,
        "tau_vs_eval_accuracy": {m: taus.get(m) for m in HEADLINE},
        "tau_vs_eval_accuracy_all": taus,
    }
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=2)
    print("| step | epoch | test accuracy | " + " | ".join(HEADLINE) + " |")
    print("|---:|---:|---:|" + "---:|" * len(HEADLINE))
    for r in rows:
        print(f"| {r['step']} | {r['epoch']:.0f} | {r['eval_accuracy']:.3f} | "
              + " | ".join(f"{r[m]:.4g}" for m in HEADLINE) + " |")  # fmt: skip
    print(
        "| τ vs accuracy | | | "
        + " | ".join("n/a" if taus.get(m) is None else f"{taus[m]:+.3f}" for m in HEADLINE)
        + " |"
    )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
