#!/usr/bin/env python
"""Hu, Zou & Xu (2024), Fig. 1: Rᶜ along one MSSA step, CRATE-C vs CRATE-N / CRATE-T (and CRATE), over step sizes.

    python recipes/fig_mssa_step.py --output-dir docs/figures      # -> mssa_step.png, mssa_step.json (seconds)

A folder already holding them is refused before any work (exit status 1) unless ``--overwrite-output-dir`` is
given, which replaces them (:func:`hf_tdiag._outputs.claim_output_dir`).

Z: Gaussian tokens; U: a random orthonormal basis split into K subspaces; the step Z + κ·MSSA(Z) uses the
model's own CrateMSSA with that U (:mod:`hf_tdiag.diagnostics.mssa_step`); Rᶜ(·; U) with the same U.
"""

import argparse
import json
import os
import sys

import numpy as np

from hf_tdiag._outputs import OutputExistsError, add_overwrite_flag, claim_output_dir
from hf_tdiag.diagnostics.mssa_step import VARIANTS, mssa_step_compression
from hf_tdiag.viz import save_figure
from hf_tdiag.viz.srr import plot_mssa_step

OUTPUTS = ("mssa_step.json", "mssa_step.png")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", "--output_dir", dest="output_dir", default="figures_out")
    parser.add_argument("--max-step", "--max_step", dest="max_step", type=float, default=4.0)
    parser.add_argument("--num-steps", "--num_steps", dest="num_steps", type=int, default=33)
    parser.add_argument("--num-tokens", "--num_tokens", dest="num_tokens", type=int, default=64)
    parser.add_argument("--hidden-size", "--hidden_size", dest="hidden_size", type=int, default=64)
    parser.add_argument("--num-heads", "--num_heads", dest="num_heads", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=8, help="number of random (Z, U) draws")
    parser.add_argument("--eps", type=float, default=0.1)
    add_overwrite_flag(parser)
    args = parser.parse_args(argv)
    try:  # before any work: never an earlier run's figure without --overwrite-output-dir
        claim_output_dir(args.output_dir, OUTPUTS, overwrite=args.overwrite_output_dir)
    except OutputExistsError as err:  # one line, nothing written or removed
        print(f"fig_mssa_step: {err}", file=sys.stderr)
        return 1
    result = mssa_step_compression(
        np.linspace(0.0, args.max_step, args.num_steps),
        variants=VARIANTS,
        num_tokens=args.num_tokens,
        hidden_size=args.hidden_size,
        num_heads=args.num_heads,
        seeds=range(args.seeds),
        eps=args.eps,
    )
    small = int(np.searchsorted(result["step_sizes"], 0.5))
    result["summary"] = {
        v: {
            "mean_change_at_step_%g" % result["step_sizes"][small]: float(
                np.mean(np.asarray(c)[:, small] - np.asarray(c)[:, 0])
            ),
            "mean_change_at_max_step": float(np.mean(np.asarray(c)[:, -1] - np.asarray(c)[:, 0])),
            "rises_for_every_seed_at_small_step": bool((np.asarray(c)[:, 1] > np.asarray(c)[:, 0]).all()),
        }
        for v, c in result["Rc"].items()
    }
    with open(os.path.join(args.output_dir, OUTPUTS[0]), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)
        fh.write("\n")
    png = save_figure(plot_mssa_step(result), os.path.join(args.output_dir, OUTPUTS[1]), dpi=100)
    for v, s in result["summary"].items():
        print(f"{v:8s} {s}")
    print(f"wrote {png} and mssa_step.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
