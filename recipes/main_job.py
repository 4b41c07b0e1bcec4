#!/usr/bin/env python
"""The project's main job, end to end, offline on 2 CPU cores.

1. train a CRATE on scikit-learn's 8x8 digits with the Accelerate trainer
   (``recipes/train_crate.py`` with its embedded default: evaluates every epoch,
   saves model + image processor + model card, prints/plots per-layer SRR);
2. reload the saved folder with ``AutoModelForImageClassification`` /
   ``AutoImageProcessor`` and classify held-out digits with it;
3. write the one-page diagnostics report (``hf-tdiag report``) for that model.

    python recipes/main_job.py --output-dir runs/main [any train_crate.py flag]

A folder holding an earlier run (its ``main_job.json``, report, model or checkpoints) is refused before anything
is imported or trained (one line, exit status 1) unless ``--overwrite-output-dir`` is given, which the trainer
and the report are passed (the trainer removes the earlier run's files); ``--resume-from-checkpoint`` continues.
"""

from __future__ import annotations

import os
import sys
import time

from hf_tdiag._cli_args import normalize_flag

# what this recipe adds to the trainer's folder (the trainer's own files are its claim's)
OUTPUTS = ("main_job.json", "report.html", "report.json")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(normalize_flag(a).split("=")[0] == "--output-dir" for a in argv):
        argv += ["--output-dir", "runs/main"]
    from hf_tdiag._outputs import OutputExistsError, claim_output_dir
    from hf_tdiag.training.args import make_args

    args = make_args(argv)
    try:
        if not args.resume_from_checkpoint:  # a resume is the trainer's to accept or refuse
            # only a check, before any import or training; the trainer claims the folder again (removing the
            # earlier run's files with --overwrite-output-dir) before its first step
            claim_output_dir(
                args.output_dir, OUTPUTS, overwrite=args.overwrite_output_dir, model_output=True, remove=False
            )
        return _run(args)
    except OutputExistsError as err:  # an earlier run in the folder: one line, nothing written or removed
        print(f"main_job: {err}", file=sys.stderr)
        return 1


def _run(args) -> int:
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    import hf_tdiag  # noqa: F401  (registers the crate Auto classes)
    from hf_tdiag._atomic import write_json
    from hf_tdiag._outputs import hold_output_dir, release_output_dir
    from hf_tdiag.cli import main as cli_main
    from hf_tdiag.inputs import digits_test_images
    from hf_tdiag.loading import quiet_loading
    from hf_tdiag.training import train
    from hf_tdiag.training.srr_tracking import layer_srr_step

    start = time.perf_counter()
    results = train(args, after_fit=[layer_srr_step])  # per-layer SRR of the trained model, after training
    train_seconds = time.perf_counter() - start
    out = args.output_dir

    # 2. reload through the Auto classes, as a user of the saved folder would (without transformers' weight-loading
    # bar: one progress bar per job in its log)
    with quiet_loading() as held:
        model = AutoModelForImageClassification.from_pretrained(out).eval()
    held.replay()  # the model it saved reloads whole: any load report is a real problem, shown
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
    # the trainer's claim left no earlier run's report here, or the run resumed is this one: it may be replaced
    again = ["--overwrite-output-dir"] if args.overwrite_output_dir or args.resume_from_checkpoint else []
    code = cli_main(["report", out, "--dataset", "digits", "--output-dir", out, *again])
    summary = {
        "train_seconds": round(train_seconds, 1),
        "reloaded_test_accuracy": accuracy,
        "num_test_images": len(labels),
        "report": report_path if code == 0 else None,
        **{k: v for k, v in results.items() if isinstance(v, (int, float, str))},
    }
    # recorded in the folder's manifest as this run's (the report command released the folder): the next run with
    # --overwrite-output-dir may replace it
    hold_output_dir(out, OUTPUTS[:1])
    try:
        write_json(os.path.join(out, "main_job.json"), summary)
    finally:
        release_output_dir(out)
    print(f"[main job] summary written to {os.path.join(out, 'main_job.json')}")
    return code


if __name__ == "__main__":
    sys.exit(main())
