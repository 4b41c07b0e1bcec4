"""``hf-tdiag report MODEL [--images DIR|--dataset NAME|--texts FILE] --output-dir DIR``: one-page diagnostics report.

Writes a self-contained HTML page (figures embedded), ``report.html``, and the numbers behind it, ``report.json``,
into ``--output-dir``. Without an input flag the inputs are the held-out data the model was trained on (a model
trained by hf-tdiag records it); a model that records none needs an input flag, unless ``--sections`` names only the
weight-based sections (summary, schatten). Exit code 1 if any section failed (the page is still written).
"""

from __future__ import annotations

import argparse
import os
import sys

from .._cli_args import (
    INPUT_FLAGS,
    NUM_CONCEPTS,
    add_input_flags,
    add_output_dir,
    add_threads_flag,
    add_trust_remote_code_flag,
    default_inputs,
    default_output_dir,
    flatten,
    list_of,
    non_negative_int,
    plain,
    positive_int,
)
from .._defaults import REPORT_SECTIONS, SECTIONS_WITH_INPUTS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="one self-contained HTML page with every diagnostic that applies to a model (+ JSON of the numbers)",
        description=plain(__doc__),
    )
    p.add_argument("model", help="local model folder (save_pretrained) or Hub id (loaded with trust_remote_code=False)")
    add_input_flags(p)
    add_output_dir(
        p,
        default_output_dir("report"),
        f"folder for report.html and report.json (default {default_output_dir('report')})",
    )
    p.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="FILE",
        help="write the page to this .html file instead (its JSON goes beside it)",
    )
    p.add_argument(
        "--sections",
        nargs="+",
        type=list_of(str, REPORT_SECTIONS),
        default=None,
        metavar="SECTION",
        help=f"subset of: {' '.join(REPORT_SECTIONS)}, space- or comma-separated (default: all that apply)",
    )
    p.add_argument(
        "--layer",
        type=non_negative_int,
        default=None,
        help="concept layer: hidden_states index 0..L, l = output of block l (default: the middle block)",
    )
    p.add_argument(
        "--attention-layer",
        type=positive_int,
        default=None,
        help="block number 1..L of the attention maps and head diagnostic (default: the last block L)",
    )
    p.add_argument(
        "--head",
        type=non_negative_int,
        default=0,
        help="head for the attention-SVM diagnostic, 0-based as in Transformers (default: 0)",
    )
    p.add_argument(
        "--concepts",
        type=positive_int,
        default=NUM_CONCEPTS,
        help=f"number of Semi-NMF concepts (default {NUM_CONCEPTS})",
    )
    p.add_argument("--srr-source", default="query", choices=("query", "key", "value"), help="U for non-CRATE models")
    p.add_argument("--title", default=None, help="page title")
    add_threads_flag(p)
    add_trust_remote_code_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hf_tdiag._outputs import claim_args

    sections = flatten(args.sections)
    if not default_inputs(args, [args.model], required=False):
        need = [s for s in (sections or REPORT_SECTIONS) if s in SECTIONS_WITH_INPUTS]
        if need:
            free = ",".join(s for s in REPORT_SECTIONS if s not in SECTIONS_WITH_INPUTS)
            raise ValueError(
                f"inputs: the sections {', '.join(need)} measure the model on inputs: pass {INPUT_FLAGS} "
                f"({args.model!r} records no dataset it was trained on), or --sections {free} for the weight-only ones"
            )
    page = args.output or os.path.join(args.output_dir, "report.html")
    if os.path.splitext(page)[1].lower() not in (".html", ".htm"):
        raise ValueError(f"--output: expected a file name ending in .html, got {page!r}")
    page_name = os.path.basename(page)
    claim_args(
        args,
        [page_name, os.path.splitext(page_name)[0] + ".json"],
        inputs=[args.model, args.images, args.texts],
        folder=os.path.dirname(page) or ".",
    )
    from hf_tdiag._threads import model_threads, torch_threads
    from hf_tdiag.loading import load_model
    from hf_tdiag.report.headline import key_numbers
    from hf_tdiag.report.inputs import inputs_from_args
    from hf_tdiag.report.report import ReportOptions, build_report

    loaded = load_model(args.model, trust_remote_code=args.trust_remote_code)
    options = ReportOptions(
        srr_source=args.srr_source,
        concept_layer=args.layer,
        n_concepts=args.concepts,
        attention_layer=args.attention_layer,
        attention_head=args.head,
    )
    flags = {"concept_layer": "--layer", "n_concepts": "--concepts", "attention_layer": "--attention-layer"}
    options.check(loaded.model, sections, {**flags, "attention_head": "--head"})  # before the inputs are read
    inputs = inputs_from_args(
        loaded, images=args.images, dataset=args.dataset, texts=args.texts, split=args.split, limit=args.max_samples
    )
    with torch_threads(model_threads(args.threads, loaded.model, next(loaded.model.parameters()).device)):
        report = build_report(loaded, inputs, sections=sections, options=options, title=args.title)
    html_path, json_path = report.save(page)
    for box in key_numbers(report.sections):  # the page's headline numbers, with what they were measured on
        reason = box["reason"] if box["reason"].startswith(box["flag"]) else f"{box['flag']}: {box['reason']}"
        flag = f" [{reason}]" if box["flag"] else ""
        print(f"  {box['label']}: {box['value']}" + (f" ({box['detail']})" if box["detail"] else "") + flag)
    for section in report.sections:
        line = f"  {section.key:<10} {section.status}"
        if section.note:
            line += f": {section.note.splitlines()[0][:160]}"
        print(line)
    print(f"wrote {html_path} and {json_path}")
    if report.errors:
        print(f"hf-tdiag report: {len(report.errors)} section(s) failed: {sorted(report.errors)}", file=sys.stderr)
        return 1
    return 0
