#!/usr/bin/env python
"""The causal half of ``recipes/train_crate_lm.py`` with a plain Accelerate loop instead of ``transformers.Trainer``:
CRATE-CLM and its parameter-matched GPT-2 pre-trained on CPython's documentation topics, in one process or several.

    python recipes/train_crate_lm_accelerate.py --output-dir runs/crate_lm_acc --steps 200 --hidden-size 48 --layers 2
    accelerate launch --config_file recipes/accelerate_configs/cpu_two_processes.yaml \
        recipes/train_crate_lm_accelerate.py --output-dir runs/crate_lm_ddp --steps 200

Same flags, corpus, tokenizer, models and optimizer settings as the Trainer recipe (AdamW with weight decay 0.01,
linear warm-up over a tenth of the steps, cosine decay; its classification flags are not used here). ``accelerator.prepare`` shards the training blocks across
processes (``--batch-size`` is per process) and wraps the model for data parallelism; the validation perplexity is
``exp`` of the summed next-token losses over the summed token counts, each sample's values gathered once with
``gather_for_metrics``. The main process writes ``results.json`` and each model folder (with its tokenizer); a
folder holding an earlier run is refused unless ``--overwrite-output-dir`` is given.
"""

from __future__ import annotations

import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_crate_lm as base  # noqa: E402  (the Trainer recipe beside this file: models, parser)

CAUSAL = ("crate-clm", "gpt2")
OUTPUTS = ["results.json", *CAUSAL]


def loss_sums(model, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample: the summed next-token cross-entropy and the number of predicted tokens."""
    logits = model(input_ids=batch).logits.float()
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), batch[:, 1:], reduction="none")
    return nll.sum(-1), torch.full((batch.shape[0],), batch.shape[1] - 1, device=batch.device)


@torch.no_grad()
def val_loss(accelerator, model, loader) -> float:
    """Mean next-token loss over the validation blocks, every sample counted once across processes."""
    model.eval()
    total, count = 0.0, 0
    for batch in loader:
        sums, counts = accelerator.gather_for_metrics(loss_sums(model, batch))
        total += float(sums.sum())
        count += int(counts.sum())
    model.train()
    return total / count


def fit(accelerator, model, train_blocks, val_blocks, args) -> dict:
    """Pre-train ``model`` for ``args.steps`` optimizer steps; validation loss before and after."""
    from torch.utils.data import DataLoader
    from transformers import get_cosine_schedule_with_warmup

    generator = torch.Generator().manual_seed(args.seed)
    train = DataLoader(train_blocks, batch_size=args.batch_size, shuffle=True, generator=generator)
    val = DataLoader(val_blocks, batch_size=32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = get_cosine_schedule_with_warmup(optimizer, max(1, args.steps // 10), args.steps)
    model, optimizer, train, val, schedule = accelerator.prepare(model, optimizer, train, val, schedule)
    before = val_loss(accelerator, model, val)
    model.train()
    step, losses, start = 0, [], time.perf_counter()
    while step < args.steps:
        for batch in train:
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % max(1, args.steps // 10) == 0:
                losses.append(float(accelerator.reduce(loss.detach(), reduction="mean")))
            if step >= args.steps:
                break
    seconds = time.perf_counter() - start
    after = val_loss(accelerator, model, val)
    return {"model": accelerator.unwrap_model(model), "val_loss_before": before, "val_loss_after": after,
            "train_losses": losses, "train_seconds": round(seconds, 1)}  # fmt: skip


def main(argv=None) -> int:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    from hf_tdiag._atomic import write_json
    from hf_tdiag._outputs import claim_output_dir
    from hf_tdiag.text_corpus import corpus, token_blocks, train_tokenizer

    args = base.build_parser().parse_args(argv)
    # the first Accelerator fixes the process group: several processes on a machine without an accelerator (the
    # CPU config's torchrun launcher) run on the CPU with gloo, or each would train alone as a single process
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    accelerator = Accelerator(cpu=several and not torch.accelerator.is_available())
    claim_output_dir(args.output_dir, OUTPUTS, overwrite=args.overwrite_output_dir,
                     remove=accelerator.is_main_process)  # fmt: skip
    accelerator.wait_for_everyone()
    set_seed(args.seed)
    train_texts, val_texts = corpus(args.val_every, args.max_train_topics)
    tokenizer = train_tokenizer(list(train_texts.values()), args.vocab_size)  # deterministic: same on every process
    train_blocks = token_blocks(tokenizer, list(train_texts.values()), args.block_size)
    val_blocks = token_blocks(tokenizer, list(val_texts.values()), args.block_size)
    models = {name: m for name, m in base.build_models(tokenizer, args).items() if name in CAUSAL}
    rows = {}
    for name, model in models.items():
        out = fit(accelerator, model, train_blocks, val_blocks, args)
        rows[name] = {
            "parameters": base.n_params(out["model"]),
            **{k: v for k, v in out.items() if k != "model"},
            "val_perplexity_before": math.exp(out["val_loss_before"]),
            "val_perplexity_after": math.exp(out["val_loss_after"]),
        }
        accelerator.print(f"{name:10s} val ppl {rows[name]['val_perplexity_before']:9.1f} -> "
                          f"{rows[name]['val_perplexity_after']:8.2f}")  # fmt: skip
        if accelerator.is_main_process:
            out["model"].save_pretrained(os.path.join(args.output_dir, name))
            tokenizer.save_pretrained(os.path.join(args.output_dir, name))
    if accelerator.is_main_process:
        results = {
            "command": " ".join(
                ["python", "recipes/train_crate_lm_accelerate.py", *(sys.argv[1:] if argv is None else argv)]
            ),
            "processes": accelerator.num_processes,
            "device": str(accelerator.device),
            "load_average": os.getloadavg()[0],
            "settings": {k: v for k, v in vars(args).items() if k != "overwrite_output_dir"},
            "pretraining": rows,
        }
        write_json(os.path.join(args.output_dir, "results.json"), results)
    accelerator.wait_for_everyone()
    return 0


if __name__ == "__main__":
    sys.exit(main())
