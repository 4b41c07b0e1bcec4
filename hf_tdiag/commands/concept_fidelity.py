"""``hf-tdiag concept-fidelity MODEL --layer L`` (or ``--layers all``): Semi-NMF concepts, their fidelity, and the KL bound."""

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
    finite_float,
    flatten,
    list_of,
    non_negative_int,
    plain,
    positive_int,
    settings_from_args,
)
from ..diagnostics.registry import diagnostic
from ..diagnostics.settings import ConceptFidelitySettings

SPEC = diagnostic("concept_fidelity")


def _write_results(output_dir: str, json_name: str, out: dict, table: str) -> None:
    """``output_dir/json_name`` and ``table.txt`` (atomically); the table and the JSON path on stdout."""
    from hf_tdiag._atomic import write_json, write_text

    json_path = write_json(os.path.join(output_dir, json_name), _json_ready(out))
    write_text(os.path.join(output_dir, "table.txt"), table + "\n")
    print(table)
    print(f"wrote {json_path}")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        SPEC.command,
        help="concept fidelity of Semi-NMF concepts (plain / Gram-aligned / classifier-supervised) and the KL bound",
        description=plain(
            "Fit Semi-NMF concepts A ~ U W^T to the layer-l concept-token activations (hidden_states[l]; an image's "
            "patch tokens, or a text's non-special tokens) of a CRATE or ViT-like image classifier or a BERT-like "
            "encoder, for each Gram weight mu (0 = plain Semi-NMF) and optionally with classifier supervision. For "
            "each: delta_rec, delta_gram, the empirical KL when the layer-l concept tokens are replaced by A_hat (CLS "
            "untouched), top-1 agreement and the KL bound twice: certified (every constant an upper bound, "
            "docs/concept_bound.md) and estimated (local estimates). With --layers all: the same for every layer "
            "(first --gram-weight), with a log-scale figure. MODEL is a local folder or a Hub id. " + INPUTS_HELP
        ),
    )
    p.add_argument("model", metavar="MODEL", help="local model folder (save_pretrained) or Hub id")
    _add_layer_flags(p)
    _add_fit_flags(p)
    add_input_flags(p)
    add_settings_flags(
        p,
        ConceptFidelitySettings,
        overrides={
            "max_tokens": dict(
                help="texts: cut every text to this many tokens (default: the shortest text's count); a text "
                "file may give labels as 'label<TAB>text' lines"
            )
        },
    )
    add_device_flag(p)
    add_threads_flag(p)
    p.add_argument("--no-figures", action="store_true", help="write only the JSON and the table")
    add_output_dir(
        p,
        default_output_dir(SPEC.command),
        f"where concept_fidelity.json (or sweep.json), table.txt and figures go (default "
        f"{default_output_dir(SPEC.command)})",
    )
    add_trust_remote_code_flag(p)
    p.set_defaults(func=run)


def _add_layer_flags(p) -> None:
    """``--layer L`` or ``--layers all|L ...`` (one of them)."""
    layer = p.add_mutually_exclusive_group()
    layer.add_argument(
        "--layer",
        type=non_negative_int,
        default=None,
        help="l in [0, L]: activations are hidden_states[l] (default: L // 2)",
    )
    layer.add_argument(
        "--layers",
        default=None,
        type=list_of(_layer_token),
        nargs="+",
        metavar="all|L",
        help="layer sweep: 'all' (0..L) or layers, space- or comma-separated (1 3 or 1,3); one fit per layer",
    )


def _add_fit_flags(p) -> None:
    """The fits: Gram weights, the supervised fit and its λ, the iteration counts."""
    p.add_argument(
        "--gram-weight",
        "--gram-weights",
        type=list_of(finite_float),
        nargs="+",
        default=[[0.0, 1.0]],
        metavar="MU",
        help="Gram weights mu to fit, space- or comma-separated (default: 0 1); several values give a mu sweep",
    )
    p.add_argument("--supervised", action="store_true", help="also fit classifier-supervised concepts (FACE-like)")
    p.add_argument("--kl-weight", type=finite_float, default=10.0, help="lambda of the supervised fit (default 10)")
    p.add_argument(
        "--max-iter", type=positive_int, default=200, help="Semi-NMF multiplicative-update iterations (default 200)"
    )
    p.add_argument(
        "--refine-iter",
        type=non_negative_int,
        default=100,
        help="joint-objective / supervised iterations (default 100)",
    )


def format_table(table: list[dict]) -> str:
    """The comparison table as aligned text (one row per fit)."""
    cols = [
        ("method", "{:<16}", 16, "method"),
        ("kl", "{:>10.4g}", 10, "KL"),
        ("top1_agreement", "{:>6.3f}", 6, "top1"),
        ("delta_rec_rel", "{:>9.4f}", 9, "δrec/‖A‖"),
        ("delta_gram", "{:>9.4f}", 9, "δgram"),
        ("bound_certified", "{:>10.3g}", 10, "certified"),
        ("bound_estimated", "{:>10.3g}", 10, "estimated"),
        ("frac_kl_below_bound_estimated", "{:>6.2f}", 6, "KL≤est"),
        ("cosine_to_supervised", "{:>7.4f}", 7, "cos→sup"),
        ("update_cosine_to_supervised", "{:>7.3f}", 7, "Δcos"),
        ("fit_seconds", "{:>7.1f}", 7, "fit s"),
    ]
    return _aligned(table, cols)


def format_sweep_table(table: list[dict]) -> str:
    """The layer sweep as aligned text (one row per layer)."""
    cols = [
        ("layer", "{:<5d}", 5, "layer"),
        ("delta_rec", "{:>10.4g}", 10, "δ_rec"),
        ("delta_rec_rel", "{:>9.4f}", 9, "δrec/‖A‖"),
        ("delta_gram", "{:>9.4f}", 9, "δ_gram"),
        ("kl", "{:>10.3g}", 10, "KL mean"),
        ("kl_max", "{:>10.3g}", 10, "KL max"),
        ("bound_certified", "{:>10.3g}", 10, "certified"),
        ("bound_certified_chain", "{:>10.3g}", 10, "cert.chain"),
        ("bound_estimated", "{:>10.3g}", 10, "estimated"),
    ]
    return _aligned(table, cols)


def _aligned(table, cols) -> str:
    lines = [" ".join(h.rjust(w) if i else h.ljust(w) for i, (_, _, w, h) in enumerate(cols))]
    lines.append("-" * len(lines[0]))
    for row in table:
        lines.append(
            " ".join(fmt.format(row[key]) if row.get(key) is not None else "-".rjust(w) for key, fmt, w, _ in cols)
        )
    return "\n".join(lines)


def _json_ready(obj):
    if isinstance(obj, dict):
        return {str(k): _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_ready(v) for v in obj]
    if isinstance(obj, float) and obj != obj:
        return None
    return obj


def read_texts(path, limit=None) -> tuple[list[str], list[str] | None]:
    """Texts of a file (one per line); ``label<TAB>text`` lines give labels (all lines or none)."""
    from hf_tdiag.inputs import text_lines

    lines = text_lines(path, limit=limit)
    split = [line.split("\t", 1) for line in lines]
    if all(len(s) == 2 for s in split):
        return [s[1].strip() for s in split], [s[0].strip() for s in split]
    return lines, None


def _inputs(args, loaded):
    """(model inputs, {source, count, kind}, extra concept_fidelity kwargs, pixel values for figures or None)."""
    cs = settings_from_args(ConceptFidelitySettings, args)

    if loaded.modality == "text":
        if not args.texts:
            raise ValueError(
                f"texts: {args.model!r} is a text model; pass --texts FILE (one text per line, "
                "optionally 'label<TAB>text')"
            )
        texts, labels = read_texts(args.texts, args.max_samples)
        source = args.texts
        opts = {
            "tokenizer": loaded.processor,
            "max_tokens": cs.max_tokens,
            "n_clusters": cs.n_clusters,
            "labels": labels,
        }
        texts = texts[: args.max_samples]
        opts["labels"] = None if labels is None else labels[: args.max_samples]
        return texts, {"source": source, "count": len(texts), "kind": "texts"}, opts, None
    from hf_tdiag.batching import concat, encoded_batches
    from hf_tdiag.inputs import load_images

    if args.texts:
        raise ValueError(f"texts: {args.model!r} is an image model; use --images or --dataset")
    if args.images is not None and not os.path.isdir(args.images):
        raise ValueError(f"images: expected a folder, got {args.images!r}")
    imageset = load_images(args.images or args.dataset, split=args.split, limit=args.max_samples)
    pixels = concat(list(encoded_batches(loaded, imageset.images, cs.batch_size)))
    return pixels, {"source": imageset.source, "count": len(imageset.images), "kind": "images"}, {}, pixels


def _layer_token(text: str):
    """One item of ``--layers``: ``all`` or a layer ℓ ≥ 0 (checked against the model once it is loaded)."""
    if text.lower() == "all":
        return "all"
    return non_negative_int(text)


def _parse_layers(layers: list, num_layers: int):
    if "all" in layers:
        if len(layers) > 1:
            raise ValueError(f"--layers: 'all' stands alone, got {layers}")
        return "all"
    return layers


def _describe(source: dict) -> str:
    return f"{source['count']} {source['kind']} from {source['source']}"


def _run_sweep(args, model, inputs, opts, source, threads) -> int:
    cs = settings_from_args(ConceptFidelitySettings, args)
    from hf_tdiag._threads import torch_threads
    from hf_tdiag.diagnostics.concept_fidelity import concept_fidelity
    from hf_tdiag.measures.concepts import SemiNMF
    from hf_tdiag.viz.concept_fidelity import plot_layer_sweep, save_figure

    layers = _parse_layers(args.layers, int(model.config.num_hidden_layers))
    mu = float(args.gram_weight[0])
    print(f"{args.model}: layer sweep {args.layers}, {_describe(source)}, k={cs.n_concepts}, mu={mu:g}")
    est = SemiNMF(cs.n_concepts, gram_weight=mu, max_iter=args.max_iter, refine_iter=args.refine_iter)
    with torch_threads(threads):
        out = concept_fidelity(
            model,
            inputs,
            None,
            est,
            layers=layers,
            bounds=cs.bounds,
            power_iters=cs.power_iters,
            max_images_for_constants=cs.max_images_for_constants,
            batch_size=cs.batch_size,
            **opts,
        )
    out.update(model=args.model, inputs=source, gram_weight=mu, n_concepts=cs.n_concepts)
    _write_results(args.output_dir, "sweep.json", out, format_sweep_table(out["table"]))
    if not args.no_figures:
        path = save_figure(
            plot_layer_sweep(
                out,
                title=f"{os.path.basename(str(args.model).rstrip('/'))}: k={cs.n_concepts}, "
                f"mu={mu:g}, {_describe(source)}",
            ),
            os.path.join(args.output_dir, "sweep.png"),
        )
        print(f"wrote {path}")
    return 0


def _figures(args, model, pixels, out, estimators, layer, threads):
    cs = settings_from_args(ConceptFidelitySettings, args)
    from hf_tdiag._threads import torch_threads
    from hf_tdiag.diagnostics.concept_fidelity.compare import mu_sweep_rows
    from hf_tdiag.probes.concept_model import layer_activations
    from hf_tdiag.viz.concept_fidelity import (
        plot_concept_heatmaps,
        plot_kl_vs_bound,
        plot_mu_sweep,
        plot_top_patches,
        save_figure,
    )

    paths = []
    if pixels is not None:
        with torch_threads(threads):
            A = layer_activations(model, pixels, layer, batch_size=cs.batch_size).patches
        label = next((k for k in estimators if k.startswith("gram")), next(iter(estimators)))
        codes = estimators[label].transform(A)
        paths += [
            save_figure(
                plot_concept_heatmaps(pixels, codes, out["grid"], title=f"{label} concepts, layer {layer}"),
                os.path.join(args.output_dir, "heatmaps.png"),
            ),
            save_figure(
                plot_top_patches(pixels, codes, out["grid"], title=f"top patches per concept ({label})"),
                os.path.join(args.output_dir, "top_patches.png"),
            ),
        ]
    if cs.bounds:
        paths.append(save_figure(plot_kl_vs_bound(out["runs"]), os.path.join(args.output_dir, "kl_vs_bound.png")))
    sweep = mu_sweep_rows(out["runs"])
    if len(sweep) > 1:
        paths.append(save_figure(plot_mu_sweep(sweep), os.path.join(args.output_dir, "mu_sweep.png")))
    return paths


def run(args: argparse.Namespace) -> int:
    cs = settings_from_args(ConceptFidelitySettings, args)
    args.gram_weight, args.layers = flatten(args.gram_weight), flatten(args.layers)
    if any(mu < 0 for mu in args.gram_weight):
        raise ValueError(f"--gram-weight: expected values >= 0, got {args.gram_weight}")
    from hf_tdiag._outputs import claim_args

    default_inputs(args, [args.model])
    claim_args(
        args,
        ["sweep.json" if args.layers is not None else "concept_fidelity.json", "table.txt"],
        inputs=[args.model, getattr(args, "images", None), getattr(args, "texts", None)],
        stale=["sweep.png", "heatmaps.png", "top_patches.png", "kl_vs_bound.png", "mu_sweep.png"],
    )
    import torch

    from hf_tdiag._threads import model_threads, torch_threads
    from hf_tdiag.diagnostics.concept_fidelity import compare_concepts
    from hf_tdiag.loading import load_model

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    loaded = load_model(args.model, eager_attention=False, trust_remote_code=args.trust_remote_code)
    model = loaded.model.to(device)
    inputs, source, opts, pixels = _inputs(args, loaded)
    threads = model_threads(args.threads, model, device)
    if args.layers is not None:
        return _run_sweep(args, model, inputs, opts, source, threads)
    layer = args.layer if args.layer is not None else int(model.config.num_hidden_layers) // 2
    print(f"{args.model}: layer {layer}, {_describe(source)}, k={cs.n_concepts}, on {device}")
    with torch_threads(threads):
        out = compare_concepts(
            model,
            inputs,
            layer,
            cs.n_concepts,
            gram_weights=args.gram_weight,
            supervised=args.supervised,
            kl_weight=args.kl_weight,
            max_iter=args.max_iter,
            refine_iter=args.refine_iter,
            supervised_iter=args.refine_iter,
            bounds=cs.bounds,
            power_iters=cs.power_iters,
            max_images_for_constants=cs.max_images_for_constants,
            batch_size=cs.batch_size,
            **opts,
        )
    estimators = out.pop("estimators")
    out.update(model=args.model, inputs=source)
    _write_results(args.output_dir, "concept_fidelity.json", out, format_table(out["table"]))
    for label, run in out["runs"].items():  # a bound that says nothing is labelled where it is shown
        for bound, reason in run.vacuous_reasons().items():
            print(f"{label}: {bound} is {reason}")
    if not args.no_figures:
        for path in _figures(args, model, pixels, out, estimators, layer, threads):
            print(f"wrote {path}")
    return 0
