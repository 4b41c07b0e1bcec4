#!/usr/bin/env python
"""Pre-train tiny causal and masked CRATE language models on text every Python ships, against GPT-2- and
BERT-shaped baselines of matched parameter count trained by the same recipe, then fine-tune the masked models to tell
which documentation topic a paragraph comes from.

    python recipes/train_crate_lm.py --output-dir runs/crate_lm                # defaults: a few minutes on a CPU
    python recipes/train_crate_lm.py --output-dir runs/tiny --steps 20 --hidden-size 32 --layers 1

Corpus: CPython's own documentation topics (``pydoc_data.topics``, ~465 k characters of English with code), split by
topic (every ``--val-every``-th topic, sorted by name, is held out), so validation text is unseen documentation and no
download is needed. A byte-level BPE tokenizer is trained on the training topics with the ``tokenizers`` library
(:mod:`hf_tdiag.text_corpus`).

Models (same width, depth, heads, vocabulary, context and optimizer): CRATE-CLM (``crate_text``, CRATE-LM's
overcomplete block, causal), CRATE-MLM (the same block, bidirectional, the RoBERTa-shaped LM head of Transformers PR
#27759), GPT-2 and BERT whose feed-forward width is solved so that their parameter count matches the CRATE model's.
Each trains ``--steps`` steps with :class:`transformers.Trainer` (AdamW, cosine schedule, warm-up). Perplexity is
``exp`` of the mean validation token loss: next-token loss for the causal models, masked-token loss on one fixed
15 % masking of the validation blocks for the masked ones. Classification: the ``--topics`` largest topics'
paragraphs, 80/20 split, a sequence-classification head on each of the four pre-trained models (the first token of
the masked models, the last real token of the causal ones), ``--classify-steps`` steps, held-out accuracy.

Writes ``results.json`` (every number, the command line, wall times and the machine's load), each trained model
folder (``save_pretrained``, with its tokenizer) and the random initialisation of each CRATE model
(``crate-clm-init``, ``crate-mlm-init``, for diagnostics of trained against random) under ``--output-dir``. A folder
holding an earlier run is refused unless ``--overwrite-output-dir`` is given.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time

import torch
from torch.utils.data import Dataset

from hf_tdiag.text_corpus import corpus, token_blocks, topic_paragraphs, train_tokenizer

MODELS = ("crate-clm", "gpt2", "crate-mlm", "bert")
OUTPUTS = ["results.json", *MODELS, "crate-clm-init", "crate-mlm-init"]


class Blocks(Dataset):
    def __init__(self, data: torch.Tensor, labels: torch.Tensor | None = None):
        self.data, self.labels = data, labels

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        item = {"input_ids": self.data[i]}
        if self.labels is not None:
            item["labels"] = self.labels[i]
        return item


def n_params(model) -> int:
    """Parameters counted once (tied matrices once)."""
    return sum(p.numel() for p in model.parameters())


def _solve_width(build, target: int) -> int:
    """The feed-forward width ``w`` whose model ``build(w)`` has the parameter count closest to ``target``."""
    a, b = n_params(build(1)), n_params(build(2))
    slope = b - a
    return max(1, round(1 + (target - a) / slope))


def build_models(tokenizer, args):
    """``{name: model}``: CRATE-CLM, CRATE-MLM and the matched GPT-2 / BERT baselines."""
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM, CrateTextForMaskedLM

    d, layers, heads, vocab, ctx = args.hidden_size, args.layers, args.heads, len(tokenizer), args.block_size
    tokens = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    shared = dict(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads)
    clm_cfg = CrateTextConfig.from_preset(
        "crate-lm-12l", max_position_embeddings=ctx, eos_token_id=tokenizer.eos_token_id, **shared, **tokens
    )
    mlm_cfg = CrateTextConfig.from_preset(
        "crate-bert-base", block="crate-lm", max_position_embeddings=ctx, position_offset=0, type_vocab_size=0,
        head_layer_norm_eps=1e-5, **shared, **tokens,
    )  # fmt: skip
    torch.manual_seed(args.seed)
    clm, mlm = CrateTextForCausalLM(clm_cfg), CrateTextForMaskedLM(mlm_cfg)

    def gpt2(width):
        cfg = GPT2Config(
            vocab_size=vocab, n_positions=ctx, n_embd=d, n_layer=layers, n_head=heads, n_inner=width,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
        return GPT2LMHeadModel(cfg)

    def bert(width):
        cfg = BertConfig(
            vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=width,
            max_position_embeddings=ctx, type_vocab_size=1, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        return BertForMaskedLM(cfg)

    gpt_width, bert_width = _solve_width(gpt2, n_params(clm)), _solve_width(bert, n_params(mlm))
    torch.manual_seed(args.seed)
    return {"crate-clm": clm, "gpt2": gpt2(gpt_width), "crate-mlm": mlm, "bert": bert(bert_width)}


def is_masked(name: str) -> bool:
    return name in ("crate-mlm", "bert")


def collator(tokenizer, masked: bool):
    from transformers import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(tokenizer, mlm=masked, mlm_probability=0.15)


def fixed_masking(tokenizer, data: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    """One 15 % BERT masking (80/10/10) of ``data``, drawn from ``seed``, so every masked model sees the same one."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        batch = collator(tokenizer, True)([{"input_ids": row} for row in data])
    finally:
        torch.random.set_rng_state(state)
    return {"input_ids": batch["input_ids"], "labels": batch["labels"]}


@torch.no_grad()
def mean_loss(model, batch: dict[str, torch.Tensor], masked: bool, batch_size: int = 32) -> float:
    """Mean token cross-entropy over ``batch``: next-token (causal) or at the labelled (masked) positions."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(batch["input_ids"]), batch_size):
        ids = batch["input_ids"][start : start + batch_size]
        logits = model(input_ids=ids).logits.float()
        if masked:
            labels = batch["labels"][start : start + batch_size]
        else:
            logits, labels = logits[:, :-1], ids[:, 1:]
        keep = labels != -100
        total += float(torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum"))
        count += int(keep.sum())
    model.train(was_training)
    return total / count


def fit(model, dataset, data_collator, args, steps: int, lr: float) -> list[float]:
    """Train with :class:`transformers.Trainer`; returns the logged training losses."""
    from transformers import Trainer, TrainingArguments

    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp, max_steps=steps, per_device_train_batch_size=args.batch_size, learning_rate=lr,
            lr_scheduler_type="cosine", warmup_steps=max(1, steps // 10), weight_decay=0.01, logging_steps=max(1, steps // 10),
            save_strategy="no", report_to=[], use_cpu=not torch.cuda.is_available(), seed=args.seed,
            dataloader_num_workers=0, disable_tqdm=True,
        )  # fmt: skip
        trainer = Trainer(model=model, args=targs, train_dataset=dataset, data_collator=data_collator)
        trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def pretrain(models, tokenizer, train_blocks, val_blocks, args) -> dict:
    """Perplexity before and after ``args.steps`` steps for each model; models are trained in place."""
    val_masked = fixed_masking(tokenizer, val_blocks, args.seed + 1)
    rows = {}
    for name, model in models.items():
        masked = is_masked(name)
        val = val_masked if masked else {"input_ids": val_blocks}
        before = mean_loss(model, val, masked)
        start = time.perf_counter()
        losses = fit(model, Blocks(train_blocks), collator(tokenizer, masked), args, args.steps, args.lr)
        seconds = time.perf_counter() - start
        after = mean_loss(model, val, masked)
        rows[name] = {
            "objective": "masked LM" if masked else "causal LM",
            "parameters": n_params(model),
            "val_loss_before": before,
            "val_loss_after": after,
            "val_perplexity_before": math.exp(before),
            "val_perplexity_after": math.exp(after),
            "train_losses": losses,
            "train_seconds": round(seconds, 1),
            "load_average_after": os.getloadavg()[0],
        }
        print(f"{name:10s} params {n_params(model):8d}  val ppl {math.exp(before):9.1f} -> {math.exp(after):8.2f}")
    return rows


class Paragraphs(Dataset):
    def __init__(self, ids, mask, labels):
        self.ids, self.mask, self.labels = ids, mask, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


@torch.no_grad()
def accuracy(model, ids, mask, labels) -> float:
    model.eval()
    pred = torch.cat([model(input_ids=ids[s : s + 64], attention_mask=mask[s : s + 64]).logits.argmax(-1)
                      for s in range(0, len(ids), 64)])  # fmt: skip
    return float((pred == labels).float().mean())


def classify(folders: dict[str, str], tokenizer, train_texts, args) -> dict:
    """Fine-tune each saved model with a sequence-classification head; held-out accuracy."""
    from transformers import AutoModelForSequenceClassification, default_data_collator

    topics, ((tr_ids, tr_mask, tr_y), (va_ids, va_mask, va_y)) = topic_paragraphs(
        tokenizer, train_texts, args.topics, args.block_size, args.seed
    )
    out = {"topics": topics, "train_paragraphs": len(tr_y), "val_paragraphs": len(va_y)}
    out["majority_baseline"] = float((va_y == torch.mode(tr_y).values).float().mean())
    for name, folder in folders.items():
        torch.manual_seed(args.seed)
        model = AutoModelForSequenceClassification.from_pretrained(
            folder,
            num_labels=len(topics),
            pad_token_id=tokenizer.pad_token_id,  # GPT-2 finds its last real token by it
        )
        start = time.perf_counter()
        fit(model, Paragraphs(tr_ids, tr_mask, tr_y), default_data_collator, args, args.classify_steps, args.lr)
        seconds = round(time.perf_counter() - start, 1)
        out[name] = {"val_accuracy": accuracy(model, va_ids, va_mask, va_y), "train_seconds": seconds}
        print(f"{name:10s} topic accuracy {out[name]['val_accuracy']:.3f} ({len(topics)} topics)")
    return out


def build_parser() -> argparse.ArgumentParser:
    from hf_tdiag._outputs import add_overwrite_flag

    p = argparse.ArgumentParser(prog="train_crate_lm.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", "--output_dir", required=True, help="folder for results.json and the models")
    p.add_argument("--steps", type=int, default=400, help="pre-training steps per model")
    p.add_argument("--classify-steps", "--classify_steps", type=int, default=150, help="fine-tuning steps")
    p.add_argument("--hidden-size", "--hidden_size", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--block-size", "--block_size", type=int, default=64, help="tokens per training block")
    p.add_argument("--vocab-size", "--vocab_size", type=int, default=2048, help="BPE vocabulary trained here")
    p.add_argument("--batch-size", "--batch_size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--val-every", "--val_every", type=int, default=10, help="every n-th topic is validation")
    p.add_argument("--topics", type=int, default=6, help="topics of the classification task")
    p.add_argument("--max-train-topics", "--max_train_topics", type=int, default=None, help="cap (for quick runs)")
    p.add_argument("--seed", type=int, default=0)
    add_overwrite_flag(p)
    return p


def main(argv=None) -> int:
    from hf_tdiag._atomic import write_json
    from hf_tdiag._outputs import claim_output_dir

    args = build_parser().parse_args(argv)
    for name in ("steps", "hidden_size", "layers", "heads", "block_size", "vocab_size", "batch_size", "topics"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    claim_output_dir(args.output_dir, OUTPUTS, overwrite=args.overwrite_output_dir)
    started = time.perf_counter()
    train_texts, val_texts = corpus(args.val_every, args.max_train_topics)
    tokenizer = train_tokenizer(list(train_texts.values()), args.vocab_size)
    train_blocks = token_blocks(tokenizer, list(train_texts.values()), args.block_size)
    val_blocks = token_blocks(tokenizer, list(val_texts.values()), args.block_size)
    models = build_models(tokenizer, args)
    for name in ("crate-clm", "crate-mlm"):  # the random initialisation, for trained-vs-random diagnostics
        models[name].save_pretrained(os.path.join(args.output_dir, f"{name}-init"))
        tokenizer.save_pretrained(os.path.join(args.output_dir, f"{name}-init"))
    results = {
        "command": " ".join(["python", "recipes/train_crate_lm.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "load_average_at_start": os.getloadavg()[0]},
        "settings": {k: v for k, v in vars(args).items() if k != "overwrite_output_dir"},
        "corpus": {"source": "pydoc_data.topics", "train_topics": len(train_texts), "val_topics": len(val_texts),
                   "train_tokens": train_blocks.numel(), "val_tokens": val_blocks.numel(), "vocab_size": len(tokenizer)},
        "pretraining": pretrain(models, tokenizer, train_blocks, val_blocks, args),
    }  # fmt: skip
    # the pre-training numbers, kept if saving or fine-tuning fails later
    write_json(os.path.join(args.output_dir, "results.json"), results)
    folders = {}
    for name, model in models.items():
        folders[name] = os.path.join(args.output_dir, name)
        model.save_pretrained(folders[name])
        tokenizer.save_pretrained(folders[name])
    if args.classify_steps > 0:
        results["classification"] = classify(folders, tokenizer, train_texts, args)
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    write_json(os.path.join(args.output_dir, "results.json"), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
