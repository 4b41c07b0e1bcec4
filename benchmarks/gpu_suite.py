"""Every GPU target of hf-tdiag in one run, one JSON: run it the moment a GPU machine is available.

Sections (each timed side by side against its baseline in this process; a failing section is recorded
with its traceback and the others still run):

* ``machine``      GPU, driver-visible memory, torch/transformers versions, a bf16 matmul ceiling check.
* ``train_step``   CRATE-B/16 training step (forward + CE + backward + AdamW, bf16 autocast, 224 px) against
                   ViT-S/16 and ViT-B/16, with CRATE on the eager, SDPA and flex_attention interfaces and SDPA
                   forced to its FlashAttention kernel (``benchmarks/bench_crate.py --gpu-preset``).
* ``srr_pass``     ``layer_srr`` over 10,000 images on CRATE-B/16 against the bare forward pass over the same
                   images in the same batches (the measure's overhead on top of inference).
* ``srr_profile``  one 250-image batch of that pass taken apart: forward with hooks vs the measure, the op
                   table (torch.profiler), and Gram/Cholesky precision variants on the real state shapes.
* ``trainer_step`` the hf-tdiag trainer's step under Accelerate, plain vs SRR-regularised
                   (``benchmarks/bench_train.py --gpu``).
* ``whitebox_step`` CRATE-α-B/16 against ViT-B/16 and ToST-S/12 against ViT-S/16 training steps, bf16 autocast
                   (``benchmarks/bench_whitebox_step.py``).

Free of ``datasets`` and ``evaluate`` (the GPU machine's Python has torch, transformers and accelerate);
run from the repository root without installing the package::

    PYTHONPATH=. python benchmarks/gpu_suite.py                 # all sections, ~5 min on an H200
    PYTHONPATH=. python benchmarks/gpu_suite.py --smoke         # tiny sizes on the CPU: checks the script

The record goes to ``benchmarks/results/gpu_suite.json`` (``--output``), rewritten atomically after every
section so that a run stopped part-way keeps what finished.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def write_record(record: dict, path: str) -> None:
    """Write ``record`` as JSON to ``path`` atomically (temp file + rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)


def machine_section(device: torch.device, smoke: bool) -> dict:
    import transformers

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
    }
    try:
        import accelerate

        info["accelerate"] = accelerate.__version__
    except ImportError:
        info["accelerate"] = None
    if device.type != "cuda":
        return info
    props = torch.cuda.get_device_properties(device)
    info.update(
        gpu=props.name,
        gpu_memory_gib=props.total_memory / 2**30,
        multiprocessors=props.multi_processor_count,
        cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version(),
    )
    # the ceiling the training steps are compared with: a large bf16 product (10 timed after 3 warm-ups)
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    _sync(device)
    info["bf16_matmul_tflops"] = 10 * 2 * n**3 / (time.perf_counter() - t0) / 1e12
    del a, b
    torch.cuda.empty_cache()
    return info


def train_step_section(device: torch.device, smoke: bool, out_dir: str) -> dict:
    import bench_crate

    path = os.path.join(out_dir, "bench_crate_gpu_suite.json")
    if smoke:
        argv = [
            "--hidden-size",
            "32",
            "--layers",
            "2",
            "--heads",
            "2",
            "--image-size",
            "16",
            "--patch-size",
            "8",
            "--batch",
            "2",
            "--steps",
            "1",
            "--rounds",
            "1",
            "--device",
            device.type,
            "--output",
            path,
        ]
    else:
        argv = ["--gpu-preset", "--attention-variants", "--output", path]
    return bench_crate.run(argv)


def srr_pass_section(device: torch.device, smoke: bool) -> dict:
    """``layer_srr`` over ``num_images`` images vs the bare forward over the same batches."""
    from hf_tdiag import CrateConfig, CrateForImageClassification, layer_srr

    if smoke:
        cfg = CrateConfig(
            image_size=16,
            patch_size=8,
            num_channels=3,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_labels=10,
        )
        num_images, batch_size, dtype = 16, 8, torch.float32
    else:
        cfg = CrateConfig.from_preset("crate-base", num_labels=1000)
        num_images, batch_size, dtype = 10_000, 250, torch.bfloat16
    torch.manual_seed(0)
    model = CrateForImageClassification(cfg).to(device=device, dtype=dtype).eval()
    g = torch.Generator(device="cpu").manual_seed(0)
    size = cfg.image_size if isinstance(cfg.image_size, int) else cfg.image_size[0]
    images = torch.randn(num_images, 3, size, size, generator=g).to(device=device, dtype=dtype)

    def bare_forward():
        with torch.no_grad():
            for start in range(0, num_images, batch_size):
                model(pixel_values=images[start : start + batch_size])

    def srr_pass():
        return layer_srr(model, images, batch_size=batch_size, progress=False)

    bare_forward()  # warm-up (kernels, allocator)
    layer_srr(model, images[: 2 * batch_size], batch_size=batch_size, progress=False)
    times = {"forward_s": [], "layer_srr_s": []}
    report = None
    for _ in range(1 if smoke else 2):  # interleaved rounds
        _sync(device)
        t0 = time.perf_counter()
        bare_forward()
        _sync(device)
        times["forward_s"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        report = srr_pass()
        _sync(device)
        times["layer_srr_s"].append(time.perf_counter() - t0)
    fwd, srr = statistics.median(times["forward_s"]), statistics.median(times["layer_srr_s"])
    summary = report.summary() if hasattr(report, "summary") else {}
    result = {
        "model": "CRATE-B/16" if not smoke else "tiny CRATE",
        "num_images": num_images,
        "batch_size": batch_size,
        "model_dtype": str(dtype).replace("torch.", ""),
        "measure_dtype": "float64",
        "forward_s": fwd,
        "layer_srr_s": srr,
        "rounds": times,
        "ratio_layer_srr_to_forward": srr / fwd,
        "images_per_s_forward": num_images / fwd,
        "images_per_s_layer_srr": num_images / srr,
        "summary": {k: v for k, v in summary.items() if isinstance(v, (int, float, str))},
    }
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    print(
        f"srr_pass: forward {fwd:.2f} s, layer_srr {srr:.2f} s over {num_images} images ({srr / fwd:.2f}x forward)",
        flush=True,
    )
    return result  # the caller empties the CUDA cache after each section


def _timed(fn, device, repeats=3):
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _gram_logdet(A: torch.Tensor, scale: float, gram_dtype, chol_dtype) -> torch.Tensor:
    """logdet(I + scale·Gram) on the smaller side, Gram in ``gram_dtype``, Cholesky in ``chol_dtype``."""
    A = A.to(gram_dtype)
    n, m = A.shape[-2], A.shape[-1]
    gram = A.transpose(-2, -1) @ A if n >= m else A @ A.transpose(-2, -1)
    mat = torch.eye(gram.shape[-1], device=A.device, dtype=chol_dtype) + scale * gram.to(chol_dtype)
    L = torch.linalg.cholesky_ex(mat)[0]
    return 2.0 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)


def srr_profile_section(device: torch.device, smoke: bool) -> dict:
    """Where one ``layer_srr`` batch spends its time: forward with hooks vs the measure, op tables, Gram precisions."""
    from torch.profiler import ProfilerActivity, profile

    from hf_tdiag import CrateConfig, CrateForImageClassification
    from hf_tdiag.diagnostics.srr import batch_srr_values
    from hf_tdiag.probes.describe import describe
    from hf_tdiag.probes.subspaces import subspaces
    from hf_tdiag.probes.token_states import token_states

    if smoke:
        cfg = CrateConfig(
            image_size=16,
            patch_size=8,
            num_channels=3,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_labels=10,
        )
        batch, dtype = 8, torch.float32
    else:
        cfg = CrateConfig.from_preset("crate-base", num_labels=1000)
        batch, dtype = 250, torch.bfloat16
    torch.manual_seed(0)
    model = CrateForImageClassification(cfg).to(device=device, dtype=dtype).eval()
    size = cfg.image_size if isinstance(cfg.image_size, int) else cfg.image_size[0]
    x = torch.randn(batch, 3, size, size, device=device, dtype=dtype)
    arch = describe(model)
    U = [u.to(torch.float64) for u in subspaces(model, "query", detach=True)]

    def bare():
        with torch.no_grad():
            model(pixel_values=x)

    def states_only():
        return token_states(model, x, projection_source="query", arch=arch)

    def whole():
        return batch_srr_values(model, x, arch=arch, U=U)

    result = {
        "batch": batch,
        "model_dtype": str(dtype).replace("torch.", ""),
        "forward_s": _timed(bare, device),
        "token_states_s": _timed(states_only, device),
        "batch_srr_values_s": _timed(whole, device),
    }
    result["measure_only_s"] = result["batch_srr_values_s"] - result["token_states_s"]
    # Gram + Cholesky precision variants on the real state shapes of this batch (R on Z, Rc on the projections)
    ts = states_only()
    Z = ts.block_inputs[len(ts.block_inputs) // 2].to(torch.float32)
    A = ts.projections[len(ts.block_inputs) // 2] if ts.projections else None
    N, d = Z.shape[-2], Z.shape[-1]
    variants = {
        "gram64_chol64": (torch.float64, torch.float64),
        "gram32_chol64": (torch.float32, torch.float64),
        "gram32_chol32": (torch.float32, torch.float32),
    }
    grams = {}
    for name, (gd, cd) in variants.items():
        grams[name] = {"R_s": _timed(lambda gd=gd, cd=cd: _gram_logdet(Z, d / (N * 0.01), gd, cd), device)}
        if A is not None:
            p = A.shape[-1]
            grams[name]["Rc_s"] = _timed(lambda gd=gd, cd=cd, p=p: _gram_logdet(A, p / (N * 0.01), gd, cd), device)
        ref = _gram_logdet(Z, d / (N * 0.01), torch.float64, torch.float64)
        val = _gram_logdet(Z, d / (N * 0.01), gd, cd).to(torch.float64)
        grams[name]["R_max_rel_diff"] = float(((val - ref).abs() / ref.abs().clamp_min(1.0)).max())
    result["gram_precision_per_state"] = grams
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        whole()
        _sync(device)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    result["profile_by_device_time"] = prof.key_averages().table(sort_by=sort, row_limit=20, max_name_column_width=60)
    result["profile_by_cpu_time"] = prof.key_averages().table(
        sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60
    )
    print(result["profile_by_device_time"], flush=True)
    print({k: v for k, v in result.items() if not k.startswith("profile")}, flush=True)
    return result


def trainer_step_section(device: torch.device, smoke: bool, out_dir: str) -> dict:
    import bench_train

    path = os.path.join(out_dir, "bench_train_gpu_suite.json")
    if smoke:
        argv = [
            "--presets",
            "crate-tiny",
            "--image_size",
            "32",
            "--batch",
            "2",
            "--steps",
            "1",
            "--rounds",
            "1",
            "--output",
            path,
        ]
    else:
        argv = ["--gpu", "--output", path]
    return bench_train.main(argv)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes on whatever device there is (checks the script)"
    )
    parser.add_argument(
        "--sections",
        default="machine,train_step,srr_pass,srr_profile,trainer_step,whitebox_step",
        help="comma-separated subset of the sections",
    )
    parser.add_argument("--output", default=None, help="JSON path (default benchmarks/results/gpu_suite.json)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        parser.error("no CUDA device: the suite measures GPU targets (use --smoke to check the script on a CPU)")
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    out = args.output or os.path.join(HERE, "results", "gpu_suite.json")
    scratch = tempfile.mkdtemp(prefix="gpu_suite_")
    record = {
        "benchmark": "gpu_suite",
        "smoke": args.smoke,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sections": {},
        "section_seconds": {},
        "errors": {},
    }
    runners = {
        "machine": lambda: machine_section(device, args.smoke),
        "train_step": lambda: train_step_section(device, args.smoke, scratch),
        "srr_pass": lambda: srr_pass_section(device, args.smoke),
        "srr_profile": lambda: srr_profile_section(device, args.smoke),
        "trainer_step": lambda: trainer_step_section(device, args.smoke, scratch),
        "whitebox_step": lambda: __import__("bench_whitebox_step").run(device, args.smoke),
    }
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(runners))
    if unknown:
        parser.error(f"--sections: unknown {unknown}; choose from {sorted(runners)}")
    for name in wanted:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            record["sections"][name] = runners[name]()
        except Exception:
            record["errors"][name] = traceback.format_exc()[-4000:]
            print(record["errors"][name], flush=True)
        record["section_seconds"][name] = time.perf_counter() - t0
        if cuda:
            torch.cuda.empty_cache()
        write_record(record, out)
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main()
