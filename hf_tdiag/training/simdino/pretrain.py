"""SimDINO / DINO pretraining on Accelerate: data from the trainer's datasets, student + EMA teacher, the authors'
schedules (learning rate, weight decay, teacher momentum, teacher temperature), resumable checkpoints, the teacher's
backbone saved with ``save_pretrained`` and a linear probe of its frozen features.

``pretrain(settings)`` returns the results dict written to ``<output_dir>/pretrain_results.json``. Every random
choice is a function of ``(seed, step)``: the epoch's permutation of the images (seeded by ``seed`` and the epoch)
and the crops (a numpy generator seeded by ``[seed, step]``), so a run resumed from a checkpoint (model, teacher,
optimizer and DINO's centre in Accelerate's state) follows the uninterrupted run step for step.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..._outputs import release_output_dir
from ..._threads import pick_threads, torch_threads
from ...measures.coding_rate import coding_rate
from ..checkpointing import load_checkpoint, save_checkpoint
from ..optim import param_groups
from .args import PretrainSettings
from .heads import ProjectionHead, PrototypeHead
from .loss import DINOLoss, SimDINOLoss
from .model import SelfDistillation, backbone_features, cosine_schedule
from .outputs import BACKBONE_DIR, RESULTS_FILE, claim_pretrain_dir
from .views import MultiCrop

# the digits recipe of the classifier trainer: 8x8 upsampled to 16x16, 4x4 patches (training/loop.py DIGITS_MODEL)
DIGITS_SIZE = dict(
    image_size=16, patch_size=4, num_channels=1, hidden_size=64, num_hidden_layers=4, num_attention_heads=4
)


def build_backbone(name: str):
    """A new ``crate-digits`` CRATE (mean pooling) or ``vit-digits`` ViT of the same size, or a saved model folder."""
    if name == "crate-digits":
        from ...models.crate import CrateConfig, CrateModel

        return CrateModel(CrateConfig.from_preset("crate-digits", pooling="mean", **DIGITS_SIZE))
    if name == "vit-digits":
        from transformers import ViTConfig, ViTModel

        config = ViTConfig(intermediate_size=4 * DIGITS_SIZE["hidden_size"], **DIGITS_SIZE)
        return ViTModel(config, add_pooling_layer=False)
    if os.path.isdir(name):
        from transformers import AutoModel

        return AutoModel.from_pretrained(name)
    raise ValueError(f"backbone: expected 'crate-digits', 'vit-digits' or a saved model folder, got {name!r}")


def digits_pixel_values(config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(train_x, train_y, eval_x, eval_y)``: the classifier trainer's digits tensors at ``config``'s size."""
    from ...models.crate import CrateImageProcessor
    from ..args import make_args
    from ..data import build_datasets, load_raw_data
    from ..model import image_size_of

    targs = make_args(output_dir="-", augmentation="none")
    raw = load_raw_data(targs)
    processor = CrateImageProcessor.for_config(config)
    sets = build_datasets(targs, raw, processor, config.num_channels, image_size_of(config))
    return sets.train.pixel_values, sets.train.labels, sets.eval.pixel_values, sets.eval.labels


def _objective(s: PretrainSettings, hidden: int):
    n_crops = s.n_global + s.n_local
    if s.objective == "simdino":
        head = ProjectionHead(hidden, s.hidden_dim, s.bottleneck_dim, s.head_layers)
        loss = SimDINOLoss(n_crops, s.n_global, eps=s.eps, gamma=s.gamma, coeff=s.coeff, expansion=s.expansion)
    else:
        if s.out_dim < 1:
            raise ValueError(f"out_dim: expected a positive int for --objective dino, got {s.out_dim!r}")
        head = PrototypeHead(hidden, s.out_dim, s.hidden_dim, s.bottleneck_dim, s.head_layers)
        loss = DINOLoss(s.out_dim, n_crops, s.n_global, s.student_temp, s.center_momentum)
    return head, loss


def effective_rank(features: torch.Tensor) -> float:
    """``exp(H(σ/Σσ))`` of the centred features' singular values (1 for collapsed features, up to ``min(n, d)``)."""
    x = features.double() - features.double().mean(0)
    sv = torch.linalg.svdvals(x)
    p = sv / sv.sum().clamp_min(1e-300)
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


@torch.no_grad()
def teacher_statistics(model: SelfDistillation, pixel_values: torch.Tensor, eps: float) -> dict:
    """Collapse check on held-out images: the coding rate of the teacher's normalised projections (rate) and the
    effective rank of its backbone features."""
    branch = model.teacher
    feats = backbone_features(branch.backbone, pixel_values)
    head = branch.head.projection if isinstance(branch.head, PrototypeHead) else branch.head
    z = head(feats)
    return {"rate": float(coding_rate(z.float(), eps=eps)), "rank": effective_rank(feats)}


@torch.no_grad()
def frozen_features(backbone, pixel_values: torch.Tensor, batch: int = 256) -> np.ndarray:
    backbone.eval()
    out = [backbone_features(backbone, pixel_values[i : i + batch]) for i in range(0, len(pixel_values), batch)]
    return torch.cat(out).double().cpu().numpy()


def probe_accuracy(backbone, data) -> float:
    """Linear-probe accuracy (:func:`hf_tdiag.measures.linear_probe.linear_probe_accuracy`) of frozen features."""
    from ...measures.linear_probe import linear_probe_accuracy

    train_x, train_y, eval_x, eval_y = data
    return linear_probe_accuracy(
        frozen_features(backbone, train_x), train_y.numpy(), frozen_features(backbone, eval_x), eval_y.numpy()
    )


def pretrain(settings: PretrainSettings | dict) -> dict:
    """Run one pretraining job (see the module docstring); returns the results dict. The output folder is claimed
    first (:func:`hf_tdiag.training.simdino.outputs.claim_pretrain_dir`) and released when the run ends."""
    from accelerate import Accelerator

    s = settings if isinstance(settings, PretrainSettings) else PretrainSettings(**settings)
    with torch_threads():  # the caller's thread count comes back
        start = time.time()
        accelerator = Accelerator()
        checkpoint = claim_pretrain_dir(s, is_main=accelerator.is_main_process)  # before any work
        try:
            return _pretrain(s, accelerator, checkpoint, start)
        finally:  # what this run wrote goes into the folder's manifest, and the folder is free for the next job
            release_output_dir(s.output_dir)


@dataclass
class _Schedules:
    """The authors' per-step schedules: learning rate, weight decay, teacher momentum, teacher temperature."""

    lr: list
    wd: list
    momentum: list
    teacher_temp: list


def _schedules(s: PretrainSettings) -> _Schedules:
    T = s.max_train_steps
    temp_warm = min(s.warmup_teacher_temp_steps, T)
    temps = [
        s.warmup_teacher_temp + (s.teacher_temp - s.warmup_teacher_temp) * i / max(temp_warm - 1, 1)
        for i in range(temp_warm)
    ]
    return _Schedules(
        lr=cosine_schedule(s.learning_rate, s.min_lr, T, s.warmup_steps),
        wd=cosine_schedule(s.weight_decay, s.weight_decay_end, T),
        momentum=cosine_schedule(s.momentum_teacher, 1.0, T),
        teacher_temp=temps + [s.teacher_temp] * (T - temp_warm),
    )


@dataclass
class _Training:
    """What the steps of one run work with: the student/teacher pair and its AdamW prepared by ``accelerator``, and
    the unwrapped pair (``bare``)."""

    accelerator: object
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    bare: SelfDistillation


def _build(s: PretrainSettings, accelerator) -> tuple[_Training, tuple]:
    """The run's :class:`_Training` and the digits tensors at the backbone's size."""
    backbone = build_backbone(s.backbone)
    data = digits_pixel_values(backbone.config)
    head, loss = _objective(s, backbone.config.hidden_size)
    model = SelfDistillation(backbone, head, loss, s.n_global)
    threads = pick_threads(None, device=accelerator.device, num_parameters=sum(p.numel() for p in model.parameters()))
    if threads is not None:  # one thread for tiny models on CPU (the classifier trainer's rule)
        torch.set_num_threads(threads)
    optimizer = torch.optim.AdamW(param_groups(model.student, s.weight_decay), lr=s.learning_rate)
    model, optimizer = accelerator.prepare(model, optimizer)
    return _Training(accelerator, model, optimizer, accelerator.unwrap_model(model)), data


def _resume(accelerator, s: PretrainSettings, path: str | None) -> tuple[int, list, list]:
    """``(step, history, losses)`` stored in the checkpoint ``path``, whose model, teacher, optimizer, centre and
    random states are restored; a fresh start without one."""
    if path is None:
        return 0, [], []
    state = load_checkpoint(accelerator, path)  # its settings were checked when the folder was claimed
    return int(state["step"]), list(state["history"]), list(state["losses"])


def _views(s: PretrainSettings, crops: MultiCrop, train_x: torch.Tensor, step: int, device) -> list[torch.Tensor]:
    """The multi-crop views of step ``step``'s batch: its slice of the epoch's permutation of the images (seeded by
    ``seed`` and the epoch), cropped by a generator seeded by ``[seed, step]``."""
    epoch, index = divmod(step, len(train_x) // s.batch_size)
    order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(s.seed * 1_000_003 + epoch))
    batch = train_x[order[index * s.batch_size : (index + 1) * s.batch_size]]
    return [v.to(device) for v in crops(batch, np.random.default_rng([s.seed, step]))]


def _optimizer_step(s: PretrainSettings, run: _Training, views: list, step: int, sched: _Schedules) -> float:
    """One step of the student at step ``step``'s scheduled values, then the teacher's EMA update; the loss."""
    model, optimizer, bare, accelerator = run.model, run.optimizer, run.bare, run.accelerator
    for i, group in enumerate(optimizer.param_groups):
        group["lr"] = sched.lr[step]
        if i == 0:  # the decayed group (matrices); biases and norms keep none
            group["weight_decay"] = sched.wd[step]
    kwargs = {"teacher_temp": sched.teacher_temp[step]} if s.objective == "dino" else {}
    value, _ = model(views, **kwargs)
    loss = float(value.detach())
    if not math.isfinite(loss):
        raise FloatingPointError(f"pretrain: the loss is {loss} at step {step}; lower --learning-rate")
    accelerator.backward(value)
    if s.max_grad_norm:
        accelerator.clip_grad_norm_(bare.student.parameters(), s.max_grad_norm)
    if s.objective == "dino" and step < s.freeze_last_layer_steps:
        bare.student.head.prototypes.grad = None
    optimizer.step()
    optimizer.zero_grad()
    bare.update_teacher(momentum=sched.momentum[step])
    return loss


def _save_checkpoint(accelerator, s: PretrainSettings, step: int, per_epoch: int, history, losses) -> None:
    state = {"history": history, "losses": losses, "settings": s.to_dict(), "completed_steps": step}
    state.update(zip(("epoch", "batches_in_epoch"), divmod(step, per_epoch)))
    save_checkpoint(accelerator, s.output_dir, step, state, keep=s.checkpoints_total_limit)


def _save_results(accelerator, s: PretrainSettings, bare, data, results: dict, start: float) -> None:
    """On the main process: the teacher's backbone (``save_pretrained``), its linear-probe accuracy, the results."""
    if not accelerator.is_main_process:
        return
    bare.teacher.backbone.save_pretrained(os.path.join(s.output_dir, BACKBONE_DIR))
    if s.probe:
        results["probe_accuracy"] = probe_accuracy(bare.teacher.backbone, data)
    results["runtime_s"] = time.time() - start
    with open(os.path.join(s.output_dir, RESULTS_FILE), "w") as fh:
        json.dump(results, fh, indent=1)


def _pretrain(s: PretrainSettings, accelerator, checkpoint: str | None, start: float) -> dict:
    """The run in its claimed folder: build, resume from ``checkpoint`` (None: from scratch), train, save."""
    from accelerate.utils import set_seed

    set_seed(s.seed)
    run, data = _build(s, accelerator)
    sched = _schedules(s)
    train_x, _, eval_x, _ = data
    crops = MultiCrop(tuple(train_x.shape[-2:]), s.n_global, s.n_local, s.global_scale, s.local_scale, hflip=s.hflip)
    if s.batch_size > len(train_x):
        raise ValueError(f"batch_size: {s.batch_size} exceeds the {len(train_x)} training images")
    per_epoch = len(train_x) // s.batch_size
    held_out = eval_x[: s.track_samples].to(accelerator.device)
    step, history, losses = _resume(accelerator, s, checkpoint)
    T = s.max_train_steps

    def track(at: int) -> None:
        if s.track_every and (at % s.track_every == 0 or at == T) and not (history and history[-1]["step"] == at):
            history.append({"step": at, **teacher_statistics(run.bare, held_out, s.eps)})

    track(step)
    run.model.train()
    while step < T:
        views = _views(s, crops, train_x, step, accelerator.device)
        losses.append(_optimizer_step(s, run, views, step, sched))
        step += 1
        track(step)
        if s.checkpointing_steps and step % s.checkpointing_steps == 0 and step < T:
            _save_checkpoint(accelerator, s, step, per_epoch, history, losses)
    results = {"settings": s.to_dict(), "steps": step, "losses": losses, "history": history}
    results["resumed_from"] = checkpoint
    _save_results(accelerator, s, run.bare, data, results, start)
    return results


__all__ = [
    "pretrain",
    "build_backbone",
    "digits_pixel_values",
    "probe_accuracy",
    "teacher_statistics",
    "effective_rank",
]
