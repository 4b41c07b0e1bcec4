"""``hf-tdiag srr MODEL... --images DIR | --dataset NAME | --texts FILE``: layer-by-layer sparse rate reduction."""

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
)
from ..diagnostics.settings import SRRSettings


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "srr",
        help="layer-by-layer sparse rate reduction (R, Rc, sparsity, SRR) of CRATE or any transformer",
        description=plain(
            "Measure R(Z), Rc(Z; U), sparsity and SRR = Rc - R + lam*sparsity at every layer (Hu, Zou & Xu 2024), "
            "averaged over the given inputs; write a JSON report and a figure with all models on one plot. "
            "MODEL is a local folder (save_pretrained) or a Hub id. U is CRATE's shared projection, or the "
            "query/key/value projection of other encoders (--source; 'all' measures all three). " + INPUTS_HELP
        ),
    )
    p.add_argument("models", nargs="+", metavar="MODEL", help="local model folders or Hub ids")
    add_input_flags(p)
    sources = [*SRRSettings.field("source").choices, "all"]
    add_settings_flags(
        p,
        SRRSettings,
        overrides={
            "source": dict(
                choices=sources,
                help=f"{SRRSettings.field('source').help} (default {SRRSettings.source}; 'all' = one curve per source)",
            )
        },
    )
    p.add_argument("--max-length", type=positive_int, default=128, help="token limit for --texts (default 128)")
    add_device_flag(p)
    add_threads_flag(p)
    p.add_argument("--labels", nargs="+", default=None, help="legend labels, one per MODEL")
    add_output_dir(p, default_output_dir("srr"), f"where srr.json and srr.png go (default {default_output_dir('srr')})")
    add_trust_remote_code_flag(p)
    p.set_defaults(func=run)


def _model_labels(specs: list[str]) -> list[str]:
    """One label per model: its folder name, with as many parent folders as needed to tell models apart
    (``a/model`` and ``b/model`` stay two rows); the whole spec when even that repeats."""
    parts = [os.path.normpath(s).split(os.sep) if s.strip("/") else [s] for s in specs]
    for depth in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-depth:]) or s for p, s in zip(parts, specs)]
        if len(set(labels)) == len(labels):
            return labels
    return [f"{s} [{i + 1}]" for i, s in enumerate(specs)]  # the same model given twice


def run(args: argparse.Namespace) -> int:
    import torch

    from hf_tdiag._atomic import write_json
    from hf_tdiag._cli_args import settings_from_args
    from hf_tdiag._threads import model_threads, torch_threads
    from hf_tdiag.commands._inputs import flag_batches
    from hf_tdiag.diagnostics.srr import layer_srr
    from hf_tdiag.loading import load_model
    from hf_tdiag.viz import plot_layer_srr, save_figure

    if args.labels is not None and len(args.labels) != len(args.models):
        raise ValueError(f"--labels: expected {len(args.models)} labels (one per MODEL), got {len(args.labels)}")
    from hf_tdiag._outputs import claim_args

    default_inputs(args, args.models)
    claim_args(args, ["srr.json", "srr.png"], inputs=[args.models, args.images, args.texts])
    names = _model_labels(args.models) if args.labels is None else list(args.labels)
    if len(set(names)) != len(names):
        raise ValueError(f"--labels: expected one distinct label per MODEL, got {names}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    reports = {}
    for i, spec in enumerate(args.models):
        loaded = load_model(spec, eager_attention=False, trust_remote_code=args.trust_remote_code)
        loaded.model.to(device)
        inputs, count = flag_batches(args, loaded)
        is_crate = loaded.model_type == "crate"
        sources = ["query"] if is_crate else (["query", "key", "value"] if args.source == "all" else [args.source])
        base = names[i]
        if is_crate and getattr(loaded.config, "variant", None) and not args.labels:
            base = f"{base} ({loaded.config.variant})"
        for source in sources:
            label = base if len(sources) == 1 else f"{base} · {source}"
            print(f"{label}: measuring {count} inputs on {device}")
            with torch_threads(model_threads(args.threads, loaded.model, device)):
                reports[label] = layer_srr(
                    loaded.model, inputs, settings=settings_from_args(SRRSettings, args, source=source)
                )
    json_path = write_json(
        os.path.join(args.output_dir, "srr.json"), {"reports": {k: r.to_dict() for k, r in reports.items()}}
    )
    png_path = save_figure(plot_layer_srr(reports), os.path.join(args.output_dir, "srr.png"))
    header = f"{'model':<40} {'layers':>6} {'n':>6} {'mean SRR':>10} {'last SRR':>10} {'last Rc':>10} {'last R':>10}"
    print(header)
    print("-" * len(header))
    for label, r in reports.items():
        s = r.summary()
        print(
            f"{label[-40:]:<40} {r.num_layers:>6} {r.num_samples:>6} {s['srr_mean_over_layers']:>10.4g} "
            f"{s['srr_last_layer']:>10.4g} {s['Rc_last_layer']:>10.4g} {s['R_last_layer']:>10.4g}"
        )
    print(f"wrote {json_path}")
    print(f"wrote {png_path}")
    return 0
