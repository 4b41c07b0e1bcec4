"""``hf-tdiag report MODEL --images DIR|--dataset NAME -o report.html``: one-page diagnostics report.

Writes a self-contained HTML page (figures embedded) and the numbers behind it as JSON beside it
(``report.json`` for ``report.html``). Exit code 1 if any section failed (the page is still written).
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="one self-contained HTML page with every diagnostic that applies to a model (+ JSON of the numbers)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="local model folder (save_pretrained) or Hub id (loaded with trust_remote_code=False)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--images", metavar="DIR", help="folder of images to run the input-based diagnostics on")
    src.add_argument(
        "--dataset",
        metavar="NAME",
        help="'digits' (scikit-learn's 8x8 digits, held-out split, offline) or a Hub image dataset name",
    )
    src.add_argument("--texts", metavar="FILE", help="text file, one input per line (BERT-like models)")
    p.add_argument("--split", default="test", help="dataset split (default: test)")
    p.add_argument("--max-images", type=int, default=64, help="number of inputs used (default: 64)")
    p.add_argument("-o", "--output", default="report.html", help="HTML file to write (JSON goes beside it)")
    p.add_argument(
        "--sections",
        nargs="+",
        default=None,
        help="subset of: summary srr schatten concepts attention (default: all that apply)",
    )
    p.add_argument("--layer", type=int, default=None, help="layer for the concept section (default: middle)")
    p.add_argument("--attention-layer", type=int, default=None, help="layer for the head diagnostic (default: last)")
    p.add_argument("--head", type=int, default=0, help="head for the attention-SVM diagnostic (default: 0)")
    p.add_argument("--concepts", type=int, default=4, help="number of Semi-NMF concepts (default: 4)")
    p.add_argument("--srr-source", default="query", choices=("query", "key", "value"), help="U for non-CRATE models")
    p.add_argument("--title", default=None, help="page title")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hf_tdiag.report.inputs import inputs_from_args
    from hf_tdiag.loading import load_model
    from hf_tdiag.report.report import ReportOptions, build_report

    if args.max_images < 1:
        raise ValueError(f"--max-images: expected a positive integer, got {args.max_images}")
    loaded = load_model(args.model)
    inputs = inputs_from_args(
        loaded, images=args.images, dataset=args.dataset, texts=args.texts, split=args.split, limit=args.max_images
    )
    options = ReportOptions(
        srr_source=args.srr_source,
        concept_layer=args.layer,
        n_concepts=args.concepts,
        attention_layer=args.attention_layer,
        attention_head=args.head,
    )
    report = build_report(loaded, inputs, sections=args.sections, options=options, title=args.title)
    html_path, json_path = report.save(args.output)
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
