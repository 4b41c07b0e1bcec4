"""Whole per-layer sparse rate reduction of a CRATE-base-sized model: ours vs token-side references.

References (the official CRATE measurement style, ``vis_utils/coding_rate.py``): every log-determinant on
the token side, ``logdet(I_N + c·A Aᵀ)`` with ``N×N`` matrices (one per head for Rᶜ), via ``torch.logdet``,
each state measured on its own, in

  * **float32** — the official code's precision (its ``CodingRate`` runs in the model's float32), and
  * **float64**.

Ours: :func:`hf_tdiag.diagnostics.srr.measure_token_states` — what ``layer_srr`` measures per batch: R, Rᶜ,
sparsity and SRR of every block's output ``Z^ℓ``, input ``Z^{ℓ−1}`` and mid state ``Z^{ℓ−½}`` with ``U^ℓ``
(plus the embeddings), on the smaller Gram side with a batched Cholesky, R and sparsity paid once per distinct
tensor, with ``precision="auto"`` (float32 Gram matrices where the condition check allows, float64 Cholesky)
and with ``precision="float64"``. Same process, same token states (one forward pass), values checked to agree.

Reported (median of ``--repeats``):
  * ``rc_logdets``: only the Rᶜ log-determinants, from given head projections (float64 both sides),
  * ``whole_vs_float32_token_side`` / ``whole_vs_float64_token_side``: the whole measure, ours (auto),
  * ``whole_float64_vs_float64_token_side``: ours with ``precision="float64"``,
  * ``agreement``: max relative difference of every value (ours auto, ours float64, float32 reference)
    to the float64 reference,
  * ``pipeline``: ``layer_srr`` end to end (forward pass + measure) against the bare forward pass.

    python benchmarks/bench_srr.py [--batch-size 8] [--repeats 3] [--device cpu] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

from hf_tdiag import CrateConfig, CrateForImageClassification, layer_srr
from hf_tdiag.diagnostics.srr import measure_token_states
from hf_tdiag.measures.coding_rate import head_projections, logdet_identity_plus_gram
from hf_tdiag.probes.subspaces import subspaces
from hf_tdiag.probes.token_states import token_states


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCK = {"clock": "wall"}  # --clock cpu: process CPU time (a loaded shared machine inflates wall time unevenly)


def timeit(fn, device, repeats):
    fn()  # warm-up
    _sync(device)
    clock = time.process_time if CLOCK["clock"] == "cpu" else time.perf_counter
    times = []
    for _ in range(repeats):
        t0 = clock()
        out = fn()
        _sync(device)
        times.append(clock() - t0)
    return statistics.median(times), out


# ---------------------------------------------------------------------------
# token-side references (N x N log-determinants, torch.logdet), float32 or float64
# ---------------------------------------------------------------------------


def ref_logdet_token_side(A, scale):
    """logdet(I_N + scale·A Aᵀ) for A (..., N, m) in A's dtype: always the N x N side."""
    N = A.shape[-2]
    eye = torch.eye(N, dtype=A.dtype, device=A.device)
    return torch.logdet(eye + scale * (A @ A.transpose(-1, -2)))


def ref_state_terms(Z, U, eps, lam, dtype):
    """(B, 4) R, Rc, sparsity, SRR of one state, token side, in ``dtype``: per head its own projection and
    N x N log-determinant, as the official code loops."""
    Z, U = Z.to(dtype), U.to(dtype)
    N, d = Z.shape[-2], Z.shape[-1]
    K, _, p = U.shape
    R = 0.5 * ref_logdet_token_side(Z, d / (N * eps**2))
    Rc = 0
    for k in range(K):
        Rc = Rc + 0.5 * ref_logdet_token_side(Z @ U[k], p / (N * eps**2))
    sp = (Z != 0).sum((-2, -1), dtype=torch.float64) / (N * d)
    R, Rc = R.double(), Rc.double()
    return torch.stack([R, Rc, sp, Rc - R + lam * sp], -1)


def ref_whole(ts, U, eps, lam, dtype):
    """The same values as measure_token_states (outputs, inputs, mids; embeddings), each state on its own."""
    groups = [ts.block_outputs, ts.block_inputs, ts.mid_states]
    values = torch.stack(
        [torch.stack([ref_state_terms(Z, U[i], eps, lam, dtype) for i, Z in enumerate(g)], 1) for g in groups], 1
    )
    return values, values[:, 1, 0]  # the embeddings Z^0 are block 1's input: no extra work for the reference


def _max_rel(a, b):
    return max(float(((x - y).abs() / y.abs().clamp_min(1e-12)).max()) for x, y in zip(a, b))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--variant", default="crate")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: stable timings on a shared machine; 0 keeps torch's default)",
    )
    parser.add_argument("--skip-pipeline", action="store_true", help="skip the end-to-end layer_srr timing")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall (perf_counter) or cpu (process CPU time, for a loaded machine; one thread)",
    )
    parser.add_argument("--output", default=None, help="JSON path (default benchmarks/results/bench_srr_<device>.json)")
    args = parser.parse_args(argv)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    CLOCK["clock"] = args.clock
    torch.manual_seed(0)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    eps, lam = 0.1, 1.0
    cfg = CrateConfig.from_preset("crate-base", variant=args.variant, num_labels=1000)
    model = CrateForImageClassification(cfg).to(device=device, dtype=dtype).eval()
    x = torch.randn(args.batch_size, 3, 224, 224, device=device, dtype=dtype)
    L, K, p, d = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
    U32 = [u.to(torch.float32) for u in subspaces(model, detach=True)]  # float32 views of the qkv weights (layer_srr's)
    U = [u.to(torch.float64) for u in U32]
    ts = token_states(model, x)
    N = ts.block_inputs[0].shape[1]
    print(f"CRATE-base sized: L={L} d={d} K={K} p={p} N={N} batch={args.batch_size} device={device} dtype={args.dtype}")
    results = {}

    # 1) Rc log-determinants only, from given head projections (all layers, all states), float64 both sides
    states = list(enumerate(ts.block_outputs)) + list(enumerate(ts.block_inputs)) + list(enumerate(ts.mid_states))
    projs = [head_projections(Z, U[i]).double() for i, Z in states]
    c = p / (N * eps**2)
    t_ours, v_ours = timeit(lambda: [logdet_identity_plus_gram(A, c, "float64") for A in projs], device, args.repeats)
    t_ref, v_ref = timeit(lambda: [ref_logdet_token_side(A, c) for A in projs], device, args.repeats)
    results["rc_logdets"] = {
        "ours_s": t_ours,
        "reference_s": t_ref,
        "speedup": t_ref / t_ours,
        "max_rel_diff": _max_rel(v_ours, v_ref),
    }
    print(
        f"rc_logdets   ours {t_ours * 1e3:9.1f} ms   reference {t_ref * 1e3:9.1f} ms   speedup {t_ref / t_ours:6.2f}x"
    )

    # 2) the whole per-layer measure
    def ours(precision):
        Us = U if precision == "float64" else U32
        return lambda: measure_token_states(ts, Us, eps=eps, lam=lam, precision=precision)

    t_auto, v_auto = timeit(ours("auto"), device, args.repeats)
    t_64, v_64 = timeit(ours("float64"), device, args.repeats)
    t_r32, v_r32 = timeit(lambda: ref_whole(ts, U32, eps, lam, torch.float32), device, args.repeats)
    t_r64, v_r64 = timeit(lambda: ref_whole(ts, U, eps, lam, torch.float64), device, args.repeats)
    results["whole_vs_float32_token_side"] = {"ours_s": t_auto, "reference_s": t_r32, "speedup": t_r32 / t_auto}
    results["whole_vs_float64_token_side"] = {"ours_s": t_auto, "reference_s": t_r64, "speedup": t_r64 / t_auto}
    results["whole_float64_vs_float64_token_side"] = {"ours_s": t_64, "reference_s": t_r64, "speedup": t_r64 / t_64}
    results["whole_float64_vs_float32_token_side"] = {"ours_s": t_64, "reference_s": t_r32, "speedup": t_r32 / t_64}
    results["agreement"] = {
        "ours_auto_vs_float64_reference_max_rel": _max_rel(v_auto, v_r64),
        "ours_float64_vs_float64_reference_max_rel": _max_rel(v_64, v_r64),
        "float32_reference_vs_float64_reference_max_rel": _max_rel(v_r32, v_r64),
    }
    for name in ("whole_vs_float32_token_side", "whole_vs_float64_token_side", "whole_float64_vs_float64_token_side"):
        r = results[name]
        print(
            f"{name:38s} ours {r['ours_s'] * 1e3:8.1f} ms   reference {r['reference_s'] * 1e3:8.1f} ms   "
            f"speedup {r['speedup']:5.2f}x"
        )
    print(
        "agreement (max relative difference to the float64 token-side reference): "
        + ", ".join(f"{k} {v:.1e}" for k, v in results["agreement"].items())
    )

    # 3) end to end: layer_srr (forward + full measure) vs the bare forward pass
    if not args.skip_pipeline:

        def bare_forward():
            with torch.no_grad():
                return model(pixel_values=x).logits

        t_fwd, _ = timeit(bare_forward, device, args.repeats)
        t_pipe, _ = timeit(
            lambda: layer_srr(model, x, batch_size=args.batch_size, progress=False), device, args.repeats
        )
        results["pipeline"] = {"forward_s": t_fwd, "layer_srr_s": t_pipe, "ratio_to_forward": t_pipe / t_fwd}
        print(
            f"pipeline     forward {t_fwd * 1e3:.1f} ms, layer_srr {t_pipe * 1e3:.1f} ms ({t_pipe / t_fwd:.2f}x forward)"
        )

    record = {
        "benchmark": "bench_srr",
        "description": "whole per-layer SRR of a CRATE-base-sized model (R, Rc, sparsity, SRR of every block's output, "
        "input and mid state with U^l, plus the embeddings); ours = measure_token_states (smaller-side Gram, batched "
        "float64 Cholesky, precision auto = float32 Gram where the condition check allows); references = token-side "
        "N x N torch.logdet per head and per state (official style) in float32 (official precision) and float64",
        "settings": {
            "L": L,
            "d": d,
            "K": K,
            "p": p,
            "N": N,
            "batch_size": args.batch_size,
            "eps": eps,
            "lam": lam,
            "model_dtype": args.dtype,
            "repeats": args.repeats,
            "variant": args.variant,
            "clock": args.clock,
        },
        "results": results,
        "targets": {
            "whole_vs_float32_token_side_speedup_min": 2.5,
            "whole_vs_float64_token_side_speedup_min": 2.0,
            "agreement_max_rel": 1e-5,
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
            "load_average_at_start": os.getloadavg(),
        },
    }
    out = args.output or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", f"bench_srr_{device.type}.json"
    )
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=2)
        fh.write("\n")
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main()
