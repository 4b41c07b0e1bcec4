"""All-layer sparse rate reduction of a CRATE-base-sized model: ours vs the token-side reference.

Reference (the official CRATE measurement style): every log-determinant on the
token side, ``logdet(I_N + c·A Aᵀ)`` with ``N×N`` matrices (one per head for Rᶜ),
via ``torch.logdet``. Ours: the smaller Gram side (here ``p×p`` for Rᶜ) with a
batched Cholesky, head projections computed once per state in one matmul (or
reused from the forward pass), as in ``hf_tdiag.probes.srr``. Both in float64,
same process, same inputs; the values are checked to agree.

Reported (median of ``--repeats``):
  * ``rc_logdets``: only the Rᶜ log-determinants, from given head projections,
  * ``rc``: Rᶜ from the token states (projections + Grams + log-determinants),
  * ``whole``: R, Rᶜ and sparsity at Z^ℓ and Z^{ℓ+½} for all layers from the token states,
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
from hf_tdiag.measures.coding_rate import head_projections, logdet_identity_plus_gram, srr_terms
from hf_tdiag.probes.subspaces import subspaces
from hf_tdiag.probes.token_states import token_states


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(fn, device, repeats):
    fn()  # warm-up
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


# ---------------------------------------------------------------------------
# token-side reference (N x N log-determinants, torch.logdet), float64
# ---------------------------------------------------------------------------


def ref_logdet_token_side(A, scale):
    """logdet(I_N + scale·A Aᵀ) for A (..., N, m): always the N x N side."""
    N = A.shape[-2]
    eye = torch.eye(N, dtype=torch.float64, device=A.device)
    return torch.logdet(eye + scale * (A @ A.transpose(-1, -2)))


def ref_state_terms(Z, U, eps, lam):
    """R, Rc, sparsity of one state, token side: per head its own projection and N x N log-determinant.

    Same precision policy as ours: projections in float32 (float64 for float64 states), the rest in float64.
    """
    pdtype = torch.float64 if Z.dtype == torch.float64 else torch.float32
    Zp, Up = Z.to(pdtype), U.to(pdtype)
    Z = Z.to(torch.float64)
    N, d = Z.shape[-2], Z.shape[-1]
    K, _, p = U.shape
    R = 0.5 * ref_logdet_token_side(Z, d / (N * eps**2))
    Rc = 0
    for k in range(K):  # as the official code: one projection and one N x N logdet per head
        Rc = Rc + 0.5 * ref_logdet_token_side((Zp @ Up[k]).to(torch.float64), p / (N * eps**2))
    sp = (Z != 0).sum((-2, -1), dtype=torch.float64) / (N * d)
    return R, Rc, sp, Rc - R + lam * sp


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--variant", default="crate")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: stable timings on a shared machine; 0 keeps torch's default)")
    parser.add_argument("--output", default=None, help="JSON path (default benchmarks/results/bench_srr_<device>.json)")
    args = parser.parse_args(argv)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    eps, lam = 0.1, 1.0
    cfg = CrateConfig.from_preset("crate-base", variant=args.variant, num_labels=1000)
    model = CrateForImageClassification(cfg).to(device=device, dtype=dtype).eval()
    x = torch.randn(args.batch_size, 3, 224, 224, device=device, dtype=dtype)
    L, K, p, d = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
    U = [u.to(torch.float64) for u in subspaces(model, detach=True)]
    ts = token_states(model, x)
    states = [(i, Z) for i, Z in enumerate(ts.block_inputs)] + [(i, Z) for i, Z in enumerate(ts.mid_states)]
    N = ts.block_inputs[0].shape[1]
    print(f"CRATE-base sized: L={L} d={d} K={K} p={p} N={N} batch={args.batch_size} device={device} dtype={args.dtype}")
    results = {}

    # 1) Rc log-determinants only, from given head projections (all layers, both states)
    projs = [head_projections(Z, U[i]).double() for i, Z in states]  # (B, K, N, p) each, float64
    c = p / (N * eps**2)

    def ours_rc_logdets():
        return [logdet_identity_plus_gram(A, c) for A in projs]

    def ref_rc_logdets():
        return [ref_logdet_token_side(A, c) for A in projs]

    # 2) Rc from the token states; 3) the whole measure
    def ours_rc():
        return [0.5 * logdet_identity_plus_gram(head_projections(Z, U[i]), c).sum(-1) for i, Z in states]

    def ref_rc():
        return [ref_state_terms(Z, U[i], eps, lam)[1] for i, Z in states]

    def ours_whole():
        return [srr_terms(Z, U[i], eps=eps, lam=lam)["srr"] for i, Z in states]

    def ref_whole():
        return [ref_state_terms(Z, U[i], eps, lam)[3] for i, Z in states]

    for name, ours, ref in (
        ("rc_logdets", ours_rc_logdets, ref_rc_logdets),
        ("rc", ours_rc, ref_rc),
        ("whole", ours_whole, ref_whole),
    ):
        t_ours, v_ours = timeit(ours, device, args.repeats)
        t_ref, v_ref = timeit(ref, device, args.repeats)
        err = max(float(((a - b).abs() / b.abs().clamp_min(1.0)).max()) for a, b in zip(v_ours, v_ref))
        results[name] = {"ours_s": t_ours, "reference_s": t_ref, "speedup": t_ref / t_ours, "max_rel_diff": err}
        print(f"{name:12s} ours {t_ours * 1e3:9.1f} ms   reference {t_ref * 1e3:9.1f} ms   speedup {t_ref / t_ours:6.2f}x   max rel diff {err:.1e}")

    # 4) end to end: layer_srr (forward + full measure at Z^l and Z^{l+1/2}) vs the bare forward pass
    def bare_forward():
        with torch.no_grad():
            return model(pixel_values=x).logits

    def pipeline():
        return layer_srr(model, x, batch_size=args.batch_size, progress=False)

    def pipeline_ln():
        return layer_srr(model, x, batch_size=args.batch_size, progress=False, apply_layernorm=True)

    t_fwd, _ = timeit(bare_forward, device, args.repeats)
    t_pipe, _ = timeit(pipeline, device, args.repeats)
    t_pipe_ln, _ = timeit(pipeline_ln, device, args.repeats)
    results["pipeline"] = {
        "forward_s": t_fwd,
        "layer_srr_s": t_pipe,
        "ratio_to_forward": t_pipe / t_fwd,
        "layer_srr_layernorm_reuse_s": t_pipe_ln,
        "ratio_to_forward_layernorm_reuse": t_pipe_ln / t_fwd,
    }
    print(f"pipeline     forward {t_fwd * 1e3:.1f} ms, layer_srr {t_pipe * 1e3:.1f} ms ({t_pipe / t_fwd:.2f}x forward), "
          f"with LayerNorm + projection reuse {t_pipe_ln * 1e3:.1f} ms ({t_pipe_ln / t_fwd:.2f}x)")

    record = {
        "benchmark": "bench_srr",
        "description": "all-layer SRR of a CRATE-base-sized model (R, Rc, sparsity at Z^l and Z^{l+1/2}); "
        "ours = smaller-side Gram + batched Cholesky; reference = token-side N x N torch.logdet per head (official style)",
        "settings": {"L": L, "d": d, "K": K, "p": p, "N": N, "batch_size": args.batch_size, "eps": eps, "lam": lam,
                     "model_dtype": args.dtype, "measure_dtype": "float64", "repeats": args.repeats, "variant": args.variant},
        "results": results,
        "targets": {"rc_logdets_speedup_min": 4.0, "whole_speedup_min": 2.0},
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        },
    }
    out = args.output or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"bench_srr_{device.type}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=2)
        fh.write("\n")
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main()
