"""Training-step throughput of CRATE against Transformers' ViT, side by side in one process.

One step = forward + cross-entropy + backward + AdamW step, on random images. For each model we report
images/s, ms/step and (on CUDA) peak memory and activation memory (peak during the step minus what is
allocated before it: weights + optimizer state). The ratio CRATE / ViT of images/s is printed.

    python benchmarks/bench_crate.py                       # small CPU default (< 2 min on 2 cores)
    python benchmarks/bench_crate.py --gpu-preset          # CRATE-base vs ViT-S/16 (and ViT-B/16), bf16, 224 px
    python benchmarks/bench_crate.py --hidden-size 384 --layers 12 --heads 6 --image-size 224 --patch-size 16 \
        --batch 64 --device cuda --precision bf16-autocast
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from transformers import ViTConfig, ViTForImageClassification  # noqa: E402

from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification  # noqa: E402


def build_crate(args, hidden, layers, heads, attn="sdpa"):
    cfg = CrateConfig(
        image_size=args.image_size,
        patch_size=args.patch_size,
        num_channels=3,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_labels=args.num_labels,
        variant=args.variant,
    )
    return CrateForImageClassification._from_config(cfg, attn_implementation=attn)


def build_vit(args, hidden, layers, heads, mlp_ratio=4):
    cfg = ViTConfig(
        image_size=args.image_size,
        patch_size=args.patch_size,
        num_channels=3,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=mlp_ratio * hidden,
        num_labels=args.num_labels,
    )
    return ViTForImageClassification._from_config(cfg, attn_implementation="sdpa")


def flash_only():
    """SDPA restricted to its FlashAttention kernel (errors where that kernel cannot run)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TrainingRunner:
    """One model + AdamW on a fixed random batch; ``run(steps)`` times that many training steps."""

    def __init__(self, model, args, device, context=None):
        self.args, self.device = args, device
        self.context = context or contextlib.nullcontext
        weight_dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
        before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        self.model = model.to(device=device, dtype=weight_dtype).train()
        if args.checkpointing:
            self.model.activation_checkpointing_enable()
        self.forward = torch.compile(self.model) if args.compile else self.model
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=device.type == "cuda")
        g = torch.Generator(device="cpu").manual_seed(0)
        self.x = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g).to(device, weight_dtype)
        self.y = torch.randint(0, args.num_labels, (args.batch,), generator=g).to(device)
        self.autocast = args.precision == "bf16-autocast"
        self.params_m = sum(p.numel() for p in self.model.parameters()) / 1e6
        for _ in range(max(1, args.warmup)):  # also allocates the optimizer state
            self.loss = self.step()
        _sync(device)
        # weights + optimizer state (+ the batch) of this model
        self.static_bytes = (torch.cuda.memory_allocated(device) - before) if device.type == "cuda" else 0
        self.wall, self.cpu, self.act_peak = [], [], 0

    def step(self):
        with self.context(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            logits = self.forward(pixel_values=self.x).logits
        loss = torch.nn.functional.cross_entropy(logits.float(), self.y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def run(self, steps: int) -> None:
        device = self.device
        _sync(device)
        if device.type == "cuda":
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        start, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            self.loss = self.step()
        _sync(device)
        self.wall.append((time.perf_counter() - start) / steps)
        self.cpu.append((time.process_time() - cpu0) / steps)
        if device.type == "cuda":
            self.act_peak = max(self.act_peak, torch.cuda.max_memory_allocated(device) - base)

    def summary(self) -> dict:
        wall = statistics.median(self.wall)
        out = {
            "images_per_s": self.args.batch / wall,
            "ms_per_step": 1000 * wall,
            "ms_per_step_rounds": [1000 * t for t in self.wall],
            "cpu_ms_per_step": 1000 * statistics.median(self.cpu),
            "params_m": self.params_m,
            "final_loss": float(self.loss.detach()),
        }
        if self.device.type == "cuda":
            gib = 2**30
            out.update(
                activation_memory_gib=self.act_peak / gib,
                static_memory_gib=self.static_bytes / gib,
                peak_memory_gib=(self.act_peak + self.static_bytes) / gib,
            )
        return out


def machine_info(device) -> dict:
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    import transformers

    info["transformers"] = transformers.__version__
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def run(argv=None) -> dict:
    """Parse ``argv``, time every contender, write the JSON record and return it."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden-size", type=int, default=192)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--patch-size", type=int, default=4)
    p.add_argument("--batch", type=int, default=None, help="default 16 (CPU) / 128 (--gpu-preset)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per round, default 2 (CPU) / 10 (--gpu-preset)")
    p.add_argument("--warmup", type=int, default=None, help="untimed warm-up steps, default 1 (CPU) / 3 (--gpu-preset)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (median reported), default 3")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--num-labels", type=int, default=10)
    p.add_argument("--variant", default="crate")
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16-autocast", "bf16"],
        default=None,
        help="default fp32 (CPU) / bf16-autocast (--gpu-preset)",
    )
    p.add_argument("--device", default=None, help="default cpu (cuda with --gpu-preset)")
    p.add_argument("--compile", action="store_true", help="torch.compile every model")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing for both models")
    p.add_argument("--no-eager", action="store_true", help="skip the CRATE eager-attention row")
    p.add_argument(
        "--attention-variants",
        action="store_true",
        help="with --gpu-preset: also CRATE with flex_attention and CRATE/ViT-B with SDPA forced to FlashAttention",
    )
    p.add_argument(
        "--gpu-preset",
        action="store_true",
        help="CRATE-base vs ViT-S/16 and ViT-B/16, 224 px, bf16 autocast, batch 128, on cuda",
    )
    p.add_argument("--output", default=None, help="JSON path (default benchmarks/results/bench_crate_<device>.json)")
    args = p.parse_args(argv)
    defaults = dict(batch=16, steps=2, warmup=1, rounds=3, precision="fp32", device="cpu")
    if args.gpu_preset:
        args.image_size, args.patch_size, args.num_labels = 224, 16, 1000
        defaults = dict(batch=128, steps=10, warmup=3, rounds=3, precision="bf16-autocast", device="cuda")
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but CUDA is not available")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    if args.gpu_preset:
        contenders = [
            ("crate-base (sdpa)", lambda: build_crate(args, 768, 12, 12)),
            ("vit-s16 (sdpa)", lambda: build_vit(args, 384, 12, 6)),
            ("vit-b16 (sdpa)", lambda: build_vit(args, 768, 12, 12)),
        ]
        if not args.no_eager:
            contenders.insert(1, ("crate-base (eager)", lambda: build_crate(args, 768, 12, 12, attn="eager")))
        if args.attention_variants:
            contenders += [
                ("crate-base (flex_attention)", lambda: build_crate(args, 768, 12, 12, attn="flex_attention")),
                ("crate-base (sdpa, flash kernel only)", lambda: build_crate(args, 768, 12, 12)),
                ("vit-b16 (sdpa, flash kernel only)", lambda: build_vit(args, 768, 12, 12)),
            ]
        baseline = "vit-s16 (sdpa)"
    else:
        h, L, K = args.hidden_size, args.layers, args.heads
        contenders = [(f"crate d={h} L={L} K={K} (sdpa)", lambda: build_crate(args, h, L, K))]
        if not args.no_eager:
            contenders.append((f"crate d={h} L={L} K={K} (eager)", lambda: build_crate(args, h, L, K, attn="eager")))
        contenders.append((f"vit d={h} L={L} K={K} (sdpa)", lambda: build_vit(args, h, L, K)))
        baseline = contenders[-1][0]

    runners, failed = {}, {}
    for name, build in contenders:
        torch.manual_seed(0)
        try:
            runners[name] = TrainingRunner(
                build(), args, device, context=flash_only if "flash kernel only" in name else None
            )
        except Exception as exc:  # an attention backend this machine cannot run: record it, time the others
            failed[name] = f"{type(exc).__name__}: {exc}"[:2000]
            print(f"{name}: failed ({failed[name][:200]})")
            if device.type == "cuda":
                torch.cuda.empty_cache()
    # interleave the contenders round by round so that load changes hit all of them alike; report medians
    for _ in range(args.rounds):
        for runner in runners.values():
            runner.run(args.steps)
    results = {name: runner.summary() for name, runner in runners.items()}
    for name, r in results.items():
        mem = (
            f"  act {r['activation_memory_gib']:.2f} GiB  peak {r['peak_memory_gib']:.2f} GiB"
            if "peak_memory_gib" in r
            else ""
        )
        print(
            f"{name:32s} {r['images_per_s']:9.1f} img/s  {r['ms_per_step']:8.1f} ms/step  {r['params_m']:7.2f}M params{mem}"
        )
    base = results[baseline]["images_per_s"]
    ratios = {name: r["images_per_s"] / base for name, r in results.items() if name != baseline}
    for name, ratio in ratios.items():
        print(f"ratio {name} / {baseline}: {ratio:.3f}x images/s")
    if args.gpu_preset:
        crate_act = results.get("crate-base (sdpa)", {}).get("activation_memory_gib")
        vitb_act = results.get("vit-b16 (sdpa)", {}).get("activation_memory_gib")
        if crate_act is not None and vitb_act:
            print(f"activation memory crate-base / vit-b16: {crate_act / vitb_act:.3f}")
    record = {
        "benchmark": "bench_crate",
        "description": "training step (forward + cross-entropy + backward + AdamW) on random images",
        "settings": {k: v for k, v in vars(args).items() if k != "output"},
        "baseline": baseline,
        "results": results,
        "ratio_images_per_s_vs_baseline": ratios,
        "failed": failed,
        "machine": machine_info(device),
    }
    out = args.output or os.path.join(
        ROOT, "benchmarks", "results", f"bench_crate_{device.type if device.type != 'cuda' else 'gpu'}.json"
    )
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=2)
    print(f"wrote {out}")
    return record


def main(argv=None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
