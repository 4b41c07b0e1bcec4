"""The Accelerate training loop for CRATE image classifiers.

``train(args_or_kwargs)`` runs one training job end to end and returns the
results dict also written to ``<output_dir>/all_results.json``:

1. data (:mod:`.data`) and model/processor (:mod:`.model`);
2. optimizer (:mod:`.optim`), LR schedule with warmup, ``accelerator.prepare``;
3. epochs of optimizer steps with gradient accumulation, optional SRR regularisation
   (:mod:`.regularizers`), atomic rotated checkpoints (:mod:`.checkpointing`), an evaluation
   with ``gather_for_metrics`` after every epoch, optional stop at a training-loss target;
4. the generalization gap (:mod:`.gap`), ``save_pretrained`` of model and processor,
   per-layer SRR of the trained model (JSON + figure), the model card (:mod:`.model_card`),
   and optionally the Hub upload (:mod:`.hub`).
"""

from __future__ import annotations

import json
import math
import os
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .._threads import torch_threads
from .args import is_digits, make_args
from .checkpointing import clean_partial, load_checkpoint, resolve_checkpoint, save_checkpoint
from .data import EpochShuffleSampler, build_datasets, load_raw_data
from .gap import evaluate, generalization_gap
from .model import build_model_and_processor, image_size_of
from .optim import build_optimizer
from .regularizers import model_srr_penalty

DIGITS_EPOCHS = 40
DEFAULT_EPOCHS = 3
DEFAULT_LR = {"adamw": 1e-3, "lion": 1e-4}
DIGITS_LR = {"adamw": 3e-3, "lion": 3e-4}
# the digits recipe: the processor upsamples the 8x8 images to 16x16 (bicubic) and the model cuts 4x4 patches,
# so each token sees 2x2 original pixels through 16 interpolated values (with 2x2 patches of the raw 8x8 image
# the patch LayerNorm over 4 values discards most of the signal), and pools the mean token
DIGITS_MODEL = {"image_size": 16, "patch_size": 4, "pooling": "mean"}
SMALL_MODEL_PARAMETERS = 10_000_000


def _resolve_defaults(args) -> None:
    digits = is_digits(args)
    if args.num_train_epochs is None:
        args.num_train_epochs = DIGITS_EPOCHS if digits else DEFAULT_EPOCHS
    if args.learning_rate is None:
        args.learning_rate = (DIGITS_LR if digits else DEFAULT_LR)[args.optimizer]
    if digits and args.model_name_or_path is None and args.preset in (None, "crate-digits"):
        for key, value in DIGITS_MODEL.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    if args.optimizer == "lion" and args.adam_beta2 == 0.999:
        args.adam_beta2 = 0.99


def _make_accelerator(args):
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    from .tracking import resolve_trackers

    log_with = None
    if args.with_tracking:
        log_with = resolve_trackers(args.report_to, os.path.join(args.output_dir, "logs"))
    return Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=args.mixed_precision,
        log_with=log_with,
        project_config=ProjectConfiguration(project_dir=args.output_dir, logging_dir=os.path.join(args.output_dir, "logs")),
    )


def _loader(dataset, batch_size, args, sampler=None, seed=0):
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        shuffle=False,
        num_workers=args.dataloader_num_workers,
        drop_last=False,
        # a private generator: creating iterators must not consume the global torch RNG (resume equality)
        generator=torch.Generator().manual_seed(seed),
    )


def _json_config(args) -> dict:
    out = {}
    for key, value in sorted(vars(args).items()):
        if key in ("func", "hub_token"):
            continue
        out[key] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return out


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)


def compute_loss(model, unwrapped, batch, args, step: int):
    """``(loss, ce, penalty)`` of one batch: ``loss = CE(label smoothing) + β·SRR(Z^ℓ; U^ℓ)`` (penalty None if β = 0).

    ``model`` is what the accelerator prepared (it runs the forward pass), ``unwrapped`` the bare model whose
    ``U`` the regulariser reads; ``step`` (the optimizer step) picks the layer for ``--srr_layer random``.
    """
    need_srr = args.srr_weight > 0
    outputs = model(pixel_values=batch["pixel_values"], output_hidden_states=need_srr)
    ce = F.cross_entropy(outputs.logits.float(), batch["labels"], label_smoothing=args.label_smoothing)
    if not need_srr:
        return ce, ce, None
    penalty, _ = model_srr_penalty(
        unwrapped, outputs.hidden_states, args.srr_layer, step, args.seed, eps=args.srr_eps, lam=args.srr_lambda
    )
    return ce + args.srr_weight * penalty.to(ce.dtype), ce, penalty


def train(args_or_kwargs=None, **kwargs) -> dict:
    """Train a CRATE classifier; ``args_or_kwargs``: argv list, ``argparse.Namespace`` or mapping (+ keyword flags).

    Returns the results dict (accuracy, losses, generalization gap, per-layer SRR summary, runtime, ...), also
    written to ``<output_dir>/all_results.json`` on the main process. The caller's torch thread count is
    restored on return.
    """
    args = make_args(args_or_kwargs, **kwargs)
    _resolve_defaults(args)
    with torch_threads():  # _train may set the count for small CPU models; the caller's comes back
        return _train(args)


def _set_threads(args, accelerator, num_parameters: int) -> int:
    """``--num_threads``, else one intra-op thread for small models on CPU (thread sync costs more than it saves)."""
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    elif accelerator.device.type == "cpu" and num_parameters < SMALL_MODEL_PARAMETERS:
        torch.set_num_threads(1)
    return torch.get_num_threads()


def _train(args) -> dict:
    start_time = time.time()
    from accelerate.utils import set_seed

    accelerator = _make_accelerator(args)
    from accelerate.utils import DistributedType

    fsdp = accelerator.distributed_type == DistributedType.FSDP
    if fsdp and args.srr_weight > 0:
        raise ValueError(
            "srr_weight: the SRR regulariser reads U^l outside the forward pass, where FSDP keeps parameters "
            "sharded; train with DDP (recipes/accelerate_configs/multi_gpu_ddp.yaml) or one device instead"
        )
    if accelerator.is_main_process:
        os.makedirs(args.output_dir, exist_ok=True)
        clean_partial(args.output_dir)
    accelerator.wait_for_everyone()
    set_seed(args.seed)

    raw = load_raw_data(args)
    model, processor, preset = build_model_and_processor(args, raw)
    config = model.config
    image_size = image_size_of(config)
    threads = _set_threads(args, accelerator, sum(p.numel() for p in model.parameters()))
    datasets_ = build_datasets(args, raw, processor, config.num_channels, image_size)

    sampler = EpochShuffleSampler(len(datasets_.train), args.seed)
    train_dl = _loader(datasets_.train, args.per_device_train_batch_size, args, sampler=sampler, seed=args.seed)
    eval_dl = _loader(datasets_.eval, args.per_device_eval_batch_size, args, seed=args.seed)
    train_eval_dl = _loader(datasets_.train_eval, args.per_device_eval_batch_size, args, seed=args.seed)

    optimizer = build_optimizer(
        model, args.optimizer, args.learning_rate, args.weight_decay, (args.adam_beta1, args.adam_beta2)
    )
    model, optimizer, train_dl, eval_dl, train_eval_dl = accelerator.prepare(
        model, optimizer, train_dl, eval_dl, train_eval_dl
    )
    steps_per_epoch = math.ceil(len(train_dl) / args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * steps_per_epoch
    else:
        args.num_train_epochs = math.ceil(args.max_train_steps / steps_per_epoch)
    warmup = args.num_warmup_steps if args.num_warmup_steps is not None else int(args.warmup_ratio * args.max_train_steps)
    from transformers import get_scheduler

    lr_scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer=optimizer,
        # the prepared scheduler steps once per process for every optimizer step
        num_warmup_steps=warmup * accelerator.num_processes,
        num_training_steps=args.max_train_steps * accelerator.num_processes,
    )
    lr_scheduler = accelerator.prepare(lr_scheduler)
    unwrapped = accelerator.unwrap_model(model)

    if args.with_tracking:
        accelerator.init_trackers("crate", _json_config(args))

    # ---- resume -------------------------------------------------------------------------------------------
    completed_steps, start_epoch, resume_batches = 0, 0, 0
    history: list[dict] = []
    loss_sum, loss_count = 0.0, 0
    resumed_from = None
    if args.resume_from_checkpoint:
        path = resolve_checkpoint(args.resume_from_checkpoint, args.output_dir)
        if path is None:
            accelerator.print(f"resume_from_checkpoint=latest: no checkpoint in {args.output_dir}, starting fresh")
        else:
            state = load_checkpoint(accelerator, path)
            completed_steps = int(state["completed_steps"])
            start_epoch = int(state["epoch"])
            resume_batches = int(state["batches_in_epoch"])
            history = list(state.get("history", []))
            loss_sum, loss_count = float(state.get("epoch_loss_sum", 0.0)), int(state.get("epoch_loss_count", 0))
            resumed_from = path
            accelerator.print(f"resumed from {path}: step {completed_steps}, epoch {start_epoch}, batch {resume_batches}")

    every = int(args.checkpointing_steps) if (args.checkpointing_steps or "epoch").isdigit() else None

    def checkpoint(epoch, batches):
        state = {
            "completed_steps": completed_steps,
            "epoch": epoch,
            "batches_in_epoch": batches,
            "history": history,
            "epoch_loss_sum": loss_sum,
            "epoch_loss_count": loss_count,
            "seed": args.seed,
        }
        save_checkpoint(accelerator, args.output_dir, completed_steps, state, keep=args.checkpoints_total_limit)

    accelerator.print(
        f"training {type(unwrapped).__name__} ({preset or args.model_name_or_path}, variant {config.variant}, "
        f"{sum(p.numel() for p in unwrapped.parameters()):,} parameters) on {raw.name}: {raw.num_train} train / "
        f"{raw.num_eval} eval images, {args.num_train_epochs} epochs, {args.max_train_steps} steps, "
        f"{accelerator.num_processes} process(es) x {threads} thread(s), mixed precision {accelerator.mixed_precision}"
    )
    progress = tqdm(
        total=args.max_train_steps,
        initial=completed_steps,
        desc="train",
        disable=args.disable_tqdm or not accelerator.is_local_main_process,
    )
    stopped_at_target = False
    srr_last = None
    epoch = start_epoch
    for epoch in range(start_epoch, args.num_train_epochs):
        if completed_steps >= args.max_train_steps:
            break
        model.train()
        train_dl.set_epoch(epoch)
        if hasattr(datasets_.train, "set_epoch"):
            datasets_.train.set_epoch(epoch)
        skip = resume_batches if epoch == start_epoch else 0
        active = accelerator.skip_first_batches(train_dl, skip) if skip else train_dl
        if skip:
            active.set_epoch(epoch)
        num_batches = len(train_dl)
        batch_index = skip
        for batch in active:
            batch_index += 1
            with accelerator.accumulate(model):
                loss, ce, penalty = compute_loss(model, unwrapped, batch, args, completed_steps)
                if penalty is not None:
                    srr_last = float(penalty.detach())
                accelerator.backward(loss)
                if accelerator.sync_gradients and args.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            loss_sum += float(ce.detach())
            loss_count += 1
            if accelerator.sync_gradients:
                completed_steps += 1
                progress.update(1)
                if args.with_tracking and completed_steps % args.logging_steps == 0:
                    logs = {"train/loss_step": float(ce.detach()), "train/lr": lr_scheduler.get_last_lr()[0]}
                    if srr_last is not None:
                        logs["train/srr_penalty"] = srr_last
                    accelerator.log(logs, step=completed_steps)
                if every and completed_steps % every == 0 and batch_index < num_batches:
                    checkpoint(epoch, batch_index)
                if completed_steps >= args.max_train_steps:
                    break
        # ---- end of epoch: mean training loss over processes, evaluation, checkpoint ----------------------
        mean_loss = torch.tensor([loss_sum, float(loss_count)], device=accelerator.device, dtype=torch.float64)
        mean_loss = accelerator.reduce(mean_loss, reduction="sum")
        epoch_train_loss = float(mean_loss[0] / mean_loss[1]) if float(mean_loss[1]) > 0 else float("nan")
        metrics = evaluate(model, eval_dl, accelerator, desc="eval", disable_tqdm=args.disable_tqdm)
        record = {
            "epoch": epoch + 1,
            "step": completed_steps,
            "train_loss": epoch_train_loss,
            "eval_loss": metrics["loss"],
            "eval_accuracy": metrics["accuracy"],
            "eval_samples": metrics["samples"],
        }
        history.append(record)
        progress.set_postfix(loss=f"{epoch_train_loss:.4f}", acc=f"{metrics['accuracy']:.4f}")
        if args.with_tracking:
            accelerator.log(
                {"train/loss": epoch_train_loss, "eval/loss": metrics["loss"], "eval/accuracy": metrics["accuracy"], "epoch": epoch + 1},
                step=completed_steps,
            )
        if args.disable_tqdm:
            accelerator.print(
                f"epoch {epoch + 1}: step {completed_steps} train_loss {epoch_train_loss:.4f} "
                f"eval_loss {metrics['loss']:.4f} eval_accuracy {metrics['accuracy']:.4f}"
            )
        loss_sum, loss_count = 0.0, 0
        if args.checkpointing_steps is not None:
            checkpoint(epoch + 1, 0)
        if args.stop_at_train_loss is not None and epoch_train_loss <= args.stop_at_train_loss:
            stopped_at_target = True
            break
    progress.close()
    train_runtime = time.time() - start_time

    # ---- final measurements ---------------------------------------------------------------------------------
    final = history[-1] if history else evaluate_record(model, eval_dl, accelerator, args, completed_steps)
    train_metrics = evaluate(model, train_eval_dl, accelerator, desc="train-set eval", disable_tqdm=args.disable_tqdm)
    results = {
        "eval_accuracy": final["eval_accuracy"],
        "eval_loss": final["eval_loss"],
        "eval_samples": final["eval_samples"],
        "train_loss": train_metrics["loss"],
        "train_accuracy": train_metrics["accuracy"],
        "train_samples": train_metrics["samples"],
        "generalization_gap": generalization_gap(final["eval_loss"], train_metrics["loss"]),
        "last_epoch_train_loss": final["train_loss"],
        "stop_at_train_loss": args.stop_at_train_loss,
        "reached_train_loss_target": stopped_at_target,
        "epochs": len(history) and history[-1]["epoch"],
        "steps": completed_steps,
        "train_runtime_s": train_runtime,
        "num_processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision,
        "seed": args.seed,
        "dataset": raw.dataset_id,
        "eval_split": raw.eval_split,
        "augmentation": datasets_.augmentation,
        "preset": preset,
        "variant": config.variant,
        "num_parameters": sum(p.numel() for p in unwrapped.parameters()),
        "srr_weight": args.srr_weight,
        "srr_layer": args.srr_layer,
        "resumed_from": resumed_from,
        "history": history,
    }

    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(model)  # collective under FSDP: every process calls it
    if accelerator.is_main_process:
        unwrapped.save_pretrained(args.output_dir, state_dict=state_dict)
        processor.save_pretrained(args.output_dir)

    if args.layer_srr_samples and fsdp:
        accelerator.print("FSDP: skipping the in-loop per-layer SRR (parameters are sharded); run `hf-tdiag report` on the saved model")
    elif args.layer_srr_samples:
        from ..probes.srr import layer_srr

        count = min(args.layer_srr_samples, len(datasets_.eval))
        subset = torch.utils.data.Subset(datasets_.eval, range(count))
        srr_dl = torch.utils.data.DataLoader(subset, batch_size=args.per_device_eval_batch_size, shuffle=False)
        report = layer_srr(
            unwrapped,
            srr_dl,
            eps=args.srr_eps,
            lam=args.srr_lambda,
            batch_size=args.per_device_eval_batch_size,
            accelerator=accelerator,
            progress=not args.disable_tqdm,
        )
        per_layer = report.mean["block_input"]["srr"]
        results["layer_srr"] = per_layer
        results["layer_srr_samples"] = report.num_samples
        results["srr_mean_over_layers"] = float(sum(per_layer) / len(per_layer))
        if accelerator.is_main_process:
            report.to_json(os.path.join(args.output_dir, "layer_srr.json"))
            _plot_layer_srr(report, os.path.join(args.output_dir, "layer_srr.png"), title=f"{config.variant} on {raw.dataset_id}")
            accelerator.print("per-layer SRR (block input Z^l, mean over %d eval images):" % report.num_samples)
            for i, value in enumerate(per_layer):
                accelerator.print(
                    f"  layer {i:2d}: SRR {value:9.4f}   R {report.mean['block_input']['R'][i]:9.4f}   "
                    f"Rc {report.mean['block_input']['Rc'][i]:9.4f}   sparsity {report.mean['block_input']['sparsity'][i]:.4f}"
                )

    if accelerator.is_main_process:
        from .model_card import build_model_card

        card = build_model_card(unwrapped.config, results, args, raw, preset=preset, output_dir=args.output_dir)
        card.save(os.path.join(args.output_dir, "README.md"))
        _write_json(os.path.join(args.output_dir, "all_results.json"), results)
        accelerator.print(
            f"done in {train_runtime:.1f}s: eval_accuracy {results['eval_accuracy']:.4f} eval_loss {results['eval_loss']:.4f} "
            f"train_loss {results['train_loss']:.4f} generalization_gap {results['generalization_gap']:.4f} -> {args.output_dir}"
        )
        if args.push_to_hub:
            from .hub import publish

            repo_id = args.hub_model_id or os.path.basename(os.path.normpath(args.output_dir))
            results["hub_url"] = publish(
                args.output_dir, repo_id, model=unwrapped, processor=processor, card=card,
                token=args.hub_token, private=args.hub_private_repo,
            )
    accelerator.wait_for_everyone()
    if args.with_tracking:
        accelerator.end_training()
    return results


def evaluate_record(model, eval_dl, accelerator, args, completed_steps) -> dict:
    """An evaluation record when no epoch ran (e.g. resuming a finished run)."""
    metrics = evaluate(model, eval_dl, accelerator, disable_tqdm=args.disable_tqdm)
    return {
        "epoch": 0,
        "step": completed_steps,
        "train_loss": float("nan"),
        "eval_loss": metrics["loss"],
        "eval_accuracy": metrics["accuracy"],
        "eval_samples": metrics["samples"],
    }


def _plot_layer_srr(report, path: str, title: str) -> None:
    """Per-layer SRR curves of the trained model (:func:`hf_tdiag.viz.plot_layer_srr`) saved to ``path``."""
    from .. import viz

    viz.save_figure(viz.plot_layer_srr(report, title=title), path)


__all__ = ["train"]
