"""``SRRCallback``: per-layer sparse rate reduction tracked by ``transformers.Trainer``.

Every ``every_n_steps`` optimizer steps, at each evaluation and once before the first step, the callback measures
:func:`hf_tdiag.layer_srr` of the model being trained on a fixed subset (the first ``num_samples`` items of
``inputs``, by default of the Trainer's evaluation dataset) and logs ``srr/mean`` (over the blocks) and
``srr/last`` (the last block's output); ``log_layers=True`` logs every block's terms too,
``srr/layer_<ℓ>/<term>`` (R, Rc, sparsity, srr of the block outputs ``Z^ℓ``, blocks 1…L). The scalars go where
``Trainer.log`` puts them: ``trainer.state.log_history`` and the ``on_log`` of every callback, so TensorBoard, W&B,
trackio and every other ``report_to`` backend receive them. Every record, all layers and terms, goes to
``<output_dir>/srr_history.json`` and into each ``checkpoint-<step>`` folder, so a resumed run continues it.
``schatten=True`` also logs the Schatten bound's headline numbers (``schatten/<key>``).

Use it as any callback, ``Trainer(..., callbacks=[SRRCallback(...)])``: transformers hands a callback no reference
to the Trainer, so at ``on_train_begin`` it takes the Trainer whose training loop called it (from the calling frames)
and logs through ``trainer.log``, as ``SRRCallback(...).attach(trainer)`` and :class:`SRRTrainer` do. A log never
changes the Trainer's own logging schedule (``control.should_log``, its loss log due at that step, is kept).
The measurement runs in eval mode without gradients and leaves the model's mode and the global RNG as found.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import TrainerCallback

from .._atomic import write_json
from .._caller_state import module_modes, restore_modes
from .._validation import positive_int
from ..diagnostics.settings import SRRSettings

HISTORY_FILE = "srr_history.json"
TERMS = ("R", "Rc", "sparsity", "srr")
_IMAGE_KEYS = ("image", "img")
_LABEL_KEYS = ("label", "labels")


def _is_image(value) -> bool:
    return hasattr(value, "mode") and hasattr(value, "convert")


def _first_items(dataset, count: int) -> list:
    if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        return [dataset[i] for i in range(min(count, len(dataset)))]
    return list(itertools.islice(iter(dataset), count))  # an IterableDataset


def _stack(items: list, processor) -> dict[str, torch.Tensor]:
    """A dict batch from dataset items: ``pixel_values``-style tensors stacked, raw images through ``processor``."""
    first = items[0]
    if isinstance(first, (tuple, list)):  # (inputs, label) pairs
        items, first = [item[0] for item in items], items[0][0]
    if isinstance(first, torch.Tensor):
        return {"pixel_values": torch.stack(items)}
    if not isinstance(first, Mapping):
        raise TypeError(f"inputs: dataset items must be dicts, tensors or (inputs, label) pairs, got {type(first)}")
    image_key = next((k for k in _IMAGE_KEYS if k in first and "pixel_values" not in first), None)
    if image_key is not None:
        return _processed([item[image_key] for item in items], processor)
    keys = [k for k, v in first.items() if k not in _LABEL_KEYS and isinstance(v, (torch.Tensor, list, int, float))]
    return {k: torch.stack([torch.as_tensor(item[k]) for item in items]) for k in keys}


def _processed(images: list, processor) -> dict[str, torch.Tensor]:
    if processor is None:
        raise ValueError("inputs: raw images need an image processor; pass processor= or give the Trainer one")
    return {"pixel_values": processor(images, return_tensors="pt")["pixel_values"]}


def fixed_subset(inputs, num_samples: int, processor=None) -> dict[str, torch.Tensor]:
    """The first ``num_samples`` of ``inputs`` (tensor, dict batch, list of images or a dataset) as a dict batch."""
    if isinstance(inputs, torch.Tensor):
        return {"pixel_values": inputs[:num_samples]}
    if isinstance(inputs, Mapping):
        return {k: v[:num_samples] for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in _LABEL_KEYS}
    if isinstance(inputs, Sequence) and inputs and _is_image(inputs[0]):
        return _processed(list(inputs[:num_samples]), processor)
    items = _first_items(inputs, num_samples)
    if not items:
        raise ValueError("inputs: the SRR subset is empty (no evaluation dataset items)")
    return _stack(items, processor)


class SRRCallback(TrainerCallback):
    """Track per-layer SRR (and optionally the Schatten proxies) of the model a ``Trainer`` trains.

    ``inputs``: a tensor batch, a dict batch, a list of images or a dataset (default: the Trainer's
    ``eval_dataset``), of which the first ``num_samples`` are measured every time. ``every_n_steps``: measure after
    every N optimizer steps (None: only at evaluations and at the start). ``settings``: an
    :class:`~hf_tdiag.diagnostics.settings.SRRSettings` (eps, lam, batch size, ...). ``log_layers``: log every
    block's R, Rc, sparsity and SRR (``srr/layer_<ℓ>/<term>``) besides ``srr/mean`` and ``srr/last``.
    """

    def __init__(
        self,
        inputs=None,
        every_n_steps: int | None = None,
        *,
        num_samples: int = 64,
        on_evaluate: bool = True,
        at_start: bool = True,
        settings: SRRSettings | None = None,
        schatten: bool = False,
        processor=None,
        trainer=None,
        log_layers: bool = False,
    ):
        if every_n_steps is not None:
            positive_int(every_n_steps, "every_n_steps")
        positive_int(num_samples, "num_samples")
        if settings is not None and not isinstance(settings, SRRSettings):
            raise TypeError(f"settings: expected an SRRSettings, got {type(settings).__name__}")
        self.inputs, self.every_n_steps, self.num_samples = inputs, every_n_steps, num_samples
        self.measure_on_evaluate, self.at_start, self.schatten = on_evaluate, at_start, schatten
        self.settings = settings or SRRSettings()
        if not isinstance(log_layers, bool):
            raise TypeError(f"log_layers: expected True or False, got {log_layers!r}")
        self.processor, self.trainer, self.log_layers = processor, trainer, log_layers
        self.history: list[dict[str, Any]] = []
        self._batch: dict[str, torch.Tensor] | None = None

    def attach(self, trainer) -> SRRCallback:
        """Log through ``trainer`` (and add this callback to it when it is not there yet); returns ``self``."""
        self.trainer = trainer
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        return self

    # ------------------------------------------------------------------------------------------ Trainer events
    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.trainer is None:
            self.trainer = _calling_trainer()
            if self.trainer is None:
                raise RuntimeError(
                    "SRRCallback: on_train_begin was not called from a Trainer's training loop, so there is nothing "
                    "to log through; pass it as Trainer(..., callbacks=[SRRCallback(...)]) or use "
                    "SRRCallback(...).attach(trainer)"
                )
        inputs = self.inputs if self.inputs is not None else self.trainer.eval_dataset
        if inputs is None:
            raise ValueError("inputs: no SRR inputs given and the Trainer has no eval_dataset; pass inputs=")
        if isinstance(inputs, Mapping) and not any(isinstance(v, torch.Tensor) for v in inputs.values()):
            inputs = next(iter(inputs.values()))  # a dict of eval datasets: the first one
        self._batch = fixed_subset(inputs, self.num_samples, self.processor or processing_class)
        self.history = self._resumed_history(args, state)
        if self.at_start and not self.history:
            self.record(model, state, "start", args=args, control=control)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.every_n_steps and state.global_step % self.every_n_steps == 0:
            self.record(model, state, "step", args=args, control=control)

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        if self.measure_on_evaluate:
            self.record(model, state, "evaluate", args=args, control=control)

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if state.is_world_process_zero and os.path.isdir(folder):
            self._write(os.path.join(folder, HISTORY_FILE))

    # ------------------------------------------------------------------------------------------ measuring
    def measure(self, model) -> dict[str, Any]:
        """Per-layer SRR terms (and Schatten headline numbers) of ``model`` on the fixed subset, in eval mode."""
        from ..diagnostics.srr import layer_srr

        saved_modes = module_modes(model)
        rng = torch.get_rng_state()
        model.eval()
        try:
            report = layer_srr(model, self._batch, settings=self.settings, progress=False)
            entry = {
                "num_samples": report.num_samples,
                "output": {term: report.per_layer(term) for term in TERMS},
                "embeddings": report.embeddings["mean"] if report.embeddings else None,
            }
            if self.schatten:
                from ..diagnostics.schatten import schatten_bounds

                summary = schatten_bounds(model).summary()
                entry["schatten"] = {k: float(v) for k, v in summary.items() if isinstance(v, (int, float))}
        finally:
            restore_modes(saved_modes)
            torch.set_rng_state(rng)
        return entry

    def record(self, model, state, event: str, args=None, control=None) -> dict[str, Any] | None:
        """Measure, log through the Trainer and write the history; once per optimizer step."""
        if self.history and self.history[-1]["step"] == state.global_step:
            return None  # e.g. an evaluation right after a step-N record: the weights have not changed
        entry = {"step": state.global_step, "epoch": state.epoch, "event": event, **self.measure(model)}
        self.history.append(entry)
        args = args if args is not None else self.trainer.args
        self._log(args, state, control, scalars(entry, layers=self.log_layers))
        if state.is_world_process_zero:
            self._write(os.path.join(args.output_dir, HISTORY_FILE))
        return entry

    def _log(self, args, state, control, logs: dict[str, float]) -> None:
        """``logs`` through ``trainer.log`` (``state.log_history`` and every callback's ``on_log``), leaving the
        Trainer's ``control.should_log`` (its own loss log due at this step) as it was."""
        due = getattr(control, "should_log", None)
        try:
            self.trainer.log(logs)
        finally:
            if due is not None:
                control.should_log = due

    # ------------------------------------------------------------------------------------------ history file
    def _write(self, path: str) -> str:
        num_layers = len(self.history[0]["output"]["srr"]) if self.history else 0
        return write_json(
            path,
            {
                "description": "per-layer SRR terms across Trainer training; layer l = output Z^l of block l "
                "(l = 1..L), embeddings = Z^0; means over the first num_samples items of the SRR inputs",
                "every_n_steps": self.every_n_steps,
                "eps": self.settings.eps,
                "lam": self.settings.lam,
                "layers": list(range(1, num_layers + 1)),
                "history": self.history,
            },
        )

    def _resumed_history(self, args, state) -> list[dict[str, Any]]:
        """The records up to the resumed step, from ``checkpoint-<step>/srr_history.json`` (empty when fresh)."""
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}", HISTORY_FILE)
        if state.global_step == 0 or not os.path.isfile(path):
            return []
        return [r for r in read_history(path) if r["step"] <= state.global_step]


def read_history(path: str) -> list[dict[str, Any]]:
    """The records of an ``srr_history.json`` the callback wrote, checked: a damaged file (truncated, not JSON, a
    record without its step or SRR numbers) is a one-line ``ValueError`` naming it; the file is left as it is."""
    todo = "move it aside (the run then starts its SRR history afresh) or restore it from a copy, then resume"

    def damaged(what: str) -> ValueError:
        return ValueError(f"{path}: {what}, so the resumed SRR history cannot be read; {todo}")

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except UnicodeDecodeError:
        raise damaged("not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise damaged(f"not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    if not isinstance(data, dict):
        raise damaged(f"expected a JSON object with a 'history' list, got a {type(data).__name__}")
    records = data.get("history")
    if not isinstance(records, list):
        raise damaged(
            "its 'history' is " + ("missing" if records is None else f"a {type(records).__name__}, not a list")
        )
    for i, record in enumerate(records):
        step = record.get("step") if isinstance(record, dict) else None
        output = record.get("output") if isinstance(record, dict) else None
        srr = output.get("srr") if isinstance(output, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise damaged(f"history[{i}] has no step (a non-negative integer)")
        if not isinstance(srr, list) or not srr or not all(_is_number(v) for v in srr):
            raise damaged(f"history[{i}] (step {step}) has no output.srr list of numbers")
    return records


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _calling_trainer(depth: int = 8):
    """The ``transformers.Trainer`` whose method is among the ``depth`` frames above the caller, else None (the
    training loop calls ``callback_handler.on_train_begin``, which calls ``call_event``, which calls the callback)."""
    from transformers import Trainer

    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer):
            return owner
        frame = frame.f_back
    return None


def scalars(entry: Mapping[str, Any], layers: bool = True) -> dict[str, float]:
    """The logged scalars of one record: ``srr/mean``, ``srr/last``, with ``layers`` every ``srr/layer_<ℓ>/<term>``,
    and ``schatten/<key>``."""
    srr = entry["output"]["srr"]
    logs = {}
    if layers:
        logs = {
            f"srr/layer_{ell}/{term}": float(values[ell - 1])
            for term, values in entry["output"].items()
            for ell in range(1, len(values) + 1)
        }
    logs["srr/mean"] = float(sum(srr) / len(srr))
    logs["srr/last"] = float(srr[-1])
    logs.update({f"schatten/{key}": value for key, value in (entry.get("schatten") or {}).items()})
    return logs


__all__ = ["SRRCallback", "fixed_subset", "scalars", "HISTORY_FILE"]
