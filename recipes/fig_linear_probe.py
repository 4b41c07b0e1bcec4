#!/usr/bin/env python
"""Hu, Zou & Xu (2024), rebuttal Fig. 1: linear-probe accuracy of every layer's output next to its SRR.

    python recipes/fig_linear_probe.py --output-dir docs/figures                  # trains a digits CRATE (~1 min)
    python recipes/fig_linear_probe.py --model runs/main --output-dir out         # a trained digits CRATE folder

For layer ℓ = 0 (embeddings Z^0) … L (output Z^ℓ of block ℓ): the token-mean of Z^ℓ on the digits training
images fits a logistic regression (:func:`hf_tdiag.measures.linear_probe.linear_probe_accuracy`), scored on
the test images; SRR(Z^ℓ; U^ℓ) is measured on the same test images (:func:`hf_tdiag.layer_srr`). Does lower SRR
go with better linear separability? Kendall's τ between the two across layers answers it for this model.
-> linear_probe.png, linear_probe.json

A second run into the same folders is refused (the earlier figure, its JSON and the training run are kept) unless
``--overwrite-output-dir`` is given, which replaces them (:func:`hf_tdiag._outputs.claim_output_dir`).
"""

import argparse
import os
import sys

import torch


def _pixel_values(processor, images, batch_size=256):
    from PIL import Image

    for i in range(0, len(images), batch_size):
        yield processor([Image.fromarray(x) for x in images[i : i + batch_size]], return_tensors="pt")["pixel_values"]


def measure(model, processor, max_train: int | None = None) -> dict:
    """Per-layer linear-probe accuracy and SRR of a digits classifier (layer 0 = embeddings)."""
    from scipy.stats import kendalltau

    from hf_tdiag import layer_srr
    from hf_tdiag.measures.linear_probe import linear_probe_accuracy
    from hf_tdiag.probes.layer_features import layer_features
    from hf_tdiag.training.data import digits_split

    x_tr, x_te, y_tr, y_te = digits_split()
    if max_train:
        x_tr, y_tr = x_tr[:max_train], y_tr[:max_train]
    train_f = layer_features(model, _pixel_values(processor, x_tr))
    test_f = layer_features(model, _pixel_values(processor, x_te))
    accuracy = [linear_probe_accuracy(a.numpy(), y_tr, b.numpy(), y_te) for a, b in zip(train_f, test_f)]
    report = layer_srr(model, torch.cat(list(_pixel_values(processor, x_te))), batch_size=128, progress=False)
    srr = [report.embeddings["mean"]["srr"]] + report.per_layer("srr")
    tau = kendalltau(srr, accuracy)
    return {
        "layers": list(range(len(accuracy))),
        "probe_accuracy": accuracy,
        "srr": srr,
        "Rc": [report.embeddings["mean"]["Rc"]] + report.per_layer("Rc"),
        "sparsity": [report.embeddings["mean"]["sparsity"]] + report.per_layer("sparsity"),
        "kendall_tau_srr_vs_accuracy": float(tau.statistic),
        "kendall_p_value": float(tau.pvalue),
        "num_train": int(len(y_tr)),
        "num_test": int(len(y_te)),
        "features": "token mean of Z^l; standardised; LogisticRegression(C=1)",
        "classifier_test_accuracy": float(
            (
                model(pixel_values=torch.cat(list(_pixel_values(processor, x_te)))).logits.argmax(-1).numpy() == y_te
            ).mean()
        ),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", "--output_dir", dest="output_dir", default="figures_out")
    parser.add_argument("--model", default=None, help="a trained digits CRATE folder (default: train one)")
    parser.add_argument("--run-dir", "--run_dir", dest="run_dir", default=None)
    parser.add_argument("--variant", default="crate")
    parser.add_argument("--num-train-epochs", "--num_train_epochs", dest="num_train_epochs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=42)
    from hf_tdiag._outputs import OutputExistsError, add_overwrite_flag

    add_overwrite_flag(parser)
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except OutputExistsError as err:  # a folder holding an earlier run: one line, nothing written or removed
        print(f"fig_linear_probe: {err}", file=sys.stderr)
        return 1


def _run(args) -> int:
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    import hf_tdiag  # noqa: F401  (registers the crate Auto classes)
    from hf_tdiag._atomic import write_json
    from hf_tdiag._outputs import claim_output_dir
    from hf_tdiag.viz import save_figure
    from hf_tdiag.viz.srr import plot_probe_vs_srr

    outputs = ["linear_probe.json", "linear_probe.png"]
    claim_output_dir(args.output_dir, outputs, overwrite=args.overwrite_output_dir, inputs=[args.model])
    if args.model is None:
        from hf_tdiag.training import train

        args.model = args.run_dir or os.path.join(args.output_dir, "linear_probe_run")
        train(
            output_dir=args.model,
            variant=args.variant,
            num_train_epochs=args.num_train_epochs,
            seed=args.seed,
            overwrite_output_dir=args.overwrite_output_dir,
            layer_srr_samples=0,
            disable_tqdm=True,
            after_fit=[],
        )
    model = AutoModelForImageClassification.from_pretrained(args.model).eval()
    processor = AutoImageProcessor.from_pretrained(args.model)
    with torch.no_grad():
        result = measure(model, processor)
    result["model"] = os.path.basename(os.path.normpath(args.model))
    result["variant"] = model.config.variant
    write_json(os.path.join(args.output_dir, outputs[0]), result)
    title = (
        f"{model.config.variant} on digits: linear probe vs SRR per layer "
        f"(Kendall τ = {result['kendall_tau_srr_vs_accuracy']:.2f})"
    )
    png = save_figure(plot_probe_vs_srr(result, title=title), os.path.join(args.output_dir, outputs[1]), dpi=100)
    for ell, (a, s) in enumerate(zip(result["probe_accuracy"], result["srr"])):
        print(f"layer {ell}: probe accuracy {a:.4f}  SRR {s:9.4f}")
    print(
        f"Kendall tau(SRR, accuracy) = {result['kendall_tau_srr_vs_accuracy']:.3f} (p = {result['kendall_p_value']:.3f})"
    )
    print(f"wrote {png} and linear_probe.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
