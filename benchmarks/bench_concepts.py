"""Semi-NMF fit time and quality: hf_tdiag vs the `overcomplete` library, side by side in one process.

Data: patch-token activations (layer 1 of 2) of a ViT (hidden size 384) trained in this script on
scikit-learn digits (8×8 images, 2×2 patches → 16 patches per image); the first 20,000 rows
(1,250 images × 16 patches) are factorized with 32 concepts and 200 multiplicative-update
iterations by both libraries (no early stopping). Reported: fit time (median of repeats,
alternating order), the ratio, and the reconstruction error ‖A − Â‖_F of each relative to the
rank-32 truncated-SVD optimum (Eckart–Young floor). Also the cost of one Gram-aligned fit
(200 MU + 100 refinement iterations of L_rec + μ L_gram) vs one classifier-supervised fit
(200 MU + 100 Adam iterations of L_rec + λ KL through the remaining block and the head).

overcomplete's package import needs timm/torchvision and ``matplotlib.cm.get_cmap``; this script
restores ``get_cmap`` from ``matplotlib.colormaps`` and imports only ``overcomplete.optimization``
(no timm/torchvision needed). If overcomplete is missing, a naive reference MU implementation
(the textbook Ding–Li–Jordan updates with pinv, random init) is timed instead.

Install overcomplete without its dependencies (a plain ``pip install overcomplete`` replaces the CPU torch
with a multi-GB CUDA build and pulls torchvision, which does not import beside it):

    .venv/bin/pip install --no-deps overcomplete einops
    .venv/bin/python benchmarks/bench_concepts.py [--threads 2] [--repeats 3] [--epochs 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import types

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hf_tdiag.measures.concepts import ClassifierSupervisedSemiNMF, SemiNMF, truncated_svd_error  # noqa: E402


def load_overcomplete_seminmf():
    """overcomplete.optimization.SemiNMF without the package's model/visualization imports."""
    import matplotlib
    import matplotlib.cm

    if not hasattr(matplotlib.cm, "get_cmap"):  # removed in matplotlib 3.9; overcomplete still calls it
        matplotlib.cm.get_cmap = lambda name=None, lut=None: matplotlib.colormaps[name]
    try:
        import importlib.util

        spec = importlib.util.find_spec("overcomplete")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None, None
    try:
        import overcomplete  # noqa: F401  (works when timm/torchvision are installed)
    except Exception:
        pkg = types.ModuleType("overcomplete")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["overcomplete"] = pkg
    mod = importlib.import_module("overcomplete.optimization.semi_nmf")
    from importlib.metadata import version

    return mod.SemiNMF, version("overcomplete")


def naive_reference_fit(A, k, iters, seed=0):
    """Textbook Semi-NMF MU (Ding, Li & Jordan 2010) with pinv and |Gaussian| init — the fallback baseline."""
    g = torch.Generator().manual_seed(seed)
    U = torch.randn(A.shape[0], k, generator=g).abs().to(A)
    for _ in range(iters):
        W = A.T @ U @ torch.linalg.pinv(U.T @ U)
        AW, WtW = A @ W, W.T @ W
        U = U * torch.sqrt(
            (AW.clamp(min=0) + U @ (-WtW).clamp(min=0)) / (((-AW).clamp(min=0) + U @ WtW.clamp(min=0)) + 1e-12)
        )
    W = A.T @ U @ torch.linalg.pinv(U.T @ U)
    return U, W.T


def train_vit(epochs: int, seed: int = 0):
    from sklearn.datasets import load_digits
    from transformers import ViTConfig, ViTForImageClassification

    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X, dtype=torch.float32).reshape(-1, 1, 8, 8) / 8 - 1
    y = torch.tensor(y)
    torch.manual_seed(seed)
    cfg = ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=384,
        num_hidden_layers=2,
        num_attention_heads=6,
        intermediate_size=768,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = ViTForImageClassification(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    n_train, bs = 1500, 64
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(n_train, generator=g)
        for i in range(0, n_train - bs + 1, bs):
            idx = perm[i : i + bs]
            loss = model(pixel_values=X[idx], labels=y[idx]).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        acc = float((model(pixel_values=X[n_train:]).logits.argmax(1) == y[n_train:]).float().mean())
    return model, X, acc


def _digit_labels():
    from sklearn.datasets import load_digits

    return load_digits().target


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--concepts", type=int, default=32)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--model", default=None, help="a saved digits ViT folder to use instead of training one")
    ap.add_argument("--save-model", default=None, help="save the ViT trained here to this folder")
    ap.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "results", "bench_concepts_cpu.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from hf_tdiag.probes.concept_model import layer_activations, suffix_runner

    if args.model:
        from transformers import ViTForImageClassification

        model = ViTForImageClassification.from_pretrained(args.model).eval()
        _, X, _ = train_vit(0)  # the digits tensors only
        with torch.no_grad():
            acc = float(
                (model(pixel_values=X[1500:]).logits.argmax(1) == torch.tensor(_digit_labels()[1500:])).float().mean()
            )
        t_train = 0.0
        source = f"layer-1 patch tokens of the ViT in {args.model}"
        print(f"loaded {args.model}, test accuracy {acc:.3f}")
    else:
        t_train, (model, X, acc) = timed(lambda: train_vit(args.epochs))
        source = (
            "layer-1 patch tokens of a ViT (hidden 384, 2 blocks, 6 heads, patch 2) trained in-script on "
            f"scikit-learn digits for {args.epochs} epochs"
        )
        print(f"trained ViT (d=384, 2 blocks) on digits in {t_train:.1f}s, test accuracy {acc:.3f}")
        if args.save_model:
            model.save_pretrained(args.save_model)
    acts = layer_activations(model, X, 1)
    n_img = args.rows // acts.patches.shape[1]
    A3 = acts.patches[:n_img].contiguous()
    A = A3.reshape(-1, A3.shape[-1])
    print(f"activations: {tuple(A.shape)} (layer 1 patch tokens of {n_img} images)")
    floor = truncated_svd_error(A, args.concepts)
    a_norm = float(A.double().norm())

    OC, oc_version = load_overcomplete_seminmf()
    baseline = (
        f"overcomplete {oc_version} SemiNMF(solver='mu', tol=0)"
        if OC
        else "naive reference MU (overcomplete unavailable)"
    )

    def ours():
        return SemiNMF(args.concepts, max_iter=args.iters, refine_iter=0, tol=0.0).fit(A)

    def theirs():
        if OC is None:
            return naive_reference_fit(A, args.concepts, args.iters)
        torch.manual_seed(0)
        m = OC(nb_concepts=args.concepts, solver="mu", tol=0.0, device="cpu")
        Z, D = m.fit(A, max_iter=args.iters)
        return Z, D

    t_ours, t_theirs = [], []
    for r in range(args.repeats):
        order = [("ours", ours), ("theirs", theirs)] if r % 2 == 0 else [("theirs", theirs), ("ours", ours)]
        for name, fn in order:
            t, out = timed(fn)
            (t_ours if name == "ours" else t_theirs).append(t)
            if name == "ours":
                err_ours = float((A.double() - (out.codes_ @ out.components_).double()).norm())
            else:
                Z, D = out
                err_theirs = float((A.double() - (Z @ D).double()).norm())
        print(f"repeat {r}: ours {t_ours[-1]:.2f}s, baseline {t_theirs[-1]:.2f}s")
    mo, mt = statistics.median(t_ours), statistics.median(t_theirs)
    print(f"Semi-NMF {tuple(A.shape)}, k={args.concepts}, {args.iters} MU iterations:")
    print(f"  hf_tdiag   {mo:.2f}s   ||A-Â||/SVD floor = {err_ours / floor:.4f}   rel err {err_ours / a_norm:.4f}")
    print(
        f"  baseline   {mt:.2f}s   ||A-Â||/SVD floor = {err_theirs / floor:.4f}   rel err {err_theirs / a_norm:.4f}   ({baseline})"
    )
    print(
        f"  speed ratio baseline/hf_tdiag = {mt / mo:.2f}x   (rank-{args.concepts} SVD floor rel err {floor / a_norm:.4f})"
    )

    # one Gram-aligned fit vs one classifier-supervised fit (same data as images × patches)
    runner = suffix_runner(model, 1, acts.prefix[:n_img])
    t_gram, gram = timed(lambda: SemiNMF(args.concepts, gram_weight=1.0, max_iter=args.iters, refine_iter=100).fit(A3))
    t_sup, sup = timed(
        lambda: ClassifierSupervisedSemiNMF(
            args.concepts, kl_weight=10.0, supervised_iter=100, max_iter=args.iters, batch_size=250
        ).fit(A3, runner)
    )
    print(
        f"Gram-aligned fit (200 MU + 100 refine): {t_gram:.2f}s; classifier-supervised fit (200 MU + 100 Adam "
        f"through the suffix): {t_sup:.2f}s; ratio supervised/gram = {t_sup / t_gram:.2f}x"
    )

    result = {
        "benchmark": "bench_concepts",
        "data": {
            "source": source,
            "test_accuracy": acc,
            "shape": list(A.shape),
            "train_seconds": t_train,
        },
        "n_concepts": args.concepts,
        "mu_iterations": args.iters,
        "repeats": args.repeats,
        "hf_tdiag_seconds": t_ours,
        "baseline_seconds": t_theirs,
        "baseline": baseline,
        "hf_tdiag_median_s": mo,
        "baseline_median_s": mt,
        "speed_ratio_baseline_over_hf_tdiag": mt / mo,
        "svd_floor_frobenius": floor,
        "hf_tdiag_frobenius_error": err_ours,
        "baseline_frobenius_error": err_theirs,
        "hf_tdiag_error_over_svd_floor": err_ours / floor,
        "baseline_error_over_svd_floor": err_theirs / floor,
        "hf_tdiag_within_10pct_of_svd": err_ours <= 1.1 * floor,
        "gram_aligned_fit_seconds": t_gram,
        "supervised_fit_seconds": t_sup,
        "supervised_over_gram_cost": t_sup / t_gram,
        "gram_aligned_final": {"rec_loss": gram.history_["rec_loss"][-1], "gram_loss": gram.history_["gram_loss"][-1]},
        "supervised_final": {"rec_loss": sup.history_["rec_loss"][-1], "gram_loss": sup.history_["gram_loss"][-1]},
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "torch_threads": args.threads,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        },
        "note": "shared machine: other jobs ran concurrently; timings are medians of interleaved repeats",
    }
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
