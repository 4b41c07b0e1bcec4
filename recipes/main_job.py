#!/usr/bin/env python
"""The project's main job, end to end, offline on 2 CPU cores.

1. train a CRATE on scikit-learn's 8x8 digits with the Accelerate trainer
   (``recipes/train_crate.py`` with its embedded default: evaluates every epoch,
   saves model + image processor + model card, prints/plots per-layer SRR);
2. reload the saved folder with ``AutoModelForImageClassification`` /
   ``AutoImageProcessor`` and classify held-out digits with it;
3. write the one-page diagnostics report (``hf-tdiag report``) for that model.

    python recipes/main_job.py --output-dir runs/main [any train_crate.py flag]
"""

from __future__ import annotations

import os
import sys
import time

from hf_tdiag._cli_args import normalize_flag


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(normalize_flag(a).split("=")[0] == "--output-dir" for a in argv):
        argv += ["--output-dir", "runs/main"]
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    import hf_tdiag  # noqa: F401  (registers the crate Auto classes)
    from hf_tdiag._atomic import write_json
    from hf_tdiag.cli import main as cli_main
    from hf_tdiag.inputs import digits_test_images
    from hf_tdiag.training import make_args, train
    from hf_tdiag.training.srr_tracking import layer_srr_step

    args = make_args(argv)
    start = time.perf_counter()
    results = train(args, after_fit=[layer_srr_step])  # per-layer SRR of the trained model, after training
    train_seconds = time.perf_counter() - start
    out = args.output_dir

    # 2. reload through the Auto classes, as a user of the saved folder would
    model = AutoModelForImageClassification.from_pretrained(out).eval()
    processor = AutoImageProcessor.from_pretrained(out)
    images, labels = digits_test_images(None)
    with torch.no_grad():
        pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]
        predictions = model(pixel_values=pixel_values).logits.argmax(-1).tolist()
    accuracy = sum(int(p == t) for p, t in zip(predictions, labels)) / len(labels)
    print(
        f"[main job] reloaded {type(model).__name__} ({model.config.variant}) from {out}: "
        f"held-out digits accuracy {accuracy:.4f} on {len(labels)} images "
        f"(first five: predicted {predictions[:5]}, true {list(labels[:5])}); training took {train_seconds:.0f}s"
    )

    # 3. the diagnostics report for the trained model
    report_path = os.path.join(out, "report.html")
    code = cli_main(["report", out, "--dataset", "digits", "--output-dir", out])
    summary = {
        "train_seconds": round(train_seconds, 1),
        "reloaded_test_accuracy": accuracy,
        "num_test_images": len(labels),
        "report": report_path if code == 0 else None,
        **{k: v for k, v in results.items() if isinstance(v, (int, float, str))},
    }
    write_json(os.path.join(out, "main_job.json"), summary)
    print(f"[main job] summary written to {os.path.join(out, 'main_job.json')}")
    return code


if __name__ == "__main__":
    sys.exit(main())
