"""``SRRTrainer``: ``transformers.Trainer`` with the sparse-rate-reduction regulariser (Hu, Zou & Xu 2024, Sec. 6).

The training loss is the project loop's (:func:`hf_tdiag.training.loop.compute_loss`, one implementation for
both): ``CE(label smoothing) + β·mean_b SRR(Z^ℓ_b; U^ℓ)`` with ``Z^ℓ`` the output of block ℓ (``srr_layer``:
``last``, a block number, ``random`` or ``all``; :mod:`hf_tdiag.training.regularizers`). Evaluation reports the
cross-entropy alone, as the project loop's ``eval_loss`` does. The last penalty is logged as ``srr_penalty``.
Any :class:`~hf_tdiag.integrations.SRRCallback` among the callbacks is attached, so it logs through this Trainer.
"""

from __future__ import annotations

from types import SimpleNamespace

from transformers import Trainer

from ..training.args import flag_defaults, parse_srr_layer
from .srr_callback import SRRCallback


class SRRTrainer(Trainer):
    """A ``Trainer`` whose loss is ``CE + srr_weight · SRR`` (``srr_weight=0``: plain cross-entropy).

    ``srr_layer``, ``srr_eps``, ``srr_lambda`` default to the ``hf-tdiag train`` flags' defaults;
    ``label_smoothing`` defaults to ``TrainingArguments.label_smoothing_factor``. ``srr_layer="random"`` draws
    from the seed and the optimizer step, as the project loop does.
    """

    def __init__(
        self, *args, srr_weight=None, srr_layer=None, srr_eps=None, srr_lambda=None, label_smoothing=None, **kw
    ):
        super().__init__(*args, **kw)
        defaults = flag_defaults()

        def pick(value, name):
            return defaults[name] if value is None else value

        weight, eps = float(pick(srr_weight, "srr_weight")), float(pick(srr_eps, "srr_eps"))
        if not weight >= 0:
            raise ValueError(f"srr_weight: expected a number >= 0, got {srr_weight!r}")
        if not eps > 0:
            raise ValueError(f"srr_eps: expected a number > 0, got {srr_eps!r}")
        smoothing = self.args.label_smoothing_factor if label_smoothing is None else float(label_smoothing)
        self.label_smoother = None  # the loss below applies the smoothing itself
        self.srr_loss_args = SimpleNamespace(
            srr_weight=weight,
            srr_layer=parse_srr_layer(pick(srr_layer, "srr_layer")),
            srr_eps=eps,
            srr_lambda=float(pick(srr_lambda, "srr_lambda")),
            label_smoothing=smoothing,
            seed=self.args.seed,
        )
        self._eval_loss_args = SimpleNamespace(**{**vars(self.srr_loss_args), "srr_weight": 0.0})
        self.srr_penalty: float | None = None
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, SRRCallback) and callback.trainer is None:
                callback.trainer = self

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The project loop's loss on ``inputs`` (``pixel_values``, ``labels``); cross-entropy alone in eval mode."""
        from ..training.loop import compute_loss

        loss_args = self.srr_loss_args if model.training else self._eval_loss_args
        unwrapped = self.accelerator.unwrap_model(model)
        loss, _, penalty, outputs = compute_loss(
            model, unwrapped, inputs, loss_args, self.state.global_step, return_outputs=True
        )
        if penalty is not None:
            self.srr_penalty = float(penalty.detach())
        return (loss, outputs) if return_outputs else loss

    def log(self, logs, *args, **kwargs):
        """``Trainer.log`` with the last SRR penalty beside the training loss."""
        if "loss" in logs and self.srr_penalty is not None:
            logs = {**logs, "srr_penalty": self.srr_penalty}
        return super().log(logs, *args, **kwargs)


__all__ = ["SRRTrainer"]
