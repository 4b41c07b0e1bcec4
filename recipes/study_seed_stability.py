"""How much does the seed move the PAC-Bayes flatness measures? CV of 1/sigma'^2 over seeds, per number of draws.

    hf-tdiag study --grid digits --jobs 2 --keep_models --output_dir runs/study_digits
    python recipes/study_seed_stability.py --study-dir runs/study_digits --draws 10,32,64 --seeds 8

Loads up to ``--models`` trained runs kept by the study (one per variant first), recomputes
``pacbayes_flatness`` and ``pacbayes_flatness_mag`` with seeds 0..seeds-1 for each number of noise draws,
and writes the values, means, standard deviations and coefficients of variation as JSON (``--output``).

An existing ``--output`` file is refused before any model is loaded (one line, exit status 1) unless
``--overwrite-output-dir`` is given, which replaces it; a file of the study it reads is never replaced.
"""

import argparse
import json
import os
import sys
import time

from hf_tdiag._outputs import OVERWRITE_FLAG, OutputExistsError, add_overwrite_flag, check_writable
from hf_tdiag.study import MeasureSettings, load_records
from hf_tdiag.study.cache import write_json_atomic
from hf_tdiag.study.stability import seed_stability
from hf_tdiag.study.worker import examples_tensors, load_trained


def claim_output(path: str, study_dir: str, overwrite: bool) -> None:
    """Before any work: refuse an existing ``path`` without the flag (OutputExistsError), and a ``path`` that is a
    folder or a file of the study read (its study.json, runs/, work/) even with it (ValueError)."""
    if os.path.isdir(path):
        raise ValueError(f"output: {path!r} is a folder; expected a JSON file name")
    target, study = os.path.realpath(path), os.path.realpath(study_dir)
    if target == os.path.join(study, "study.json") or any(
        target.startswith(os.path.join(study, part) + os.sep) for part in ("runs", "work")
    ):
        raise ValueError(
            f"output: writing {path!r} would replace a file of the study {study_dir!r}; choose another file"
        )
    if os.path.exists(path) and not overwrite:
        raise OutputExistsError(
            f"output: {path!r} already holds an earlier run's results; pass {OVERWRITE_FLAG} to replace it, or choose "
            "another file"
        )


def _kept_runs(study_dir: str, count: int) -> list[dict]:
    kept = [
        r for r in load_records(study_dir) if os.path.isfile(os.path.join(study_dir, "work", r["key"], "config.json"))
    ]
    first_per_variant = list({r["hparams"].get("variant"): r for r in reversed(kept)}.values())[::-1]
    rest = [r for r in kept if r not in first_per_variant]
    return (first_per_variant + rest)[:count]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study-dir", "--study_dir", dest="study_dir", required=True, help="a study run with --keep_models")
    p.add_argument("--models", type=int, default=4, help="how many kept runs to measure (default 4)")
    p.add_argument("--draws", default="10,32,64", help="comma-separated numbers of noise draws (default 10,32,64)")
    p.add_argument("--seeds", type=int, default=8, help="seeds per setting (default 8)")
    p.add_argument("--output", default="benchmarks/results/study_seed_stability.json", help="where the JSON goes")
    add_overwrite_flag(p)
    args = p.parse_args(argv)
    try:
        claim_output(args.output, args.study_dir, args.overwrite_output_dir)
    except ValueError as err:  # an earlier result or an input (OutputExistsError too): one line, nothing written
        print(f"study_seed_stability: {err}", file=sys.stderr)
        return 1
    with open(os.path.join(args.study_dir, "study.json"), encoding="utf-8") as f:
        study = json.load(f)
    settings = MeasureSettings(**study["settings"])
    runs = _kept_runs(args.study_dir, args.models)
    if not runs:
        print(f"error: no kept models under {args.study_dir}/work (run the study with --keep_models)", file=sys.stderr)
        return 1
    check_writable(os.path.dirname(args.output) or ".", "output")  # before the first model is measured
    draws = [int(d) for d in args.draws.split(",") if d]
    out = {"study_dir": os.path.abspath(args.study_dir), "settings": study["settings"], "seeds": args.seeds, "runs": []}
    for rec in runs:
        t0 = time.time()
        model, examples = load_trained(
            rec["hparams"],
            study["grid"]["fixed"],
            os.path.join(args.study_dir, "work", rec["key"]),
            max_examples=settings.max_examples,
        )
        x, y = examples_tensors(examples, settings.max_examples)
        result = seed_stability(model, x, y, settings, seeds=args.seeds, draws=draws)
        out["runs"].append(
            {"key": rec["key"], "hparams": rec["hparams"], "stability": result, "seconds": round(time.time() - t0, 1)}
        )
        for name, per in result.items():
            print(rec["hparams"], name, {d: round(v["cv"], 3) for d, v in per.items()})
    write_json_atomic(args.output, out)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
