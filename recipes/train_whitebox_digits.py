#!/usr/bin/env python
"""Train every white-box family (CRATE, CRATE-α, CRATE-MAE pre-trained then fine-tuned, ToST) and ViT on the
scikit-learn digits at matched parameter counts; print the test-accuracy table and each model's objective ledger
before and after training.

    python recipes/train_whitebox_digits.py --output-dir runs/whitebox_digits          # ~5 min at one thread
    python recipes/train_whitebox_digits.py --families crate tost --epochs 5 --target-params 60000

Every model is a Transformers model (``from_pretrained``/``save_pretrained`` work on each); the loop is plain
PyTorch (AdamW, cosine schedule, cross-entropy). CRATE-MAE follows its paper's protocol at digits scale: masked
reconstruction on the training images, then its encoder fine-tuned with a linear head on the CLS token.
Results: ``results.json`` (accuracies, parameter counts, configs, ledgers) in ``--output-dir``; a folder that
already holds one is refused before any training unless ``--overwrite-output-dir`` is given.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

FAMILIES = ("crate", "crate-alpha", "crate-mae", "tost", "vit")


def digits_split(seed: int = 0):
    """``(x_train, y_train, x_test, y_test)``: 8x8 digits scaled to [-1, 1] (mean = std = 0.5), 80/20 split."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = (x - 0.5) / 0.5
    y = torch.tensor(data.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(y))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


# CRATE-MAE's patch-projection gain: the authors' 1.0. Pre-trained then fine-tuned it scores higher than 3.0 (which
# gives 2x2 one-channel patches the positions' amplitude, and only the encoder trained from random init needs)
MAE_PATCH_GAIN = 1.0


def build(family: str, hidden: int, layers: int = 4, heads: int = 4, mae_patch_gain: float = MAE_PATCH_GAIN):
    """A digits-sized classifier of ``family`` with width ``hidden`` (CRATE-MAE: its pre-training model)."""
    common = dict(image_size=8, patch_size=2, num_channels=1, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=heads)  # fmt: skip
    if family == "crate":
        from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification

        return CrateForImageClassification(CrateConfig(**common, num_labels=10))
    if family == "crate-alpha":
        from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification

        return CrateAlphaForImageClassification(CrateAlphaConfig(**common, num_labels=10))
    if family == "crate-mae":
        from hf_tdiag.models.crate_mae import CrateMAEConfig, CrateMAEForPreTraining

        return CrateMAEForPreTraining(CrateMAEConfig(**common, decoder_num_hidden_layers=2,
                                                     decoder_num_attention_heads=heads, mask_ratio=0.5,
                                                     patch_embedding_gain=mae_patch_gain))  # fmt: skip
    if family == "tost":
        from hf_tdiag.models.tost import TostConfig, TostForImageClassification

        return TostForImageClassification(TostConfig(**common, num_class_attention_layers=1, num_labels=10))
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(ViTConfig(**common, intermediate_size=4 * hidden, num_labels=10))


def classifier_params(family: str, hidden: int) -> int:
    """Parameters of the classifier that is evaluated (CRATE-MAE: the fine-tuned encoder + head)."""
    with torch.device("meta"):  # shapes only: no memory, no initialization
        model = build(family, hidden)
    if family == "crate-mae":
        return sum(p.numel() for p in model.crate_mae.parameters()) + hidden * 10 + 10
    return sum(p.numel() for p in model.parameters())


def matched_width(family: str, target: int) -> int:
    """The width (a multiple of 8, 32..256) whose classifier's parameter count is closest to ``target``."""
    return min(range(32, 257, 8), key=lambda h: abs(classifier_params(family, h) - target))


def lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then a cosine decay to 0 at ``steps``."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min((step - warmup) / max(steps - warmup, 1), 1.0)))


def fit(model, x, y, *, epochs, lr, batch, seed, loss_fn, warmup_epochs=0, betas=(0.9, 0.999)):
    """AdamW (weight decay 0.05), linear warm-up then cosine; ``loss_fn(model, xb, yb)`` gives the loss."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05, betas=betas)
    per_epoch = math.ceil(len(y) / batch)
    steps, warmup = epochs * per_epoch, warmup_epochs * per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, warmup))
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y))
        for i in range(0, len(y), batch):
            idx = order[i : i + batch]
            loss = loss_fn(model, x[idx], y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return model.eval()


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model(pixel_values=x).logits.argmax(-1) == y).float().mean())


def _ce(model, xb, yb):
    return F.cross_entropy(model(pixel_values=xb).logits, yb)


def ledger_summary(model, x):
    """``{"increasing": [(layer, step)], "num_steps": n}`` of the objective ledger, or None for ViT."""
    from hf_tdiag.diagnostics.objective_ledger import objective_ledger

    try:
        report = objective_ledger(model, x)
    except ValueError:
        return None
    return {"increasing": report.increasing_steps(), "num_steps": len(report.steps), "steps": report.to_dict()["steps"]}


def run_family(family: str, data, args) -> dict:
    xtr, ytr, xte, yte = data
    hidden = matched_width(family, args.target_params)
    torch.manual_seed(args.seed)
    model = build(family, hidden, mae_patch_gain=args.mae_patch_gain)
    result = {"family": family, "hidden_size": hidden, "ledger_random_init": ledger_summary(model, xte[:64])}
    start = time.perf_counter()
    if family == "crate-mae":
        from hf_tdiag.models.crate_mae import CrateMAEForImageClassification

        # MAE's schedule: AdamW betas (0.9, 0.95), warm-up over the first 5% of the epochs
        warmup = (
            max(1, args.pretrain_epochs // 20) if args.pretrain_warmup_epochs is None else args.pretrain_warmup_epochs
        )
        fit(model, xtr, ytr, epochs=args.pretrain_epochs, lr=args.pretrain_lr, batch=args.batch, seed=args.seed,
            loss_fn=lambda m, xb, yb: m(pixel_values=xb).loss, warmup_epochs=warmup,
            betas=(0.9, args.pretrain_beta2))  # fmt: skip
        with torch.no_grad():
            result["pretrain_masked_mse_test"] = float(model(pixel_values=xte).loss)
        fields = {k: v for k, v in model.config.to_dict().items() if k not in ("id2label", "label2id")}
        config = model.config.__class__(**fields, num_labels=10)
        # the paper's comparison: the same encoder fine-tuned from its random initialization, same schedule
        torch.manual_seed(args.seed)
        scratch_start = time.perf_counter()
        scratch = fit(CrateMAEForImageClassification(config), xtr, ytr, epochs=args.epochs, lr=args.lr,
                      batch=args.batch, seed=args.seed, loss_fn=_ce)  # fmt: skip
        result["test_accuracy_without_pretraining"] = accuracy(scratch, xte, yte)
        start += time.perf_counter() - scratch_start  # train_seconds: pre-training and fine-tuning only
        classifier = CrateMAEForImageClassification(config)
        classifier.crate_mae.load_state_dict(model.crate_mae.state_dict())
        model = classifier
    fit(model, xtr, ytr, epochs=args.epochs, lr=args.lr, batch=args.batch, seed=args.seed, loss_fn=_ce)
    result.update(
        params=sum(p.numel() for p in model.parameters()),
        test_accuracy=accuracy(model, xte, yte),
        train_seconds=time.perf_counter() - start,
        ledger_trained=ledger_summary(model, xte[:64]),
    )
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--target-params", type=int, default=150_000, help="parameter count to match (default 150k)")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--pretrain-epochs", type=int, default=100, help="CRATE-MAE masked-reconstruction epochs")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--pretrain-lr", type=float, default=1e-3, help="CRATE-MAE masked-reconstruction learning rate")
    p.add_argument(
        "--pretrain-warmup-epochs",
        type=int,
        default=None,
        help="CRATE-MAE linear warm-up epochs (default: 5%% of --pretrain-epochs, at least 1)",
    )
    p.add_argument("--pretrain-beta2", type=float, default=0.95, help="CRATE-MAE AdamW beta2 (MAE's 0.95)")
    p.add_argument("--mae-patch-gain", type=float, default=MAE_PATCH_GAIN,
                   help="CRATE-MAE patch_embedding_gain (1.0 = the authors' initialization)")  # fmt: skip
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output-dir", "--output_dir", dest="output_dir", default="runs/whitebox_digits")
    from hf_tdiag._outputs import OutputExistsError, add_overwrite_flag, claim_output_dir

    add_overwrite_flag(p)
    args = p.parse_args(argv)
    try:  # before any training: a folder holding an earlier run's results.json is refused (one line, exit 1)
        claim_output_dir(args.output_dir, ["results.json"], overwrite=args.overwrite_output_dir)
    except OutputExistsError as err:
        print(f"train_whitebox_digits: {err}", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    import hf_tdiag  # noqa: F401  (registers the families)

    data = digits_split(args.seed)
    results = []
    print(
        f"{'family':<12} {'width':>5} {'params':>8} {'test acc':>8} {'seconds':>8} {'ledger ↑ init':>13} {'ledger ↑ trained':>16}"
    )
    for family in args.families:
        r = run_family(family, data, args)
        results.append(r)
        up = lambda led: "-" if led is None else f"{len(led['increasing'])}/{led['num_steps']}"  # noqa: E731
        print(f"{family:<12} {r['hidden_size']:>5} {r['params']:>8} {r['test_accuracy']:>8.4f} {r['train_seconds']:>8.1f} "
              f"{up(r['ledger_random_init']):>13} {up(r['ledger_trained']):>16}", flush=True)  # fmt: skip
        if "test_accuracy_without_pretraining" in r:
            print(f"{'  (no pre-training)':<27} {r['test_accuracy_without_pretraining']:>8.4f}", flush=True)
    from hf_tdiag._atomic import write_json

    path = os.path.join(args.output_dir, "results.json")
    write_json(path, {"settings": vars(args), "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
