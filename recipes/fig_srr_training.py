#!/usr/bin/env python
"""Yu et al. (2023), Fig. 4 style: Rᶜ, sparsity and SRR of every layer across training.

    python recipes/fig_srr_training.py --output-dir docs/figures               # digits CRATE, ~1 min on 2 cores
    python recipes/fig_srr_training.py --history runs/x/srr_history.json ...   # plot an existing run instead

Trains a CRATE on scikit-learn's digits with the trainer's ``--track-srr-every`` (per-layer SRR terms of the
block outputs on held-out images before the first step and after every epoch, :mod:`hf_tdiag.training.srr_tracking`),
then plots the records coloured by training step -> srr_training.png, srr_training.json.

A second run into the same folders is refused (the earlier figure, its JSON and the training run are kept) unless
``--overwrite-output-dir`` is given, which replaces them (:func:`hf_tdiag._outputs.claim_output_dir`).
"""

import argparse
import json
import os
import sys

from hf_tdiag._atomic import write_json
from hf_tdiag._outputs import OutputExistsError, add_overwrite_flag, claim_output_dir
from hf_tdiag.viz import save_figure
from hf_tdiag.viz.srr import plot_srr_history


def _summary(data: dict) -> dict:
    first, last = data["history"][0], data["history"][-1]
    out = {"steps": [first["step"], last["step"]]}
    for term in ("Rc", "sparsity", "srr"):
        out[term] = {"first": first["output"][term], "last": last["output"][term]}
        out[f"{term}_decreases_with_depth_at_end"] = all(
            b < a for a, b in zip(last["output"][term], last["output"][term][1:])
        )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", "--output_dir", dest="output_dir", default="figures_out")
    parser.add_argument("--history", default=None, help="an srr_history.json to plot (skips training)")
    parser.add_argument(
        "--run-dir",
        "--run_dir",
        dest="run_dir",
        default=None,
        help="where the training run goes (default <output-dir>/srr_training_run)",
    )
    parser.add_argument("--variant", default="crate")
    parser.add_argument("--num-train-epochs", "--num_train_epochs", dest="num_train_epochs", type=int, default=40)
    parser.add_argument("--track-srr-every", "--track_srr_every", dest="track_srr_every", default="epoch")
    parser.add_argument("--track-srr-samples", "--track_srr_samples", dest="track_srr_samples", type=int, default=128)
    parser.add_argument("--seed", type=int, default=42)
    add_overwrite_flag(parser)
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except OutputExistsError as err:  # a folder holding an earlier run: one line, nothing written or removed
        print(f"fig_srr_training: {err}", file=sys.stderr)
        return 1


def _run(args) -> int:
    outputs = ["srr_training.json", "srr_training.png"]
    claim_output_dir(args.output_dir, outputs, overwrite=args.overwrite_output_dir, inputs=[args.history])
    if args.history is None:
        from hf_tdiag.training import train

        run_dir = args.run_dir or os.path.join(args.output_dir, "srr_training_run")
        train(
            output_dir=run_dir,
            variant=args.variant,
            num_train_epochs=args.num_train_epochs,
            track_srr_every=args.track_srr_every,
            track_srr_samples=args.track_srr_samples,
            seed=args.seed,
            overwrite_output_dir=args.overwrite_output_dir,
            layer_srr_samples=0,
            disable_tqdm=True,
            after_fit=[],
        )
        args.history = os.path.join(run_dir, "srr_history.json")
    with open(args.history, encoding="utf-8") as fh:
        data = json.load(fh)
    data["summary"] = _summary(data)
    write_json(os.path.join(args.output_dir, outputs[0]), data)
    title = f"{data.get('variant')} on digits: per-layer SRR terms across training ({len(data['history'])} records)"
    png = save_figure(plot_srr_history(data, title=title), os.path.join(args.output_dir, outputs[1]), dpi=100)
    print(json.dumps(data["summary"], indent=1))
    print(f"wrote {png} and srr_training.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
