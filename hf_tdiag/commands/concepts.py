"""``hf-tdiag concepts MODEL --layer L``: Semi-NMF concepts at layer ℓ, their fidelity, and the KL bound."""

from __future__ import annotations

import argparse
import os

from .._cli_args import (
    NUM_CONCEPTS,
    add_device_flag,
    add_input_flags,
    add_output_dir,
    add_threads_flag,
    add_trust_remote_code_flag,
    finite_float,
    non_negative_int,
    plain,
    positive_int,
)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "concepts",
        help="concept fidelity of Semi-NMF concepts (plain / Gram-aligned / classifier-supervised) and the KL bound",
        description=plain(
            "Fit Semi-NMF concepts A ~ U W^T to the layer-l patch-token activations (hidden_states[l], patch tokens "
            "only) of a CRATE or ViT-like image classifier, for each Gram weight mu (0 = plain Semi-NMF) and "
            "optionally with classifier supervision (L_rec + lambda KL through the remaining blocks and the head). "
            "For each: delta_rec, delta_gram, the empirical KL when the layer-l patch tokens are replaced by A_hat "
            "(CLS untouched), top-1 agreement and the KL bound with its constants (||W_c||_op exact; L_block, L_norm, "
            "alpha estimated). Writes concepts.json, a table, and figures. MODEL is a local folder or a Hub id."
        ),
    )
    p.add_argument("model", metavar="MODEL", help="local model folder (save_pretrained) or Hub id")
    p.add_argument("--layer", type=non_negative_int, default=None,
                   help="l in [0, L]: activations are hidden_states[l] (default: L // 2)")
    p.add_argument("--concepts", type=positive_int, default=NUM_CONCEPTS,
                   help=f"number of concepts k (default {NUM_CONCEPTS})")
    p.add_argument("--gram-weight", "--gram-weights", type=finite_float, nargs="+", default=[0.0, 1.0],
                   help="Gram weights mu to fit (default: 0 1); several values give a mu sweep")
    p.add_argument("--supervised", action="store_true", help="also fit classifier-supervised concepts (FACE-like)")
    p.add_argument("--kl-weight", type=finite_float, default=10.0, help="lambda of the supervised fit (default 10)")
    add_input_flags(p, texts=False)
    p.add_argument("--max-iter", type=positive_int, default=200, help="Semi-NMF multiplicative-update iterations (default 200)")
    p.add_argument("--refine-iter", type=non_negative_int, default=100, help="joint-objective / supervised iterations (default 100)")
    p.add_argument("--no-bound", action="store_true", help="skip estimating L_block, L_norm, alpha and the bound")
    p.add_argument("--power-iters", type=positive_int, default=20, help="power-iteration steps for L_block, L_norm (default 20)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="images per forward pass (default 64)")
    add_device_flag(p)
    add_threads_flag(p)
    p.add_argument("--no-figures", action="store_true", help="write only concepts.json and table.txt")
    add_output_dir(p, "concepts_out", "where concepts.json, table.txt and figures go (default concepts_out)")
    add_trust_remote_code_flag(p)
    p.set_defaults(func=run)


def format_table(table: list[dict]) -> str:
    """The comparison table as aligned text (one row per fit)."""
    cols = [("method", "{:<16}"), ("kl", "{:>10.4g}"), ("top1_agreement", "{:>6.3f}"), ("delta_rec_rel", "{:>9.4f}"),
            ("delta_gram", "{:>9.4f}"), ("bound", "{:>10.3g}"), ("frac_kl_below_bound", "{:>6.2f}"),
            ("cosine_to_supervised", "{:>7.4f}"), ("update_cosine_to_supervised", "{:>7.3f}"), ("fit_seconds", "{:>7.1f}")]
    heads = ["method", "KL", "top1", "δrec/‖A‖", "δgram", "bound", "KL≤B", "cos→sup", "Δcos", "fit s"]
    widths = [16, 10, 6, 9, 9, 10, 6, 7, 7, 7]
    lines = [" ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(heads, widths)))]
    lines.append("-" * len(lines[0]))
    for row in table:
        cells = []
        for (key, fmt), w in zip(cols, widths):
            v = row.get(key)
            cells.append(fmt.format(v) if v is not None else "-".rjust(w))
        lines.append(" ".join(cells))
    return "\n".join(lines)


def _json_ready(obj):
    if isinstance(obj, dict):
        return {str(k): _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_ready(v) for v in obj]
    if isinstance(obj, float) and obj != obj:
        return None
    return obj


def run(args: argparse.Namespace) -> int:
    import torch

    from hf_tdiag._atomic import write_json, write_text
    from hf_tdiag._threads import model_threads, torch_threads
    from hf_tdiag.inputs import load_images
    from hf_tdiag.loading import load_model, pixel_values_for
    from hf_tdiag.probes.concept_fidelity import compare_concepts, layer_activations
    from hf_tdiag.viz.concepts import (
        plot_concept_heatmaps,
        plot_kl_vs_bound,
        plot_mu_sweep,
        plot_top_patches,
        save_figure,
    )

    if any(mu < 0 for mu in args.gram_weight):
        raise ValueError(f"--gram-weight: expected values >= 0, got {args.gram_weight}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    loaded = load_model(args.model, eager_attention=False, trust_remote_code=args.trust_remote_code)
    model = loaded.model.to(device)
    if args.images is not None and not os.path.isdir(args.images):
        raise ValueError(f"images: expected a folder, got {args.images!r}")
    imageset = load_images(args.images or args.dataset, split=args.split, limit=args.max_samples)
    pixels = torch.cat([pixel_values_for(imageset.images[i : i + args.batch_size], loaded)
                        for i in range(0, len(imageset.images), args.batch_size)])
    layer = args.layer if args.layer is not None else int(model.config.num_hidden_layers) // 2
    print(f"{args.model}: layer {layer}, {len(imageset.images)} images from {imageset.source}, k={args.concepts}, on {device}")
    threads = model_threads(args.threads, model, device)
    with torch_threads(threads):
        out = compare_concepts(model, pixels, layer, args.concepts, gram_weights=args.gram_weight,
                               supervised=args.supervised, kl_weight=args.kl_weight, max_iter=args.max_iter,
                               refine_iter=args.refine_iter, supervised_iter=args.refine_iter,
                               estimate=not args.no_bound, power_iters=args.power_iters, batch_size=args.batch_size)
    estimators = out.pop("estimators")
    out["model"] = args.model
    out["images"] = {"source": imageset.source, "count": len(imageset.images)}
    json_path = write_json(os.path.join(args.output_dir, "concepts.json"), _json_ready(out))
    table = format_table(out["table"])
    write_text(os.path.join(args.output_dir, "table.txt"), table + "\n")
    print(table)
    print(f"wrote {json_path}")
    if not args.no_figures:
        with torch_threads(threads):
            A = layer_activations(model, pixels, layer, batch_size=args.batch_size).patches
        label = next((k for k in estimators if k.startswith("gram")), next(iter(estimators)))
        codes = estimators[label].transform(A)
        paths = [
            save_figure(plot_concept_heatmaps(pixels, codes, out["grid"], title=f"{label} concepts, layer {layer}"),
                        os.path.join(args.output_dir, "heatmaps.png")),
            save_figure(plot_top_patches(pixels, codes, out["grid"], title=f"top patches per concept ({label})"),
                        os.path.join(args.output_dir, "top_patches.png")),
        ]
        if not args.no_bound:
            paths.append(save_figure(plot_kl_vs_bound(out["runs"]), os.path.join(args.output_dir, "kl_vs_bound.png")))
        sweep = [{"gram_weight": r["gram_weight"], "delta_gram": r["delta_gram"], "kl": r["kl"],
                  "delta_rec_rel": r["delta_rec_rel"]} for k, r in out["runs"].items() if k != "supervised"]
        if len(sweep) > 1:
            paths.append(save_figure(plot_mu_sweep(sweep), os.path.join(args.output_dir, "mu_sweep.png")))
        for path in paths:
            print(f"wrote {path}")
    return 0
