"""Token signal-to-noise ratio per layer on held-out digits: the attention-only transformer (AoT) against CRATE and a
ViT of matched size, trained and at random initialization (issue 47; the AoT paper's "SNR improves with depth").

Each model is trained here with one short loop (AdamW, weight decay 0.05, warm-up then cosine, cross-entropy) on the
digits recipe's stratified train split (1437 images, pixels scaled to [-1, 1]) and measured on its test split (360):
``hf_tdiag.token_snr`` fits each class's principal subspace (rank d // 10) on half of each class's test images and
measures the other half, every token of an image in its class, each position's mean removed (the defaults), and
also the CLS token alone. Sizes: ``aot-digits`` (6 blocks of width 64, 52,690 parameters) and ``crate-digits``
(4 blocks, 52,818) are matched by the AoT preset; the ViT has 4 blocks of width 32 with an MLP of 128 (51,946).
Folders of models trained elsewhere (``--runs``, e.g. runs/aot-digits) are measured too, through their own image
processor. Writes the numbers (per model, seed and layer, with the machine, its load and the seeds) to ``--output``
and the figure to ``--figure``.

    python recipes/token_snr_digits.py --seeds 0 --epochs 1 --output /tmp/smoke.json --figure /tmp/smoke.png
    # the results page's numbers: one process per model, side by side, then merged
    python recipes/token_snr_digits.py --models aot --output aot.json --figure aot.png   # (crate, vit alike)
    python recipes/token_snr_digits.py --merge aot.json crate.json vit.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import hf_tdiag
from hf_tdiag.inputs import digits_images

MODELS = ("aot", "crate", "vit")


def build(kind: str, seed: int):
    """A digits classifier of ``kind``, initialized with ``seed``."""
    torch.manual_seed(seed)
    if kind == "aot":
        from hf_tdiag.models.aot import AotConfig, AotForImageClassification

        return AotForImageClassification(AotConfig.from_preset("aot-digits", num_labels=10))
    if kind == "crate":
        from hf_tdiag import CrateConfig, CrateForImageClassification

        return CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10))
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=4,
                       num_attention_heads=4, intermediate_size=128, num_labels=10)  # fmt: skip
    return ViTForImageClassification(config)


def pixels(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The split's images as (N, 1, 8, 8) in [-1, 1] and their labels."""
    found = digits_images(split=split)
    x = torch.tensor(np.stack([np.asarray(im) for im in found.images]), dtype=torch.float32)[:, None] / 255.0
    return (x - 0.5) / 0.5, torch.tensor(found.labels)


def train(model, x, y, *, epochs: int, lr: float, batch: int, seed: int):
    """AdamW (weight decay 0.05), one warm-up epoch then a cosine decay to 0."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    per_epoch = math.ceil(len(y) / batch)
    steps, warmup = epochs * per_epoch, per_epoch

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min((step - warmup) / max(steps - warmup, 1), 1.0)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y))
        for i in range(0, len(y), batch):
            idx = order[i : i + batch]
            loss = F.cross_entropy(model(pixel_values=x[idx]).logits, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return model.eval()


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model(pixel_values=x).logits.argmax(-1) == y).float().mean())


def measure(model, x, labels) -> dict:
    """Per-layer mean class SNR (and per class) of every token, of the CLS token alone, and of every token with the
    labels shuffled ("shuffled": the same estimate without class structure — what low dimensionality alone gives)."""
    out = {}
    shuffled = torch.tensor(labels)[torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))].tolist()
    for name, tokens, given in (("all", "all", labels), ("first", "first", labels), ("shuffled", "all", shuffled)):
        report = hf_tdiag.token_snr(model, x, given, tokens=tokens)
        out[name] = {
            "rank": report.rank,
            "snr": report.snr(),
            "class_snr": [layer.class_snr for layer in report.layers],
            "summary": report.summary(),
        }
    return out


def run_folder(folder: str) -> dict:
    """A model trained elsewhere (a save_pretrained folder with its image processor) on the test split."""
    from hf_tdiag.batching import encoded_batches
    from hf_tdiag.loading import load_model

    loaded = load_model(folder, eager_attention=False)
    found = digits_images(split="test")
    batch = next(iter(encoded_batches(loaded, found.images, len(found.images))))
    x = batch["pixel_values"] if isinstance(batch, dict) else batch
    y = torch.tensor(found.labels)
    return {"folder": folder, "model_type": loaded.model.config.model_type, "accuracy": accuracy(loaded.model, x, y),
            "parameters": sum(p.numel() for p in loaded.model.parameters()), **measure(loaded.model, x, found.labels)}  # fmt: skip


def _json(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    return value


def _write(results: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(_json(results), fh, indent=1)


def _values(runs) -> np.ndarray:
    return np.array([[float(v) for v in run] for run in runs])


def figure(results: dict, path: str) -> None:
    """Three panels: the mean class SNR per layer of the trained models and of their random initializations (every
    token), and the trained models' SNR over the same estimate with shuffled labels (the class-specific part)."""
    from hf_tdiag.viz import new_figure, save_figure

    fig = new_figure(15.0, 4.2)
    panels = (("trained", "trained: SNR", False), ("init", "random initialization: SNR", False),
              ("trained", "trained: SNR / SNR with shuffled labels", True))  # fmt: skip
    for col, (state, title, ratio) in enumerate(panels):
        ax = fig.add_subplot(1, 3, col + 1)
        for kind, entries in results["models"].items():
            if not entries:
                continue
            values = _values([e[state]["all"]["snr"] for e in entries])
            if ratio:
                values = values / _values([e[state]["shuffled"]["snr"] for e in entries])
            xs = np.arange(values.shape[1])
            line = ax.plot(xs, values.mean(0), marker="o", label=f"{kind} ({len(entries)} seeds)")[0]
            ax.fill_between(xs, values.min(0), values.max(0), color=line.get_color(), alpha=0.2)
        for run in results.get("runs", []) if state == "trained" else []:
            values = _values([run["all"]["snr"]])[0]
            if ratio:
                values = values / _values([run["shuffled"]["snr"]])[0]
            ax.plot(np.arange(len(values)), values, linestyle="--", marker="s", label=os.path.basename(run["folder"]))
        if not ratio:
            ax.set_yscale("log")
        ax.set_xlabel("layer (0: embeddings)")
        ax.set_ylabel("labelled / shuffled" if ratio else "mean class token SNR")
        ax.set_title(f"held-out digits, {title}", fontsize="medium")
        ax.legend(fontsize="small")
    save_figure(fig, path)


def merge(paths: list[str], output: str, figure_path: str) -> int:
    """One results file from several: their models and runs side by side, each part's machine record kept."""
    parts = [json.load(open(path, encoding="utf-8")) for path in paths]

    def same(settings):
        return {k: v for k, v in settings.items() if k != "seeds"}

    merged = {"machine": [part["machine"] for part in parts], "settings": dict(parts[0]["settings"]), "models": {},
              "runs": []}  # fmt: skip
    merged["settings"]["seeds"] = sorted({seed for part in parts for seed in part["settings"]["seeds"]})
    for path, part in zip(paths, parts):
        if same(part["settings"]) != same(merged["settings"]):
            raise ValueError(f"--merge: {path} was run with other settings than {paths[0]} (seeds aside)")
        for kind, entries in part["models"].items():
            merged["models"].setdefault(kind, []).extend(entries)
        merged["runs"].extend(part.get("runs", []))
    with open(output, "w", encoding="utf-8") as fh:
        json.dump(merged, fh, indent=1)
    figure(merged, figure_path)
    print(f"wrote {output} and {figure_path}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", nargs="*", default=[], help="model folders trained elsewhere, measured as they are")
    p.add_argument("--output", default="benchmarks/results/token_snr_digits.json")
    p.add_argument("--figure", default="docs/figures/token_snr_digits.png")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="combine the results of runs made apart (e.g. one model each, side by side) into --output")  # fmt: skip
    args = p.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.output, args.figure)
    torch.set_num_threads(args.threads)
    x_train, y_train = pixels("train")
    x_test, y_test = pixels("test")
    labels = y_test.tolist()
    results = {
        "machine": {
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "threads": args.threads,
            "load_at_start": list(os.getloadavg()),
        },  # fmt: skip
        "settings": {
            "epochs": args.epochs,
            "lr": args.lr,
            "batch": args.batch,
            "seeds": args.seeds,
            "token_snr": "hf_tdiag.token_snr defaults: rank d // 10, fit_fraction 0.5, center=True; "
            "tokens 'all' and 'first'",
            "data": "digits train (1437) / test (360) split",
        },  # fmt: skip
        "models": {kind: [] for kind in args.models},
    }
    for kind in args.models:
        for seed in args.seeds:
            model = build(kind, seed).eval()
            init = measure(model, x_test, labels)
            start = time.perf_counter()
            train(model, x_train, y_train, epochs=args.epochs, lr=args.lr, batch=args.batch, seed=seed)
            seconds = time.perf_counter() - start
            entry = {"seed": seed, "parameters": sum(p.numel() for p in model.parameters()),
                     "num_layers": model.config.num_hidden_layers, "hidden_size": model.config.hidden_size,
                     "accuracy": accuracy(model, x_test, y_test), "train_seconds": seconds, "init": init,
                     "trained": measure(model, x_test, labels)}  # fmt: skip
            results["models"][kind].append(entry)
            snr = entry["trained"]["all"]["snr"]
            print(f"{kind} seed {seed}: accuracy {entry['accuracy']:.3f}, SNR by layer "
                  f"{' '.join(f'{v:.3g}' for v in snr)} (init {' '.join(f'{v:.3g}' for v in init['all']['snr'])}), "
                  f"{seconds:.0f} s", flush=True)  # fmt: skip
            _write(results, args.output)  # after every seed: a run stopped early keeps what it measured
    results["runs"] = [run_folder(folder) for folder in args.runs]
    results["machine"]["load_at_end"] = list(os.getloadavg())
    _write(results, args.output)
    figure(results, args.figure)
    print(f"wrote {args.output} and {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
