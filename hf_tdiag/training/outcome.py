"""Phase 4 of a training job: the final measurements, the saved model, the card, the results file, the upload.

:func:`finish` runs after the last epoch of :mod:`hf_tdiag.training.loop`: an evaluation record (or a fresh
evaluation when no epoch ran), the eval-mode train-set loss and the generalization gap (:mod:`.gap`),
``save_pretrained`` of model and processor, the caller's ``after_fit`` steps, then on the main process the
model card (:mod:`.model_card`), ``all_results.json`` and, with ``--push-to-hub``, the upload (:mod:`.hub`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .._atomic import staged_folder, write_json
from .families import architecture_name
from .gap import evaluate_classifier, generalization_gap

if TYPE_CHECKING:
    from .loop import TrainingRun

AfterFit = Callable[["TrainingRun"], dict]


def evaluate_record(run: TrainingRun) -> dict:
    """An evaluation record when no epoch ran (e.g. resuming a finished run)."""
    metrics = evaluate_classifier(run.model, run.eval_dl, run.accelerator, disable_tqdm=run.args.disable_tqdm)
    return {
        "epoch": 0,
        "step": run.completed_steps,
        "train_loss": float("nan"),
        "eval_loss": metrics["loss"],
        "eval_accuracy": metrics["accuracy"],
        "eval_samples": metrics["samples"],
    }


def final_results(run: TrainingRun, train_runtime: float) -> dict:
    """The results dict: last evaluation, eval-mode train-set loss, generalization gap and the run's settings."""
    args, accelerator = run.args, run.accelerator
    final = run.history[-1] if run.history else evaluate_record(run)
    train_metrics = evaluate_classifier(
        run.model, run.train_eval_dl, accelerator, desc="train-set eval", disable_tqdm=args.disable_tqdm
    )
    return {
        "eval_accuracy": final["eval_accuracy"],
        "eval_loss": final["eval_loss"],
        "eval_samples": final["eval_samples"],
        "train_loss": train_metrics["loss"],
        "train_accuracy": train_metrics["accuracy"],
        "train_samples": train_metrics["samples"],
        "generalization_gap": generalization_gap(final["eval_loss"], train_metrics["loss"]),
        "last_epoch_train_loss": final["train_loss"],
        "stop_at_train_loss": args.stop_at_train_loss,
        "reached_train_loss_target": run.stopped_at_target,
        "epochs": len(run.history) and run.history[-1]["epoch"],
        "steps": run.completed_steps,
        "train_runtime_s": train_runtime,
        "num_processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision,
        "seed": args.seed,
        "dataset": run.raw.dataset_id,
        "eval_split": run.raw.eval_split,
        "augmentation": run.datasets.augmentation,
        "preset": run.preset,
        "variant": architecture_name(run.config),
        "num_parameters": sum(p.numel() for p in run.unwrapped.parameters()),
        "srr_weight": args.srr_weight,
        "srr_layer": args.srr_layer,
        "srr_eps": args.srr_eps,
        "srr_lambda": args.srr_lambda,
        "track_srr_every": args.track_srr_every,
        "srr_history_records": len(run.srr_history),
        "resumed_from": run.resumed_from,
        "history": run.history,
    }


def _save_model(run: TrainingRun) -> None:
    run.accelerator.wait_for_everyone()
    state_dict = run.accelerator.get_state_dict(run.model)  # collective under FSDP: every process calls it
    if run.accelerator.is_main_process:
        try:  # written beside the folder's files and moved in, the config last: a full disk leaves no half model
            with staged_folder(run.args.output_dir) as stage:
                run.unwrapped.save_pretrained(stage, state_dict=state_dict)
                run.processor.save_pretrained(stage)
        except OSError as err:
            raise OSError(f"output_dir: could not save the trained model: {err}") from err


def _publish(run: TrainingRun, results: dict) -> None:
    """Model card, ``all_results.json`` and (``--push_to_hub``) the upload; main process only."""
    from .model_card import training_card

    args = run.args
    training_card(run, results).save(os.path.join(args.output_dir, "README.md"))  # CRATE's card, or its family's
    write_json(os.path.join(args.output_dir, "all_results.json"), results)
    run.accelerator.print(
        f"done in {results['train_runtime_s']:.1f}s: eval_accuracy {results['eval_accuracy']:.4f} eval_loss "
        f"{results['eval_loss']:.4f} train_loss {results['train_loss']:.4f} generalization_gap "
        f"{results['generalization_gap']:.4f} -> {args.output_dir}"
    )
    if args.push_to_hub:
        from .hub import publish

        repo_id = args.hub_model_id or os.path.basename(os.path.normpath(args.output_dir))
        results["hub_url"] = publish(
            args.output_dir,
            repo_id,
            model=run.unwrapped,
            processor=run.processor,
            # the card again for the repo id the Hub resolved (namespace/name): its usage snippet names the repo
            card=lambda hub_id: training_card(run, results, repo_id=hub_id),
            token=args.hub_token,
            private=args.hub_private_repo,
        )
        run.accelerator.print(f"pushed to the Hub: {results['hub_url']}")


def finish(run: TrainingRun, after_fit: Sequence[AfterFit] = ()) -> dict:
    """Final measurements, ``save_pretrained``, the ``after_fit`` steps, model card, results file, Hub upload."""
    run.progress.close()
    results = final_results(run, train_runtime=time.time() - run.start_time)
    _save_model(run)
    for step in after_fit:
        results.update(step(run) or {})
    if run.accelerator.is_main_process:
        _publish(run, results)
    run.accelerator.wait_for_everyone()
    if run.args.with_tracking:
        run.accelerator.end_training()
    return results


__all__ = ["finish", "final_results", "evaluate_record"]
