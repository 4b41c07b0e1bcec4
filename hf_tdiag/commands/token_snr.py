"""``hf-tdiag token-snr MODEL --dataset NAME | --images DIR | --texts FILE``: the token signal-to-noise ratio of every
layer (the attention-only transformer's measure), with class subspaces fitted on part of the labelled inputs and
measured on the rest."""

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
from ..diagnostics.settings import TokenSNRSettings

MAX_SAMPLES = 512  # a class subspace per class needs more inputs than one batch of the other commands


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "token-snr",
        help="token signal-to-noise ratio per layer: does each layer move the tokens into their class's subspace?",
        description=plain(
            "For every layer (0: the embeddings), fit each class's principal subspace U_k (rank --rank) on part of "
            "the labelled inputs (--fit-fraction) and measure on the rest SNR_k = ||U_k U_k^T Z_k|| / "
            "||(I - U_k U_k^T) Z_k||, the token signal-to-noise ratio of the attention-only transformer paper, with "
            "the tokens of each input in its class. Labels come from the image folder's class sub-folders or the "
            "dataset, and from 'label<TAB>text' lines for --texts. Writes token_snr.json, token_snr.csv and "
            "token_snr.png. " + INPUTS_HELP
        ),
    )
    p.add_argument("model", metavar="MODEL", help="a local model folder (save_pretrained) or a Hub id")
    add_input_flags(p, max_samples=MAX_SAMPLES)
    p.add_argument("--max-length", type=positive_int, default=128, help="token limit for --texts (default 128)")
    add_settings_flags(p, TokenSNRSettings)
    add_device_flag(p)
    add_threads_flag(p)
    add_output_dir(
        p,
        default_output_dir("token-snr"),
        f"where token_snr.json, token_snr.csv and token_snr.png go (default {default_output_dir('token-snr')})",
    )
    add_trust_remote_code_flag(p)
    p.set_defaults(func=run)


def _labelled_inputs(args, loaded) -> tuple[list, list[int]]:
    """``(items, labels)``: the images or texts the flags name and one class index per item."""
    from hf_tdiag.inputs import load_images

    if args.texts is not None:
        from hf_tdiag.commands.concept_fidelity import read_texts

        if loaded.modality != "text" or loaded.processor is None:
            raise ValueError(f"texts: {loaded.source!r} is not a text model with a tokenizer in its folder")
        items, names = read_texts(args.texts, args.max_samples)
        if names is None:
            raise ValueError(f"texts: {args.texts!r} has lines without a label; write each as 'label<TAB>text'")
        classes = sorted(set(names))
        return items, [classes.index(n) for n in names]
    if args.images is not None and not os.path.isdir(args.images):
        raise ValueError(f"images: expected a folder, got {args.images!r}")
    found = load_images(args.images or args.dataset, split=args.split, limit=args.max_samples)
    if found.labels is None:
        raise ValueError(f"images: {found.source!r} has no labels; use a folder with one sub-folder per class or a "
                         "labelled dataset")  # fmt: skip
    return found.images, list(found.labels)


def run(args: argparse.Namespace) -> int:
    import torch

    from hf_tdiag._atomic import write_text
    from hf_tdiag._outputs import claim_args
    from hf_tdiag._threads import model_threads, torch_threads
    from hf_tdiag.batching import encoded_batches
    from hf_tdiag.diagnostics.token_snr import token_snr
    from hf_tdiag.loading import load_model
    from hf_tdiag.viz import save_figure

    default_inputs(args, [args.model])
    names = ["token_snr.json", "token_snr.csv", "token_snr.png"]
    claim_args(args, names, inputs=[args.model, args.images, args.texts])
    settings = settings_from_args(TokenSNRSettings, args)
    loaded = load_model(args.model, eager_attention=False, trust_remote_code=args.trust_remote_code)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    loaded.model.to(device)
    items, labels = _labelled_inputs(args, loaded)
    batches = encoded_batches(loaded, items, settings.batch_size, max_length=args.max_length)
    with torch_threads(model_threads(args.threads, loaded.model, device)):
        report = token_snr(loaded.model, batches, labels, settings=settings)
    paths = [os.path.join(args.output_dir, n) for n in names]
    report.to_json(paths[0])
    write_text(paths[1], report.to_pandas().to_csv(index=False))
    save_figure(report.plot(), paths[2])
    print(f"{'layer':>5} {'snr':>10} {'min':>10} {'max':>10} {'signal':>8}")
    for row in report.to_pandas().itertuples():
        print(f"{row.layer:>5} {row.snr:>10.4g} {row.snr_min:>10.4g} {row.snr_max:>10.4g} {row.signal_fraction:>8.3f}")
    summary = report.summary()
    print(
        f"{report.model_type}: token SNR {summary['snr_first_layer']:.4g} (embeddings) -> {summary['snr_last_layer']:.4g}"
        f" (block {report.num_layers}); {report.num_classes} classes, rank {report.rank}, fitted on {report.num_fit} "
        f"inputs, measured on {report.num_measured}"
    )
    for path in paths:
        print(f"wrote {path}")
    return 0
