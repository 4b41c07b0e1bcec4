"""``hf-tdiag objective-ledger MODEL --images DIR | --dataset NAME | --texts FILE``: the objective each block of a white-box
model was derived to decrease, before and after each of its steps (``--texts``: a text CRATE, one text per line)."""

from __future__ import annotations

import argparse
import os

from .._cli_args import (
    INPUTS_HELP,
    add_device_flag,
    add_input_flags,
    add_output_dir,
    add_settings_flags,
    add_threads_flag,
    add_trust_remote_code_flag,
    default_inputs,
    default_output_dir,
    plain,
    positive_int,
    settings_from_args,
)
from ..diagnostics.registry import diagnostic
from ..diagnostics.settings import ObjectiveLedgerSettings

SPEC = diagnostic("objective_ledger")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        SPEC.command,
        help="objective ledger of a white-box model (CRATE, CRATE-α, CRATE-MAE, ToST): does each step decrease "
        "the objective it was derived from?",
        description=plain(
            "For every block, measure the objective of each step before and after it on the given images: "
            "Rc(Z; U) across MSSA, the LASSO objective across each ISTA step (CRATE's one, CRATE-α's two), ToST's "
            "variational compression objective across TSSA; flag the steps that increase theirs. Writes "
            "objective_ledger.json, .csv and .png. Models that are not white-box are refused. " + INPUTS_HELP
        ),
    )
    p.add_argument("model", metavar="MODEL", help="a local model folder (save_pretrained) or a Hub id")
    add_input_flags(p)
    p.add_argument("--max-length", type=positive_int, default=128, help="token limit for --texts (default 128)")
    add_settings_flags(p, ObjectiveLedgerSettings)
    add_device_flag(p)
    add_threads_flag(p)
    add_output_dir(
        p,
        default_output_dir(SPEC.command),
        f"where objective_ledger.json, .csv and .png go (default {default_output_dir(SPEC.command)})",
    )
    add_trust_remote_code_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from hf_tdiag._atomic import write_text
    from hf_tdiag._outputs import claim_args
    from hf_tdiag._threads import model_threads, torch_threads
    from hf_tdiag.commands._inputs import flag_batches
    from hf_tdiag.diagnostics.objective_ledger import objective_ledger
    from hf_tdiag.loading import load_model
    from hf_tdiag.viz import save_figure

    default_inputs(args, [args.model])
    claim_args(
        args,
        ["objective_ledger.json", "objective_ledger.csv", "objective_ledger.png"],
        inputs=[args.model, args.images, args.texts],
    )
    if args.images is not None and not os.path.isdir(args.images):
        raise ValueError(f"images: expected a folder, got {args.images!r}")
    loaded = load_model(args.model, eager_attention=False, trust_remote_code=args.trust_remote_code)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    loaded.model.to(device)
    batches, _ = flag_batches(args, loaded)
    with torch_threads(model_threads(args.threads, loaded.model, device)):
        report = objective_ledger(loaded.model, batches, settings=settings_from_args(ObjectiveLedgerSettings, args))
    json_path = os.path.join(args.output_dir, "objective_ledger.json")
    report.to_json(json_path)
    csv_path = write_text(os.path.join(args.output_dir, "objective_ledger.csv"), report.to_pandas().to_csv(index=False))
    png_path = save_figure(report.plot(), os.path.join(args.output_dir, "objective_ledger.png"))
    print(f"{'block':>5} {'step':<7} {'objective':<9} {'before':>12} {'after':>12} {'change':>12}")
    for s in report.steps:
        flag = "  INCREASES" if s.increased else ""
        print(f"{s.layer:>5} {s.step:<7} {s.objective:<9} {s.before:>12.6g} {s.after:>12.6g} {s.change:>12.4g}{flag}")
    summary = report.summary()
    print(
        f"{report.model_type}: {int(summary['num_increasing_steps'])} of {int(summary['num_steps'])} steps increase "
        f"their objective ({report.num_samples} {'texts' if args.texts is not None else 'images'})"
    )
    for path in (json_path, csv_path, png_path):
        print(f"wrote {path}")
    return 0
