"""``hf-tdiag attention-svm MODEL --layer L --head H``: how max-margin-like is an attention head."""

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
from ..diagnostics.settings import AttentionSVMSettings


def _max_queries(text: str) -> int | None:
    """``--max-queries``: a positive count, or ``all``/``0`` for every query (``None``, as in the Python API)."""
    if text.strip().lower() in ("all", "0"):
        return None
    return positive_int(text)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "attention-svm",
        help="Att-SVM diagnostic of attention heads (Tarzanagh et al. 2023): correlation of W_K^T W_Q with W_mm",
        description=plain(
            "For one block (1..L) and head (or every head with --head all) of a CRATE, ViT-like or BERT-like model: take "
            "each query's attended token as its selection, solve the attention SVM W_mm = argmin ||W|| s.t. "
            "(x_sel - x_t)^T W x_q >= 1 in the head's input space, and report the correlation of the head's "
            "W_K^T W_Q with W_mm, its margins against the SVM margin and how one-hot its attention is. "
            "Writes attention_svm.json and one figure per head. MODEL is a local folder or a Hub id. " + INPUTS_HELP
        ),
    )
    p.add_argument("model", metavar="MODEL", help="local model folder (save_pretrained) or Hub id")
    p.add_argument(
        "--layer",
        type=positive_int,
        required=True,
        help="block number 1..L (the l-th transformer block; its input is hidden_states[l-1])",
    )
    p.add_argument("--head", default="0", help="head index, 0-based as in Transformers, or 'all' (default 0)")
    add_input_flags(p, max_samples=8)
    p.add_argument("--queries", default="all", help="'all', 'cls' or comma-separated token positions (default all)")
    p.add_argument("--max-length", type=positive_int, default=128, help="token limit for --texts (default 128)")
    add_settings_flags(
        p,
        AttentionSVMSettings,
        overrides={
            "max_queries": dict(
                type=_max_queries,
                help="queries sampled for the SVM: a number, or 'all' (0 also means all; "
                f"default {AttentionSVMSettings.max_queries})",
            )
        },
    )
    add_device_flag(p)
    add_threads_flag(p)
    add_output_dir(
        p,
        default_output_dir("attention-svm"),
        f"where attention_svm.json and the figures go (default {default_output_dir('attention-svm')})",
    )
    add_trust_remote_code_flag(p)
    p.set_defaults(func=run)


def _queries(spec: str):
    if spec in ("all", "cls"):
        return spec
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--queries: expected 'all', 'cls' or comma-separated integers, got {spec!r}") from None


def _batch(args, loaded):
    from hf_tdiag._model_limits import check_texts_fit
    from hf_tdiag.inputs import load_images, text_lines
    from hf_tdiag.loading import pixel_values_for

    if args.texts is not None:
        if loaded.modality != "text" or loaded.processor is None:
            raise ValueError(f"texts: {loaded.source!r} is not a text model with a tokenizer in its folder")
        lines = text_lines(args.texts, args.max_samples)
        check_texts_fit(loaded.model, loaded.processor, lines, args.max_length, name=f"--texts {args.texts!r}")
        return dict(
            loaded.processor(lines, padding=True, truncation=True, max_length=args.max_length, return_tensors="pt")
        )
    if loaded.modality != "image":
        raise ValueError(f"model: {loaded.source!r} is a text model; pass --texts FILE")
    if args.images is not None and not os.path.isdir(args.images):
        raise ValueError(f"images: expected a folder, got {args.images!r}")
    images = load_images(args.images or args.dataset, split=args.split, limit=args.max_samples).images
    return pixel_values_for(images, loaded)


def _heads(args, arch) -> list[int]:
    """The heads ``--head`` names (``all``: every head of block ``--layer``), after ``--layer`` is checked."""
    from hf_tdiag._validation import block_number

    block_number(args.layer, arch.num_layers, "--layer")
    if args.head == "all":
        return list(range(arch.layers[args.layer - 1].num_heads))
    try:
        return [int(args.head)]
    except ValueError:
        raise ValueError(f"--head: expected an integer or 'all', got {args.head!r}") from None


def run(args: argparse.Namespace) -> int:
    import torch

    from hf_tdiag._atomic import write_json
    from hf_tdiag._outputs import claim_args
    from hf_tdiag._threads import model_threads, torch_threads
    from hf_tdiag.diagnostics.attention_svm import attention_svm_diagnostic
    from hf_tdiag.loading import load_model
    from hf_tdiag.probes.describe import describe
    from hf_tdiag.viz import save_figure
    from hf_tdiag.viz.attention_svm import plot_head_diagnostic

    default_inputs(args, [args.model])
    claim_args(
        args,
        ["attention_svm.json"],
        inputs=[args.model, getattr(args, "images", None), getattr(args, "texts", None)],
        stale=["attention_svm_l*_h*.png"],
    )
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    loaded = load_model(args.model, eager_attention=False, trust_remote_code=args.trust_remote_code)
    loaded.model.to(device)
    heads = _heads(args, describe(loaded.model))
    batch = _batch(args, loaded)
    results = []
    header = f"{'layer':>5} {'head':>4} {'n':>4} {'corr':>8} {'corr(span)':>10} {'margin ratio':>12} {'one-hot':>8} {'gap':>9} {'time s':>7}"
    print(header)
    print("-" * len(header))
    for h in heads:
        with torch_threads(model_threads(args.threads, loaded.model, device)):
            diag = attention_svm_diagnostic(
                loaded.model,
                batch,
                args.layer,
                h,
                queries=_queries(args.queries),
                settings=settings_from_args(AttentionSVMSettings, args),
                progress=True,
            )
        s = diag.summary()
        results.append(diag.to_dict())
        print(
            f"{args.layer:>5} {h:>4} {s['num_queries']:>4} {s['correlation']:>8.4f} {s['correlation_in_span']:>10.4f} "
            f"{s['margin_ratio']:>12.4f} {s['one_hot_fraction']:>8.2f} {s['svm']['duality_gap']:>9.1e} {s['svm']['solve_time_s']:>7.2f}"
        )
        if not diag.svm.feasible:
            print(f"  infeasible: {diag.svm.message}")
        save_figure(plot_head_diagnostic(diag), os.path.join(args.output_dir, f"attention_svm_l{args.layer}_h{h}.png"))
    json_path = write_json(
        os.path.join(args.output_dir, "attention_svm.json"),
        {"model": loaded.source, "layer": args.layer, "heads": results},
    )
    print(f"wrote {json_path} and {len(heads)} figure(s) to {args.output_dir}")
    return 0
