#!/usr/bin/env python
"""Train the attention-only transformer (AoT) beside CRATE at matched size, on the digits and on offline text, and
measure AoT's objective ledger trained against random.

    python recipes/train_aot.py                                  # defaults: a few minutes per model on a CPU
    python recipes/train_aot.py --epochs 2 --text-steps 20 --runs-dir /tmp/aot --output /tmp/aot/aot.json

Digits (scikit-learn's 8x8 digits, the trainer's fixed stratified 80/20 split): ``--preset aot-digits`` (6 AoT-MSSA
blocks of width 64, 4 heads) and ``--preset crate-digits`` (4 CRATE blocks of width 64, 4 heads; the two match in
parameters), both read as the trainer reads the digits for CRATE (upsampled to 16 px, 4 px patches, mean pooling),
each trained by ``hf_tdiag.training.train`` with the same epochs, learning rate
and seed, saved to ``<runs-dir>/aot-digits`` and ``<runs-dir>/crate-digits-matched``. The objective ledger (Rᶜ(Z; U)
before and after each AoT block) of the trained AoT and of the same architecture at its random initialisation
(seeded) is measured on the held-out digits.

Text (CPython's documentation topics, :mod:`hf_tdiag.text_corpus`; every ``--val-every``-th topic held out, a BPE
tokenizer trained on the rest): a causal CRATE (``crate-lm-12l``'s block at ``--hidden-size``/``--layers``/
``--heads``) and a causal AoT-MHSA (the paper's language model) whose depth is solved so that its parameter count
is the closest to CRATE's; each trains ``--text-steps`` steps with :class:`transformers.Trainer` (AdamW, cosine,
warm-up); validation loss is the mean next-token cross-entropy over the held-out blocks, perplexity its ``exp``.

Writes the numbers (accuracies, losses, perplexities, parameters, wall times, the machine's load average) to
``--output``; a file or run folder from an earlier run is refused unless ``--overwrite-output-dir`` is given.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time

import torch
from torch.utils.data import Dataset

import hf_tdiag
from hf_tdiag.text_corpus import corpus, token_blocks, train_tokenizer

DIGITS = (("aot", "aot-digits", "aot-digits"), ("crate", "crate-digits", "crate-digits-matched"))
# the trainer's digits recipe for CRATE (upsampled to 16 px, 4 px patches, mean pooling), given to AoT too so that the
# two models read the same tokens
DIGITS_INPUT = dict(image_size=16, patch_size=4, pooling="mean")


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def load() -> float:
    return round(os.getloadavg()[0], 2)


def lr_sweep(args) -> list[dict]:
    """AoT and CRATE on the digits at each learning rate of ``--lr-sweep`` (same epochs and seed as the main runs),
    under ``<runs-dir>/aot-lr-sweep/``: whether the comparison depends on the one learning rate chosen."""
    from hf_tdiag.training import train

    rows = []
    for lr in args.lr_sweep:
        for name, preset, _ in DIGITS:
            out = os.path.join(args.runs_dir, "aot-lr-sweep", f"{name}-lr{lr:g}")
            start = time.perf_counter()
            results = train(output_dir=out, preset=preset, num_train_epochs=args.epochs, learning_rate=lr,
                            seed=args.seed, layer_srr_samples=0, disable_tqdm=True,
                            overwrite_output_dir=args.overwrite_output_dir, **DIGITS_INPUT)  # fmt: skip
            rows.append({"model": name, "learning_rate": lr, "eval_accuracy": results["eval_accuracy"],
                         "eval_loss": results["eval_loss"], "train_loss": results["train_loss"],
                         "wall_s": round(time.perf_counter() - start, 1), "load_average_after": load()})  # fmt: skip
            print(f"sweep  {name:6s} lr {lr:g} accuracy {results['eval_accuracy']:.4f}")
    return rows


def _held_out_digits(folder: str, count: int) -> torch.Tensor:
    """The first ``count`` evaluation images of the trainer's digits split, through the saved processor."""
    from transformers import AutoImageProcessor

    from hf_tdiag.training.args import make_args
    from hf_tdiag.training.data import build_datasets, load_raw_data

    processor = AutoImageProcessor.from_pretrained(folder)
    args = make_args(output_dir=os.path.join(tempfile.gettempdir(), "unused"), preset="aot-digits")
    size = (processor.size.height, processor.size.width)
    evaluation = build_datasets(args, load_raw_data(args), processor, 1, size).eval
    return torch.stack([torch.as_tensor(evaluation[i]["pixel_values"]) for i in range(min(count, len(evaluation)))])


def _ledger_rows(ledger) -> list[dict]:
    return [{"layer": s.layer, "step": s.step, "Rc_before": s.before, "Rc_after": s.after,
             "relative_change": s.relative_change, "increased": s.increased} for s in ledger.steps]  # fmt: skip


def digits(args) -> dict:
    from transformers import AutoModelForImageClassification

    from hf_tdiag.models.aot import AotForImageClassification
    from hf_tdiag.training import train

    rows = {}
    for name, preset, folder in DIGITS:
        out = os.path.join(args.runs_dir, folder)
        before, start = load(), time.perf_counter()
        results = train(output_dir=out, preset=preset, num_train_epochs=args.epochs, learning_rate=args.lr,
                        seed=args.seed, layer_srr_samples=0, disable_tqdm=True,
                        overwrite_output_dir=args.overwrite_output_dir, **DIGITS_INPUT)  # fmt: skip
        rows[name] = {
            "preset": preset, "folder": out, "parameters": results["num_parameters"],
            "eval_accuracy": results["eval_accuracy"], "eval_loss": results["eval_loss"],
            "train_loss": results["train_loss"], "epochs": results["epochs"], "steps": results["steps"],
            "train_runtime_s": round(results["train_runtime_s"], 1), "wall_s": round(time.perf_counter() - start, 1),
            "load_average_before": before, "load_average_after": load(),
        }  # fmt: skip
        print(f"digits {name:6s} params {results['num_parameters']:7d} accuracy {results['eval_accuracy']:.4f}")
    folder = os.path.join(args.runs_dir, "aot-digits")
    trained = AutoModelForImageClassification.from_pretrained(folder).eval()
    torch.manual_seed(args.seed)
    random = AotForImageClassification(trained.config).eval()
    pixels = _held_out_digits(folder, args.ledger_images)
    ledgers = {label: hf_tdiag.objective_ledger(model, pixels) for label, model in
               (("trained", trained), ("random", random))}  # fmt: skip
    rows["aot_ledger"] = {"images": int(pixels.shape[0]), "eps": ledgers["trained"].eps,
                          **{label: {"steps": _ledger_rows(ledger), "summary": ledger.summary()}
                             for label, ledger in ledgers.items()}}  # fmt: skip
    return rows


class Blocks(Dataset):
    def __init__(self, data: torch.Tensor):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}


@torch.no_grad()
def val_loss(model, blocks: torch.Tensor, batch_size: int = 32) -> float:
    """Mean next-token cross-entropy over every position of ``blocks``."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(blocks), batch_size):
        ids = blocks[start : start + batch_size]
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                         ids[:, 1:].reshape(-1), reduction="sum"))  # fmt: skip
        count += ids[:, 1:].numel()
    return total / count


def fit(model, blocks: torch.Tensor, args) -> list[float]:
    from transformers import Trainer, TrainingArguments, default_data_collator

    steps = args.text_steps
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp, max_steps=steps, per_device_train_batch_size=args.batch_size, learning_rate=args.text_lr,
            lr_scheduler_type="cosine", warmup_steps=max(1, steps // 10), weight_decay=0.01,
            logging_steps=max(1, steps // 10), save_strategy="no", report_to=[], use_cpu=not torch.cuda.is_available(),
            seed=args.seed, dataloader_num_workers=0, disable_tqdm=True,
        )  # fmt: skip
        trainer = Trainer(model=model, args=targs, train_dataset=Blocks(blocks), data_collator=default_data_collator)
        trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def text_models(tokenizer, args) -> dict:
    """``{"crate": CRATE-LM causal model, "aot": AoT-MHSA causal model}`` at matched parameter counts."""
    from hf_tdiag.models.aot import AotForCausalLM, AotTextConfig
    from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM

    tokens = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    shared = dict(vocab_size=len(tokenizer), hidden_size=args.hidden_size, num_attention_heads=args.heads,
                  max_position_embeddings=args.block_size, **tokens)  # fmt: skip
    torch.manual_seed(args.seed)
    crate = CrateTextForCausalLM(CrateTextConfig.from_preset("crate-lm-12l", num_hidden_layers=args.layers, **shared))

    def aot(layers):
        return AotForCausalLM(AotTextConfig(num_hidden_layers=layers, attention="mhsa", **shared))

    target = n_params(crate)
    depth = min(range(1, 8 * args.layers + 1), key=lambda n: abs(n_params(aot(n)) - target))
    torch.manual_seed(args.seed)
    return {"crate": crate, "aot": aot(depth)}


def text(args) -> dict:
    train_texts, val_texts = corpus(args.val_every, args.max_train_topics)
    tokenizer = train_tokenizer(list(train_texts.values()), args.vocab_size)
    train_blocks = token_blocks(tokenizer, list(train_texts.values()), args.block_size)
    val_blocks = token_blocks(tokenizer, list(val_texts.values()), args.block_size)
    rows = {"corpus": {"source": "pydoc_data.topics", "train_topics": len(train_texts), "val_topics": len(val_texts),
                       "train_tokens": train_blocks.numel(), "val_tokens": val_blocks.numel(),
                       "vocab_size": len(tokenizer)}}  # fmt: skip
    for name, model in text_models(tokenizer, args).items():
        before_loss = val_loss(model, val_blocks)
        before, start = load(), time.perf_counter()
        losses = fit(model, train_blocks, args)
        seconds = round(time.perf_counter() - start, 1)
        after = val_loss(model, val_blocks)
        rows[name] = {
            "model_type": model.config.model_type, "attention": getattr(model.config, "attention", "mssa"),
            "layers": model.config.num_hidden_layers, "parameters": n_params(model),
            "val_loss_before": before_loss, "val_loss_after": after, "val_perplexity_before": math.exp(before_loss),
            "val_perplexity_after": math.exp(after), "train_losses": losses, "train_seconds": seconds,
            "load_average_before": before, "load_average_after": load(),
        }  # fmt: skip
        print(f"text   {name:6s} params {n_params(model):7d} layers {model.config.num_hidden_layers:2d} "
              f"val ppl {math.exp(before_loss):8.1f} -> {math.exp(after):7.2f} ({seconds} s)")  # fmt: skip
    return rows


def build_parser() -> argparse.ArgumentParser:
    from hf_tdiag._outputs import add_overwrite_flag

    p = argparse.ArgumentParser(prog="train_aot.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs-dir", "--runs_dir", default="runs", help="folder of the digits runs (aot-digits, ...)")
    p.add_argument("--output", default=os.path.join("benchmarks", "results", "aot_digits_text.json"))
    p.add_argument("--epochs", type=int, default=30, help="digits training epochs per model")
    p.add_argument("--lr", type=float, default=1e-3, help="digits learning rate")
    p.add_argument("--ledger-images", "--ledger_images", type=int, default=256, help="held-out digits in the ledger")
    p.add_argument("--text-steps", "--text_steps", type=int, default=300, help="text training steps per model")
    p.add_argument("--text-lr", "--text_lr", type=float, default=2e-3)
    p.add_argument("--hidden-size", "--hidden_size", type=int, default=64)
    p.add_argument("--layers", type=int, default=4, help="CRATE's text blocks (AoT's depth is solved)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--block-size", "--block_size", type=int, default=64)
    p.add_argument("--vocab-size", "--vocab_size", type=int, default=2048)
    p.add_argument("--batch-size", "--batch_size", type=int, default=16)
    p.add_argument("--val-every", "--val_every", type=int, default=10)
    p.add_argument("--max-train-topics", "--max_train_topics", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--lr-sweep",
        "--lr_sweep",
        type=float,
        nargs="*",
        default=[],
        help="more digits learning rates to train both models at (results under 'digits_lr_sweep')",
    )
    p.add_argument("--stages", default="digits,text", help="comma-separated stages to run: digits, text, sweep; "
                   "stages not run keep their numbers from an existing --output")  # fmt: skip
    add_overwrite_flag(p)
    return p


def main(argv=None) -> int:
    from hf_tdiag._atomic import write_json

    args = build_parser().parse_args(argv)
    for name in ("epochs", "ledger_images", "text_steps", "hidden_size", "layers", "heads", "block_size",
                 "vocab_size", "batch_size"):  # fmt: skip
        if getattr(args, name) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')}: must be positive, got {getattr(args, name)}")
    if os.path.exists(args.output) and not args.overwrite_output_dir:
        raise SystemExit(f"--output: {args.output} exists; pass --overwrite-output-dir to replace it")
    stages = {part.strip() for part in args.stages.split(",") if part.strip()}
    unknown = sorted(stages - {"digits", "text", "sweep"})
    if unknown or not stages:
        raise SystemExit(f"--stages: expected some of digits, text, sweep, got {args.stages!r}")
    started = time.perf_counter()
    results = {}
    if os.path.exists(args.output):  # (allowed by --overwrite-output-dir): the stages not run keep their numbers
        with open(args.output) as fh:
            results = json.load(fh)
    command = " ".join(["python", "recipes/train_aot.py", *(sys.argv[1:] if argv is None else argv)])
    earlier = [results.pop("command")] if "command" in results else []  # a run before --stages existed
    results["commands"] = [*earlier, *results.get("commands", []), command]
    results["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "torch_threads": torch.get_num_threads(), "load_average_at_start": load()}  # fmt: skip
    results["settings"] = {k: v for k, v in vars(args).items() if k != "overwrite_output_dir"}
    if "digits" in stages:
        results["digits"] = digits(args)
        write_json(args.output, results)  # the digits numbers, kept if the text runs fail
    if "text" in stages:
        results["text"] = text(args)
        write_json(args.output, results)
    if "sweep" in stages:
        results["digits_lr_sweep"] = lr_sweep(args)
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    write_json(args.output, results)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
