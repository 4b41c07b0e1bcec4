"""Throughput and peak memory of the hf-tdiag trainer's step, plain vs. SRR-regularised, side by side.

One step is exactly what ``hf_tdiag.training.train`` does per batch: ``accelerator.accumulate`` +
``compute_loss`` (cross-entropy, or cross-entropy + β·SRR(Z^ℓ; U^ℓ) of one layer, the trainer's default `last`) + backward +
gradient clipping + AdamW + LR schedule, under Accelerate's mixed precision, on synthetic images from a
DataLoader. For each preset the plain step is the baseline and the SRR step is timed next to it
(interleaved rounds); the script prints images/s, ms/step, peak memory and the SRR/plain ratio.

    python benchmarks/bench_train.py                    # CPU: CRATE-tiny and CRATE-base at 64 px, batch 4
    python benchmarks/bench_train.py --gpu              # CUDA: 224 px, batch 64, bf16 (the issue's setting)

Results go to ``benchmarks/results/bench_train_<cpu|gpu>.json`` with the machine they ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification  # noqa: E402
from hf_tdiag.training.args import make_args  # noqa: E402
from hf_tdiag.training.loop import compute_loss  # noqa: E402
from hf_tdiag.training.optim import build_optimizer  # noqa: E402


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Runner:
    """A model prepared by Accelerate with its optimizer, scheduler and a synthetic DataLoader."""

    def __init__(self, accelerator, preset, cli, srr_weight):
        from transformers import get_scheduler

        self.accelerator = accelerator
        self.args = make_args(
            output_dir="unused", srr_weight=srr_weight, srr_layer=cli.srr_layer, per_device_train_batch_size=cli.batch
        )
        config = CrateConfig.from_preset(preset, image_size=cli.image_size, num_labels=1000)
        torch.manual_seed(0)
        model = CrateForImageClassification(config)
        self.num_parameters = sum(p.numel() for p in model.parameters())
        n = cli.batch * (cli.steps + cli.warmup) * cli.rounds
        images = torch.randn(n, 3, cli.image_size, cli.image_size)
        labels = torch.randint(0, 1000, (n,))
        dataset = [{"pixel_values": images[i], "labels": labels[i]} for i in range(n)]
        loader = torch.utils.data.DataLoader(dataset, batch_size=cli.batch, shuffle=False)
        optimizer = build_optimizer(model, "adamw", 1e-4, 0.05)
        scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=0, num_training_steps=10_000)
        self.model, self.optimizer, self.loader, self.scheduler = accelerator.prepare(
            model, optimizer, loader, scheduler
        )
        self.unwrapped = accelerator.unwrap_model(self.model)
        self.batches = iter(self.loader)
        self.step_index = 0

    def step(self):
        acc, model = self.accelerator, self.model
        batch = next(self.batches)
        with acc.accumulate(model):
            loss, _, _ = compute_loss(model, self.unwrapped, batch, self.args, self.step_index)
            acc.backward(loss)
            if acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), 1.0)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
        self.step_index += 1

    def run(self, steps):
        device = self.accelerator.device
        _sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        _sync(device)
        return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", action="store_true", help="224 px, batch 64, bf16 on CUDA")
    parser.add_argument("--presets", default="crate-tiny,crate-base")
    parser.add_argument("--image_size", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--mixed_precision", default=None, choices=("no", "bf16", "fp16"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--srr-layer",
        "--srr_layer",
        dest="srr_layer",
        default="last",
        help="the regularised layer, as the trainer's --srr-layer (default last = Z^L)",
    )
    parser.add_argument("--output", default=None)
    cli = parser.parse_args(argv)
    gpu = cli.gpu
    if gpu and not torch.cuda.is_available():
        parser.error("--gpu: CUDA is not available")
    cli.image_size = cli.image_size or (224 if gpu else 64)
    cli.batch = cli.batch or (64 if gpu else 4)
    cli.steps = cli.steps or (20 if gpu else 2)
    cli.rounds = cli.rounds or 3
    cli.mixed_precision = cli.mixed_precision or ("bf16" if gpu else "no")
    if cli.threads:
        torch.set_num_threads(cli.threads)

    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision=cli.mixed_precision, cpu=not gpu)
    device = accelerator.device
    rows = []
    for preset in [p.strip() for p in cli.presets.split(",") if p.strip()]:
        runners = {}
        for name, weight in (("plain", 0.0), ("srr", 0.1)):
            runners[name] = Runner(accelerator, preset, cli, weight)
        times = {name: [] for name in runners}
        peaks = {}
        for runner in runners.values():
            runner.run(cli.warmup)
        for _ in range(cli.rounds):  # interleave to share machine noise
            for name, runner in runners.items():
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                times[name].append(runner.run(cli.steps))
                if device.type == "cuda":
                    peaks[name] = max(peaks.get(name, 0), torch.cuda.max_memory_allocated(device))
        for name, runner in runners.items():
            best = min(times[name])
            row = {
                "preset": preset,
                "step": f"CE + 0.1*SRR(layer {cli.srr_layer})" if name == "srr" else "CE",
                "num_parameters": runner.num_parameters,
                "images_per_s": cli.batch * cli.steps / best,
                "ms_per_step": 1000 * best / cli.steps,
                "ms_per_step_median": 1000 * statistics.median(times[name]) / cli.steps,
            }
            if device.type == "cuda":
                row["peak_memory_gib"] = peaks[name] / 2**30
            rows.append(row)
        plain, srr = rows[-2], rows[-1]
        srr["srr_over_plain_time"] = srr["ms_per_step"] / plain["ms_per_step"]
        print(
            f"{preset:11s} {plain['num_parameters'] / 1e6:6.1f}M params | plain {plain['images_per_s']:8.1f} img/s "
            f"{plain['ms_per_step']:8.1f} ms/step | +SRR {srr['images_per_s']:8.1f} img/s {srr['ms_per_step']:8.1f} "
            f"ms/step | SRR/plain time {srr['srr_over_plain_time']:.2f}x"
            + (
                f" | peak {plain['peak_memory_gib']:.2f} / {srr['peak_memory_gib']:.2f} GiB"
                if device.type == "cuda"
                else ""
            ),
            flush=True,
        )
        del runners
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result = {
        "benchmark": "bench_train",
        "settings": {
            "image_size": cli.image_size,
            "batch": cli.batch,
            "steps": cli.steps,
            "rounds": cli.rounds,
            "mixed_precision": cli.mixed_precision,
            "data": "synthetic N(0,1) images, 1000 classes",
        },
        "rows": rows,
        "process_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        },
    }
    out = cli.output or os.path.join(ROOT, "benchmarks", "results", f"bench_train_{'gpu' if gpu else 'cpu'}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
