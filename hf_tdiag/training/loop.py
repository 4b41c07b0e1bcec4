"""The Accelerate training loop for CRATE image classifiers, in named phases.

``train(args_or_kwargs)`` runs one job end to end and returns the results dict also written to
``<output_dir>/all_results.json``. Read it like Accelerate's ``complete_cv_example.py``:

1. :func:`prepare` — accelerator, data (:mod:`.data`), model/processor (:mod:`.model`), optimizer
   (:mod:`.optim`), LR schedule with warmup, ``accelerator.prepare``, trackers;
2. :func:`resume` — restore model/optimizer/scheduler/RNG and the loop counters from a checkpoint
   (:mod:`.checkpointing`);
3. per epoch :func:`train_epoch` (optimizer steps with gradient accumulation and the optional SRR
   regulariser, :mod:`.regularizers`), :func:`evaluate_epoch` (``gather_for_metrics``, :mod:`.gap`)
   and :func:`checkpoint` (atomic, rotated);
4. :func:`finish` — train-set evaluation and the generalization gap, ``save_pretrained`` of model and
   processor, the ``after_fit`` steps (e.g. the per-layer SRR report of the trained model, which lives in
   :mod:`hf_tdiag.viz.srr`), the model card (:mod:`.model_card`), ``all_results.json`` and
   optionally the Hub upload (:mod:`.hub`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from .._outputs import release_output_dir
from .._progress import tqdm
from .._threads import pick_threads, torch_threads
from . import srr_tracking
from .args import is_digits, make_args
from .checkpointing import (
    RUN_ID_KEY,
    SETTINGS_KEY,
    claim_training_dir,
    clean_partial,
    load_checkpoint,
    new_run_id,
    resolve_checkpoint,
    run_id_of,
    save_checkpoint,
    training_settings,
)
from .data import build_datasets, load_raw_data
from .families import architecture_name
from .gap import evaluate_classifier
from .model import build_model_and_processor, image_size_of
from .optim import build_optimizer
from .outcome import AfterFit, finish
from .regularizers import model_srr_penalty

DIGITS_EPOCHS = 40
DEFAULT_EPOCHS = 3
DEFAULT_LR = {"adamw": 1e-3, "lion": 1e-4}
DIGITS_LR = {"adamw": 3e-3, "lion": 3e-4}
# the digits recipe: the processor upsamples the 8x8 images to 16x16 (bicubic) and the model cuts 4x4 patches,
# so each token sees 2x2 original pixels through 16 interpolated values (with 2x2 patches of the raw 8x8 image
# the patch LayerNorm over 4 values discards most of the signal), and pools the mean token
DIGITS_MODEL = {"image_size": 16, "patch_size": 4, "pooling": "mean"}


@dataclass
class TrainingRun:
    """Everything the phases share: the prepared objects and the loop's counters (what a checkpoint stores)."""

    args: Any
    accelerator: Any
    raw: Any
    datasets: Any
    model: torch.nn.Module  # as prepared by the accelerator (runs the forward pass)
    unwrapped: torch.nn.Module  # the bare model (weights, U for the regulariser, save_pretrained)
    processor: Any
    preset: str | None
    optimizer: Any
    lr_scheduler: Any
    train_dl: Any
    eval_dl: Any
    train_eval_dl: Any
    threads: int
    start_time: float
    completed_steps: int = 0
    start_epoch: int = 0
    resume_batches: int = 0
    history: list = field(default_factory=list)
    srr_history: list = field(default_factory=list)  # --track-srr-every records (srr_history.json)
    loss_sum: float = 0.0
    loss_count: int = 0
    resumed_from: str | None = None
    stopped_at_target: bool = False
    srr_last: float | None = None
    progress: Any = None
    run_id: str = ""  # checkpoints of this run carry it; rotation deletes only those
    settings: dict = field(default_factory=dict)  # what the checkpoints record as trained with (resume check)

    @property
    def config(self):
        return self.unwrapped.config

    @property
    def fsdp(self) -> bool:
        from accelerate.utils import DistributedType

        return self.accelerator.distributed_type == DistributedType.FSDP


# ---------------------------------------------------------------------------------------------- entry point
def train(
    args_or_kwargs=None,
    *,
    after_fit: Sequence[AfterFit] | None = None,
    train_dataset=None,
    eval_dataset=None,
    **kwargs,
) -> dict:
    """Train a CRATE classifier; ``args_or_kwargs``: argv list, ``argparse.Namespace`` or mapping (+ keyword flags).

    ``train_dataset`` / ``eval_dataset``: data objects instead of the dataset flags (a ``datasets.Dataset``,
    ``DatasetDict``, ``IterableDataset`` or torch ``Dataset``; :mod:`hf_tdiag.training.data`).

    ``after_fit``: steps run on the trained model before the model card is written, each
    ``step(run) -> dict`` merged into the results; ``None`` (default) runs the per-layer SRR report
    (:func:`hf_tdiag.training.srr_tracking.layer_srr_step`) when ``--layer_srr_samples`` > 0.
    Returns the results dict (accuracy, losses, generalization gap, runtime, ...), also written to
    ``<output_dir>/all_results.json`` on the main process. The caller's torch thread count is restored.
    """
    args = make_args(args_or_kwargs, **kwargs)
    data = (train_dataset, eval_dataset)
    if args.push_to_hub:  # before any work: an unreachable Hub fails now, not after the training
        from .hub import check_hub_reachable

        check_hub_reachable(output_dir=args.output_dir)
    _resolve_defaults(args, digits=is_digits(args) and train_dataset is None)
    settings, run_id = _claim_output_dir(args)  # before any work: never another run's folder, never unwritable
    if after_fit is None:
        from .srr_tracking import layer_srr_step

        after_fit = [layer_srr_step]
    try:
        return _train(args, data, after_fit, settings, run_id)
    finally:  # what this run wrote goes into the folder's manifest, and the folder is free for the next job
        release_output_dir(args.output_dir)


def _train(args, data, after_fit, settings: dict, run_id: str) -> dict:
    with torch_threads():  # prepare may set the count for small CPU models; the caller's comes back
        run = prepare(args, data)
        run.settings, run.run_id = settings, run_id
        resume(run)
        _announce(run)
        if args.track_srr_every and not run.srr_history:
            srr_tracking.record(run, run.start_epoch)  # the starting point of the curves
        for epoch in range(run.start_epoch, args.num_train_epochs):
            if run.completed_steps >= args.max_train_steps:
                break
            train_epoch(run, epoch)
            record = evaluate_epoch(run, epoch)
            if args.checkpointing_steps is not None:
                checkpoint(run, epoch + 1, 0)
            if args.stop_at_train_loss is not None and record["train_loss"] <= args.stop_at_train_loss:
                run.stopped_at_target = True
                break
        return finish(run, after_fit)


def _claim_output_dir(args) -> tuple[dict, str]:
    """The settings recorded in the checkpoints and the run id (the resumed checkpoint's, else a new one), after
    :func:`hf_tdiag.training.checkpointing.claim_training_dir` accepted the output folder."""
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    settings = training_settings(args)  # before prepare() resolves the step budget
    # the first PartialState fixes the process group for the whole run: CPU processes (gloo) with
    # ACCELERATE_USE_CPU, or when several processes were launched on a machine without an accelerator
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    cpu = parse_flag_from_env("ACCELERATE_USE_CPU") or (several and not torch.accelerator.is_available())
    resumed = claim_training_dir(args, is_main=PartialState(cpu=cpu).is_main_process)
    return settings, (run_id_of(resumed) if resumed else None) or new_run_id()


def _resolve_defaults(args, digits: bool | None = None) -> None:
    digits = is_digits(args) if digits is None else digits  # (False when data objects are given)
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


# ---------------------------------------------------------------------------------------------- 1. prepare
def _make_accelerator(args):
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration

    from .tracking import resolve_trackers

    log_with = None
    if args.with_tracking:
        log_with = resolve_trackers(args.report_to, os.path.join(args.output_dir, "logs"))
    return Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=args.mixed_precision,
        log_with=log_with,
        project_config=ProjectConfiguration(
            project_dir=args.output_dir, logging_dir=os.path.join(args.output_dir, "logs")
        ),
        # epoch shuffling by Accelerate's SeedableRandomSampler: permutation = f(data_seed + epoch) on every
        # process, so a resumed run sees the same batches as an uninterrupted one (tests/test_training_runs.py)
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=args.seed),
    )


def _loader(dataset, batch_size, args, shuffle=False):
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=args.dataloader_num_workers,
        drop_last=False,
        # a private generator: creating iterators must not consume the global torch RNG (resume equality)
        generator=torch.Generator().manual_seed(args.seed),
    )


def _set_threads(args, accelerator, num_parameters: int) -> int:
    """``--threads``, else ``OMP_NUM_THREADS``, else one intra-op thread for small models on CPU (thread sync
    costs more than it saves): the rule of :func:`hf_tdiag._threads.pick_threads`."""
    threads = pick_threads(args.num_threads, device=accelerator.device, num_parameters=num_parameters)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def _json_config(args) -> dict:
    out = {}
    for key, value in sorted(vars(args).items()):
        if key in ("func", "hub_token"):
            continue
        out[key] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return out


def _schedule(args, accelerator, optimizer, batches_per_epoch: int):
    """Resolve ``max_train_steps``/``num_train_epochs`` and build the warmup LR schedule."""
    from transformers import get_scheduler

    steps_per_epoch = math.ceil(batches_per_epoch / args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * steps_per_epoch
    else:
        args.num_train_epochs = math.ceil(args.max_train_steps / steps_per_epoch)
    warmup = (
        args.num_warmup_steps if args.num_warmup_steps is not None else int(args.warmup_ratio * args.max_train_steps)
    )
    return get_scheduler(
        args.lr_scheduler_type,
        optimizer=optimizer,
        # the prepared scheduler steps once per process for every optimizer step
        num_warmup_steps=warmup * accelerator.num_processes,
        num_training_steps=args.max_train_steps * accelerator.num_processes,
    )


def prepare(args, data=(None, None)) -> TrainingRun:
    """Accelerator, data (``data``: the train/eval data objects, else the flags), model, optimizer and schedule, all
    through ``accelerator.prepare``; trackers started."""
    from accelerate.utils import DistributedType, set_seed

    start_time = time.time()
    accelerator = _make_accelerator(args)
    if accelerator.distributed_type == DistributedType.FSDP and args.srr_weight > 0:
        raise ValueError(
            "srr_weight: the SRR regulariser reads U^l outside the forward pass, where FSDP keeps parameters "
            "sharded; train with DDP (recipes/accelerate_configs/multi_gpu_ddp.yaml) or one device instead"
        )
    if accelerator.is_main_process:
        os.makedirs(args.output_dir, exist_ok=True)
        clean_partial(args.output_dir)
    accelerator.wait_for_everyone()
    set_seed(args.seed)

    raw = load_raw_data(args, *data)
    model, processor, preset = build_model_and_processor(args, raw)
    threads = _set_threads(args, accelerator, sum(p.numel() for p in model.parameters()))
    datasets_ = build_datasets(args, raw, processor, model.config.num_channels, image_size_of(model.config))
    train_dl = _loader(datasets_.train, args.per_device_train_batch_size, args, shuffle=True)
    eval_dl = _loader(datasets_.eval, args.per_device_eval_batch_size, args)
    train_eval_dl = _loader(datasets_.train_eval, args.per_device_eval_batch_size, args)
    optimizer = build_optimizer(
        model, args.optimizer, args.learning_rate, args.weight_decay, (args.adam_beta1, args.adam_beta2)
    )
    model, optimizer, train_dl, eval_dl, train_eval_dl = accelerator.prepare(
        model, optimizer, train_dl, eval_dl, train_eval_dl
    )
    lr_scheduler = accelerator.prepare(_schedule(args, accelerator, optimizer, len(train_dl)))
    if args.with_tracking:
        accelerator.init_trackers("crate", _json_config(args))
    return TrainingRun(
        args=args,
        accelerator=accelerator,
        raw=raw,
        datasets=datasets_,
        model=model,
        unwrapped=accelerator.unwrap_model(model),
        processor=processor,
        preset=preset,
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        train_dl=train_dl,
        eval_dl=eval_dl,
        train_eval_dl=train_eval_dl,
        threads=threads,
        start_time=start_time,
    )


# ---------------------------------------------------------------------------------------------- 2. resume
def resume(run: TrainingRun) -> None:
    """``--resume_from_checkpoint`` (a folder or ``latest``): weights, optimizer, scheduler, RNG and counters."""
    args, accelerator = run.args, run.accelerator
    if not args.resume_from_checkpoint:
        return
    path = resolve_checkpoint(args.resume_from_checkpoint, args.output_dir)
    if path is None:
        accelerator.print(f"resume_from_checkpoint=latest: no checkpoint in {args.output_dir}, starting fresh")
        return
    state = load_checkpoint(accelerator, path)
    run.completed_steps = int(state["completed_steps"])
    run.start_epoch = int(state["epoch"])
    run.resume_batches = int(state["batches_in_epoch"])
    run.history = list(state.get("history", []))
    run.srr_history = list(state.get("srr_history", []))
    run.loss_sum, run.loss_count = float(state.get("epoch_loss_sum", 0.0)), int(state.get("epoch_loss_count", 0))
    run.resumed_from = path
    accelerator.print(
        f"resumed from {path}: step {run.completed_steps}, epoch {run.start_epoch}, batch {run.resume_batches}"
    )


def _announce(run: TrainingRun) -> None:
    args, accelerator = run.args, run.accelerator
    accelerator.print(
        f"training {type(run.unwrapped).__name__} ({run.preset or args.model_name_or_path}, variant "
        f"{architecture_name(run.config)}, {sum(p.numel() for p in run.unwrapped.parameters()):,} parameters) on {run.raw.name}: "
        f"{run.raw.num_train} train / {run.raw.num_eval} eval images, {args.num_train_epochs} epochs, "
        f"{args.max_train_steps} steps, {accelerator.num_processes} process(es) x {run.threads} thread(s), "
        f"mixed precision {accelerator.mixed_precision}"
    )
    run.progress = tqdm(
        total=args.max_train_steps,
        initial=run.completed_steps,
        desc="train",
        disable=args.disable_tqdm or not accelerator.is_local_main_process,
    )


# ---------------------------------------------------------------------------------------------- 3. train an epoch
def compute_loss(model, unwrapped, batch, args, step: int, return_outputs: bool = False):
    """``(loss, ce, penalty)`` of one batch: ``loss = CE(label smoothing) + β·SRR(Z^ℓ; U^ℓ)`` (penalty None if β = 0).

    ``model`` is what the accelerator prepared (it runs the forward pass), ``unwrapped`` the bare model whose
    ``U`` the regulariser reads; ``step`` (the optimizer step) picks the layer for ``--srr_layer random``.
    ``return_outputs``: the model outputs come fourth (``hf_tdiag.integrations.SRRTrainer`` shares this loss).
    """
    need_srr = args.srr_weight > 0
    outputs = model(pixel_values=batch["pixel_values"], output_hidden_states=need_srr)
    ce = F.cross_entropy(outputs.logits.float(), batch["labels"], label_smoothing=args.label_smoothing)
    loss, penalty = ce, None
    if need_srr:
        penalty, _ = model_srr_penalty(
            unwrapped, outputs.hidden_states, args.srr_layer, step, args.seed, eps=args.srr_eps, lam=args.srr_lambda
        )
        loss = ce + args.srr_weight * penalty.to(ce.dtype)
    return (loss, ce, penalty, outputs) if return_outputs else (loss, ce, penalty)


def _epoch_batches(run: TrainingRun, epoch: int):
    """``(batches, first_index)``: the epoch's loader, its first ``resume_batches`` skipped when resuming into it."""
    run.train_dl.set_epoch(epoch)
    if hasattr(run.datasets.train, "set_epoch"):
        run.datasets.train.set_epoch(epoch)
    skip = run.resume_batches if epoch == run.start_epoch else 0
    if not skip:
        return run.train_dl, 0
    active = run.accelerator.skip_first_batches(run.train_dl, skip)
    active.set_epoch(epoch)
    return active, skip


def _optimizer_step(run: TrainingRun, batch) -> torch.Tensor:
    """Forward, backward, clip, step under ``accelerator.accumulate``; returns the batch's cross-entropy."""
    args, accelerator = run.args, run.accelerator
    with accelerator.accumulate(run.model):
        loss, ce, penalty = compute_loss(run.model, run.unwrapped, batch, args, run.completed_steps)
        if penalty is not None:
            run.srr_last = float(penalty.detach())
        accelerator.backward(loss)
        if accelerator.sync_gradients and args.max_grad_norm:
            accelerator.clip_grad_norm_(run.model.parameters(), args.max_grad_norm)
        run.optimizer.step()
        run.lr_scheduler.step()
        run.optimizer.zero_grad()
    return ce.detach()


def train_epoch(run: TrainingRun, epoch: int) -> None:
    """One pass over the training data (or until ``max_train_steps``), with mid-epoch checkpoints."""
    args, accelerator = run.args, run.accelerator
    run.model.train()
    batches, batch_index = _epoch_batches(run, epoch)
    num_batches = len(run.train_dl)
    every = int(args.checkpointing_steps) if (args.checkpointing_steps or "epoch").isdigit() else None
    for batch in batches:
        batch_index += 1
        ce = float(_optimizer_step(run, batch))
        run.loss_sum += ce
        run.loss_count += 1
        if not accelerator.sync_gradients:
            continue
        run.completed_steps += 1
        run.progress.update(1)
        if args.with_tracking and run.completed_steps % args.logging_steps == 0:
            logs = {"train/loss_step": ce, "train/lr": run.lr_scheduler.get_last_lr()[0]}
            if run.srr_last is not None:
                logs["train/srr_penalty"] = run.srr_last
            accelerator.log(logs, step=run.completed_steps)
        if srr_tracking.due(args.track_srr_every, run.completed_steps, epoch_end=False):
            srr_tracking.record(run, epoch)
        if every and run.completed_steps % every == 0 and batch_index < num_batches:
            checkpoint(run, epoch, batch_index)
        if run.completed_steps >= args.max_train_steps:
            break


# ---------------------------------------------------------------------------------------------- evaluate
def evaluate_epoch(run: TrainingRun, epoch: int) -> dict:
    """End of an epoch: the mean training loss over processes and an evaluation; appends to the history."""
    args, accelerator = run.args, run.accelerator
    totals = torch.tensor([run.loss_sum, float(run.loss_count)], device=accelerator.device, dtype=torch.float64)
    totals = accelerator.reduce(totals, reduction="sum")
    train_loss = float(totals[0] / totals[1]) if float(totals[1]) > 0 else float("nan")
    metrics = evaluate_classifier(run.model, run.eval_dl, accelerator, desc="eval", disable_tqdm=args.disable_tqdm)
    record = {
        "epoch": epoch + 1,
        "step": run.completed_steps,
        "train_loss": train_loss,
        "eval_loss": metrics["loss"],
        "eval_accuracy": metrics["accuracy"],
        "eval_samples": metrics["samples"],
    }
    run.history.append(record)
    run.loss_sum, run.loss_count = 0.0, 0
    if srr_tracking.due(args.track_srr_every, run.completed_steps, epoch_end=True):
        srr_tracking.record(run, epoch + 1)
    run.progress.set_postfix(loss=f"{train_loss:.4f}", acc=f"{metrics['accuracy']:.4f}")
    if args.with_tracking:
        accelerator.log(
            {
                "train/loss": train_loss,
                "eval/loss": metrics["loss"],
                "eval/accuracy": metrics["accuracy"],
                "epoch": epoch + 1,
            },
            step=run.completed_steps,
        )
    if args.disable_tqdm:
        accelerator.print(
            f"epoch {epoch + 1}: step {run.completed_steps} train_loss {train_loss:.4f} "
            f"eval_loss {metrics['loss']:.4f} eval_accuracy {metrics['accuracy']:.4f}"
        )
    return record


# ---------------------------------------------------------------------------------------------- checkpoint
def checkpoint(run: TrainingRun, epoch: int, batches_in_epoch: int) -> str:
    """Atomic ``checkpoint-<step>`` with the accelerator state and the loop counters; every process calls it."""
    state = {
        "completed_steps": run.completed_steps,
        "epoch": epoch,
        "batches_in_epoch": batches_in_epoch,
        "history": run.history,
        "srr_history": run.srr_history,
        "epoch_loss_sum": run.loss_sum,
        "epoch_loss_count": run.loss_count,
        "seed": run.args.seed,
        RUN_ID_KEY: run.run_id or None,
        SETTINGS_KEY: run.settings or None,
    }
    return save_checkpoint(
        run.accelerator, run.args.output_dir, run.completed_steps, state, keep=run.args.checkpoints_total_limit
    )


__all__ = [
    "train",
    "TrainingRun",
    "prepare",
    "resume",
    "train_epoch",
    "evaluate_epoch",
    "checkpoint",
    "finish",
    "compute_loss",
]
