"""Training steps of the white-box families against ViT (the GPU suite's ``whitebox_step`` section).

One step = forward + cross-entropy + backward + AdamW step on random 224 px images under bf16 autocast (float32
on a CPU smoke run). Pairs at matched scale: CRATE-α-B/16 against ViT-B/16, ToST-S/12 (p16) against ViT-S/16.
Reported per model: parameters, ms/step, images/s and (CUDA) peak memory; the ratio of each white-box model's
images/s to its ViT's.

    PYTHONPATH=. python benchmarks/bench_whitebox_step.py --smoke      # tiny sizes on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch
import torch.nn.functional as F


def _models(smoke: bool) -> dict:
    from transformers import ViTConfig, ViTForImageClassification

    import hf_tdiag  # noqa: F401
    from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification
    from hf_tdiag.models.tost import TostConfig, TostForImageClassification

    if smoke:
        tiny = dict(image_size=16, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2)
        return {
            "crate-alpha": lambda: CrateAlphaForImageClassification(CrateAlphaConfig(**tiny, num_labels=10)),
            "vit-b": lambda: ViTForImageClassification(ViTConfig(**tiny, intermediate_size=64, num_labels=10)),
            "tost": lambda: TostForImageClassification(TostConfig(**tiny, num_labels=10)),
            "vit-s": lambda: ViTForImageClassification(ViTConfig(**tiny, intermediate_size=64, num_labels=10)),
        }
    vit = dict(image_size=224, patch_size=16, num_labels=1000)
    return {
        "crate-alpha": lambda: CrateAlphaForImageClassification(
            CrateAlphaConfig.from_preset("crate-alpha-base-16", num_labels=1000)
        ),
        "vit-b": lambda: ViTForImageClassification(ViTConfig(**vit, hidden_size=768, num_hidden_layers=12,
                                                             num_attention_heads=12, intermediate_size=3072)),
        "tost": lambda: TostForImageClassification(TostConfig.from_preset("tost-small-12-p16", num_labels=1000)),
        "vit-s": lambda: ViTForImageClassification(ViTConfig(**vit, hidden_size=384, num_hidden_layers=12,
                                                             num_attention_heads=6, intermediate_size=1536)),
    }  # fmt: skip


def _time_steps(model, device, batch: int, image: int, steps: int, warmup: int) -> dict:
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, 3, image, image, device=device)
    y = torch.randint(0, model.config.num_labels, (batch,), device=device)
    cast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    times = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(steps + warmup):
        start = time.perf_counter()
        with cast:
            loss = F.cross_entropy(model(pixel_values=x).logits.float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    ms = 1000 * statistics.median(times)
    out = {"params": sum(p.numel() for p in model.parameters()), "ms_per_step": ms, "images_per_s": batch / ms * 1000}
    if device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def run(device: torch.device, smoke: bool) -> dict:
    """The section's record: per model its step numbers, and the white-box / ViT throughput ratios."""
    batch, image, steps, warmup = (2, 16, 1, 0) if smoke else (64, 224, 5, 2)
    results = {}
    for name, build in _models(smoke).items():
        model = build()
        results[name] = _time_steps(model, device, batch, image, steps, warmup)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    ratios = {
        "crate_alpha_over_vit_b": results["crate-alpha"]["images_per_s"] / results["vit-b"]["images_per_s"],
        "tost_over_vit_s": results["tost"]["images_per_s"] / results["vit-s"]["images_per_s"],
    }
    return {"batch": batch, "image_size": image, "precision": "bf16-autocast" if device.type == "cuda" else "fp32",
            "models": results, "throughput_ratios": ratios}  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    print(json.dumps(run(device, args.smoke), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
