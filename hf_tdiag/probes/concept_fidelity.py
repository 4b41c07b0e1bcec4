"""Concept fidelity of a vision transformer classifier at layer ℓ (CRATE and ViT-like models).

Definitions used throughout (DESIGN.md, "Concept fidelity"):

* **layer-ℓ activations** ``A``: the output of block ℓ, i.e. ``hidden_states[ℓ]`` of the model's
  forward pass (``ℓ = 0`` is the embedding output, ``ℓ = L`` the last block), **patch tokens
  only** — shape ``(images, N, d)``. The prefix tokens (CLS; CLS + distillation for DeiT) are kept
  aside and never replaced.
* **suffix** ``g_{>ℓ}``: blocks ℓ+1..L, then the final norm and pooling (``readout``), then the
  linear head ``h(z) = W_c z + b``. :func:`suffix_runner` replaces the layer-ℓ patch tokens with
  ``Â`` (prefix untouched) and returns the logits; on ``Â = A`` it reproduces the model's logits.
* **constants of the bound** ``KL ≤ ½(‖W_c‖_op L_norm)² L_block^{2 L_suf} (√N δ_rec + α‖G‖_F δ_gram)²``:
  ``‖W_c‖_op`` is exact (spectral norm of the head's weight). The others are *estimates*:
  ``L_block`` = max over suffix blocks and images of (a) the block's local Jacobian spectral norm
  at the actual input (power iteration in float64: central finite-difference JVPs + autograd
  VJPs) and (b) the realized ratio ``‖f(Ẑ) − f(Z)‖_F/‖Ẑ − Z‖_F`` along the concept path;
  ``L_norm`` the same Jacobian estimate for the readout (final LayerNorm + pooling);
  ``α = (γ_max² / (2√p·s²)) · max_i ‖LN₁(Z_i)‖_op · Σ_k ‖W_V^k‖_op ‖W_O^k‖_op`` for block ℓ+1
  (attention-output change per unit of Gram change of its input: softmax Jacobian ≤ ½, logits
  scaled by 1/√p, LN₁ rescales the Gram by γ²/s² with ``s`` the median token standard deviation,
  the values carry ``‖LN₁(Z)‖_op``), 0 when no block follows ℓ.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from ..measures.concepts import SemiNMF, fidelity_errors, jacobian_spectral_norm, kl_bound, kl_divergence
from .architecture import describe
from .token_states import model_device, model_dtype

__all__ = ["concept_fidelity", "compare_concepts", "supervised_concepts", "layer_activations", "suffix_runner", "ConceptModel",
           "LayerActivations"]

_SUPPORTED = "CRATE (model_type 'crate') or a ViT-like image classifier (ViTForImageClassification, DeiT, ...)"


@dataclass
class ConceptModel:
    """Handles of an image classifier needed to split it at layer ℓ."""

    model: nn.Module
    family: str  # "crate" | "vit"
    blocks: nn.ModuleList
    readout: Callable[[torch.Tensor], torch.Tensor]  # Z^L (B, T, d) -> head features (B, d)
    readout_modules: tuple  # modules the readout uses (for float64 copies)
    pooling: str  # "cls" | "mean"
    head: nn.Linear
    num_layers: int
    num_prefix: int
    num_patches: int
    grid: tuple[int, int]
    arch: object

    def block_forward(self, block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        out = block(hidden)
        return out[0] if isinstance(out, tuple) else out


def _size2(x) -> tuple[int, int]:
    return (int(x[0]), int(x[1])) if isinstance(x, (tuple, list)) else (int(x), int(x))


def concept_model_parts(model: nn.Module) -> ConceptModel:
    """Find blocks, readout and head of a CRATE or ViT-like classifier; clear errors otherwise."""
    if not isinstance(model, nn.Module) or getattr(model, "config", None) is None:
        raise TypeError(f"model: expected a Transformers image classifier ({_SUPPORTED}), got {type(model).__name__}")
    config = model.config
    head = getattr(model, "classifier", None)
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"model: expected {_SUPPORTED} with a linear 'classifier' head; {type(model).__name__} "
            f"(model_type {getattr(config, 'model_type', None)!r}) has none"
        )
    try:
        arch = describe(model)
    except (ValueError, TypeError) as err:
        raise ValueError(f"model: expected {_SUPPORTED}; {err}") from None
    image_size = getattr(config, "image_size", None)
    patch_size = getattr(config, "patch_size", None)
    if image_size is None or patch_size is None:
        raise ValueError(f"model: expected {_SUPPORTED} (a config with image_size and patch_size); got {type(model).__name__}")
    (ih, iw), (ph, pw) = _size2(image_size), _size2(patch_size)
    grid = (ih // ph, iw // pw)
    if arch.family == "crate":
        pooling = getattr(config, "pooling", "cls")
        norm = model.classifier_norm

        def readout(z, norm=norm, pooling=pooling):
            return norm(z[:, 0] if pooling == "cls" else z.mean(dim=1))

        return ConceptModel(model, "crate", arch.encoder_layers, readout, (norm,), pooling, head, arch.num_layers, 1,
                            grid[0] * grid[1], grid, arch)
    if arch.family != "vit":
        raise ValueError(
            f"model: expected {_SUPPORTED}; {type(model).__name__} is a post-norm ({arch.family}) encoder"
        )
    base = arch.base_model
    norm = getattr(base, "layernorm", None)
    if not isinstance(norm, nn.LayerNorm):
        raise ValueError(f"model: expected {_SUPPORTED} with a final 'layernorm'; {type(model).__name__} has none")
    num_prefix = 2 if getattr(getattr(base, "embeddings", None), "distillation_token", None) is not None else 1

    def readout(z, norm=norm):
        return norm(z[:, 0])

    return ConceptModel(model, "vit", arch.encoder_layers, readout, (norm,), "cls", head, arch.num_layers, num_prefix,
                        grid[0] * grid[1], grid, arch)


def _pixel_values(inputs) -> torch.Tensor:
    if not isinstance(inputs, (torch.Tensor, Mapping, str, bytes)) and hasattr(inputs, "__iter__") and not hasattr(inputs, "keys"):
        parts = list(inputs)  # an iterable of batches (e.g. hf_tdiag.inputs.LazyBatches)
        if parts and all(isinstance(p, (torch.Tensor, Mapping)) or hasattr(p, "keys") for p in parts):
            return torch.cat([_pixel_values(p) for p in parts])
        raise TypeError(
            "inputs: expected pixel_values as a tensor (images, channels, height, width), a dict/BatchFeature with "
            "'pixel_values' or an iterable of such batches (run the image processor first)"
        )
    if isinstance(inputs, Mapping) or hasattr(inputs, "keys"):
        if "pixel_values" not in inputs:
            raise ValueError(f"inputs: expected a 'pixel_values' entry, got keys {list(inputs.keys())}")
        inputs = inputs["pixel_values"]
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(
            "inputs: expected pixel_values as a tensor (images, channels, height, width) or a dict/BatchFeature "
            f"with 'pixel_values' (run the image processor first), got {type(inputs).__name__}"
        )
    if inputs.ndim != 4:
        raise ValueError(f"inputs: expected pixel_values of shape (images, channels, height, width), got {tuple(inputs.shape)}")
    if inputs.shape[0] == 0:
        raise ValueError(f"inputs: expected at least one image, got an empty batch of shape {tuple(inputs.shape)}")
    if not inputs.is_floating_point() or not bool(torch.isfinite(inputs).all()):
        raise ValueError("inputs: pixel_values must be finite floating-point values")
    return inputs


def _check_layer(cm: ConceptModel, layer) -> int:
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"layer: expected an int in [0, {cm.num_layers}], got {layer!r}")
    if not 0 <= layer <= cm.num_layers:
        raise ValueError(
            f"layer: expected 0 <= layer <= {cm.num_layers} (hidden_states index: 0 = embeddings, "
            f"{cm.num_layers} = last block), got {layer}"
        )
    return layer


@dataclass
class LayerActivations:
    """Layer-ℓ patch activations ``A`` (images, N, d), the untouched prefix tokens, and the model's logits."""

    patches: torch.Tensor
    prefix: torch.Tensor
    logits: torch.Tensor
    block_inputs: list  # hidden_states[ℓ..L] (images, T, d): inputs of the suffix blocks, then Z^L


def layer_activations(model, inputs, layer: int, batch_size: int = 64, cm: ConceptModel | None = None) -> LayerActivations:
    """Run the model once and return layer-ℓ patch tokens (``hidden_states[ℓ][:, prefix:]``)."""
    cm = cm or concept_model_parts(model)
    layer = _check_layer(cm, layer)
    pixels = _pixel_values(inputs)
    device, dtype = model_device(model), model_dtype(model)
    outs, logits = [], []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, pixels.shape[0], batch_size):
                out = model(pixel_values=pixels[i : i + batch_size].to(device=device, dtype=dtype), output_hidden_states=True)
                outs.append(out.hidden_states[layer:])
                logits.append(out.logits)
    finally:
        model.train(was_training)
    states = [torch.cat([o[j] for o in outs]) for j in range(len(outs[0]))]
    h = states[0]
    if h.shape[1] != cm.num_prefix + cm.num_patches:
        raise ValueError(
            f"inputs: expected {cm.num_prefix + cm.num_patches} tokens ({cm.num_prefix} prefix + {cm.num_patches} patches "
            f"for image size {cm.model.config.image_size}), the model produced {h.shape[1]}"
        )
    return LayerActivations(h[:, cm.num_prefix :], h[:, : cm.num_prefix], torch.cat(logits), states)


def suffix_runner(model, layer: int, prefix: torch.Tensor, cm: ConceptModel | None = None) -> Callable:
    """``g(patches, index=None) = h(readout(blocks_{ℓ+1..L}([prefix[index]; patches])))``: logits with layer-ℓ patches replaced.

    ``prefix`` holds the untouched prefix (CLS) tokens of all images at layer ℓ; ``index`` (a slice or
    index tensor) selects the images of a chunk, ``None`` means all of them.
    """
    cm = cm or concept_model_parts(model)
    layer = _check_layer(cm, layer)
    blocks = list(cm.blocks)[layer:]

    def run(patches: torch.Tensor, index=None) -> torch.Tensor:
        if patches.ndim != 3 or patches.shape[1] != cm.num_patches:
            raise ValueError(f"patches: expected (images, {cm.num_patches}, d), got {tuple(patches.shape)}")
        pre = prefix if index is None else prefix[index]
        if pre.shape[0] != patches.shape[0]:
            raise ValueError(f"patches: {patches.shape[0]} images but the prefix selection has {pre.shape[0]}")
        z = torch.cat([pre.to(patches), patches], dim=1)
        for block in blocks:
            z = cm.block_forward(block, z)
        return cm.head(cm.readout(z))

    return run


def _concepts_reconstruction(concepts, A: torch.Tensor):
    """(estimator, codes or None, Â) for the concepts spec (see :func:`concept_fidelity`)."""
    if isinstance(concepts, SemiNMF):
        if getattr(concepts, "components_", None) is None:
            codes = concepts.fit(A).codes_
        else:
            codes = concepts.transform(A)
        return concepts, codes, concepts.inverse_transform(codes)
    if isinstance(concepts, int) and not isinstance(concepts, bool):
        est = SemiNMF(concepts).fit(A)
        return est, est.codes_, est.inverse_transform(est.codes_)
    if isinstance(concepts, torch.Tensor):
        est = SemiNMF.from_components(concepts)
        codes = est.transform(A)
        return est, codes, est.inverse_transform(codes)
    if callable(getattr(concepts, "reconstruct", None)):
        A_hat = concepts.reconstruct(A)
        if not isinstance(A_hat, torch.Tensor) or A_hat.shape != A.shape:
            raise ValueError(f"concepts: reconstruct(A) must return a tensor of shape {tuple(A.shape)}")
        return concepts, None, A_hat
    raise TypeError(
        "concepts: expected a SemiNMF (fitted or not), a number of concepts (int), a dictionary tensor (k, d) "
        f"or an object with reconstruct(A), got {type(concepts).__name__}"
    )


def _float64_block(cm, block):
    return copy.deepcopy(block).to(torch.float64).eval()


@torch.no_grad()
def _alpha(cm: ConceptModel, layer: int, Z: torch.Tensor) -> float:
    """Attention-projection constant of block ℓ+1 (see module docstring)."""
    if layer >= cm.num_layers:
        return 0.0
    h = cm.arch.layers[layer]
    K, p = h.num_heads, h.head_dim
    Wv = h.value.weight.detach().double()  # (K p, d)
    Wo = h.output_weight()
    if Wo is None:
        raise ValueError(f"model: block {layer + 1} has no attention output projection; cannot estimate alpha")
    Wo = Wo.detach().double()  # (d, K p)
    gain = sum(
        float(torch.linalg.matrix_norm(Wv[k * p : (k + 1) * p], ord=2)) * float(torch.linalg.matrix_norm(Wo[:, k * p : (k + 1) * p], ord=2))
        for k in range(K)
    )
    norm = h.attention_norm
    Zd = Z.double()
    if norm is not None:
        X = torch.nn.functional.layer_norm(
            Zd, norm.normalized_shape, None if norm.weight is None else norm.weight.double(),
            None if norm.bias is None else norm.bias.double(), norm.eps)
        gamma = float(norm.weight.detach().double().abs().max()) if norm.weight is not None else 1.0
        s = float(Zd.std(dim=-1, unbiased=False).median())
        scale = gamma**2 / max(s**2, 1e-30)
    else:
        X, scale = Zd, 1.0
    x_op = float(torch.linalg.matrix_norm(X, ord=2).max())
    return scale * x_op * gain / (2.0 * math.sqrt(p))


def estimate_constants(cm: ConceptModel, acts: LayerActivations, A_hat: torch.Tensor, layer: int,
                       power_iters: int = 20, max_images: int = 32, progress: bool = False) -> dict:
    """``‖W_c‖_op`` (exact) and the estimates ``L_block``, ``L_norm``, ``α`` (see module docstring)."""
    w_c_op = float(torch.linalg.matrix_norm(cm.head.weight.detach().double(), ord=2))
    sub = slice(0, min(max_images, acts.patches.shape[0]))
    per_block_jac, per_block_ratio = [], []
    z = acts.block_inputs[0]
    z_hat = torch.cat([acts.prefix, A_hat.to(z)], dim=1)
    blocks = list(cm.blocks)[layer:]
    for j, block in enumerate(tqdm(blocks, desc="constants", disable=not progress, leave=False)):
        z_in = acts.block_inputs[j]
        b64 = _float64_block(cm, block)

        def f(x, b64=b64):
            return cm.block_forward(b64, x)

        per_block_jac.append(float(jacobian_spectral_norm(f, z_in[sub].double(), n_iter=power_iters).max()))
        with torch.no_grad():
            out = cm.block_forward(block, z_hat)
            ref = acts.block_inputs[j + 1]
            num = (out - ref).double().flatten(1).norm(dim=1)
            den = (z_hat - z_in).double().flatten(1).norm(dim=1)
            ok = den > 0
            per_block_ratio.append(float((num[ok] / den[ok]).max()) if bool(ok.any()) else 0.0)
        z_hat = out
    norms64 = [copy.deepcopy(m).to(torch.float64) for m in cm.readout_modules]
    pooling = cm.pooling

    def readout64(x):
        n = norms64[0]
        y = x[:, 0] if pooling == "cls" else x.mean(dim=1)
        return n(y)

    l_norm = float(jacobian_spectral_norm(readout64, acts.block_inputs[-1][sub].double(), n_iter=power_iters).max())
    l_block = max([max(a, b) for a, b in zip(per_block_jac, per_block_ratio)], default=1.0)
    return {
        "w_c_op": w_c_op,
        "l_block": l_block,
        "l_norm": l_norm,
        "alpha": _alpha(cm, layer, z),
        "l_block_jacobian": per_block_jac,
        "l_block_realized": per_block_ratio,
        "estimated": ["l_block", "l_norm", "alpha"],
        "exact": ["w_c_op"],
        "method": {
            "w_c_op": "spectral norm of the classifier weight (exact)",
            "l_block": f"max over suffix blocks of the local Jacobian spectral norm (power iteration, {power_iters} "
            f"steps, float64, first {sub.stop} images) and the realized ratio ||f(Z_hat)-f(Z)||/||Z_hat-Z|| on all images",
            "l_norm": "local Jacobian spectral norm of the readout (final LayerNorm + pooling)",
            "alpha": "(gamma_max^2/(2 sqrt(p) s^2)) max_i ||LN1(Z_i)||_op sum_k ||W_V^k||_op ||W_O^k||_op of block l+1",
        },
    }


def _to_list(t):
    return [float(v) for v in t]


def concept_fidelity(
    model,
    inputs,
    layer: int,
    concepts=16,
    *,
    estimate: bool = True,
    power_iters: int = 20,
    max_images_for_constants: int = 32,
    batch_size: int = 64,
    return_tensors: bool = False,
    progress: bool = True,
) -> dict:
    """Fidelity report of concepts at layer ℓ of a CRATE or ViT-like classifier.

    ``inputs``: pixel values ``(images, C, H, W)`` (or a dict/BatchFeature with ``pixel_values``).
    ``concepts``: a fitted :class:`~hf_tdiag.measures.concepts.SemiNMF` (codes via ``transform``),
    an unfitted one (fitted here), an int (plain Semi-NMF with that many concepts) or a dictionary
    tensor ``(k, d)`` — or any object with ``reconstruct(A) -> Â``. Returns per-image lists and aggregates: ``delta_rec`` (absolute and relative),
    ``delta_gram``, ``gram_norm``, the lemma check, the empirical ``kl`` (layer-ℓ patch tokens
    replaced by ``Â``, CLS untouched, remaining blocks + head run), ``top1_agree``, the bound with
    its two terms and how often the KL is below it, and the constants (``constants["estimated"]``
    lists the estimated ones).
    """
    cm = concept_model_parts(model)
    layer = _check_layer(cm, layer)
    acts = layer_activations(model, inputs, layer, batch_size=batch_size, cm=cm)
    A = acts.patches
    est, codes, A_hat = _concepts_reconstruction(concepts, A)
    A_hat = A_hat.to(A)
    runner = suffix_runner(model, layer, acts.prefix, cm)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits_a, logits_h = [], []
            for i in tqdm(range(0, A.shape[0], batch_size), desc="suffix", disable=not progress, leave=False):
                idx = slice(i, i + batch_size)
                logits_a.append(runner(A[idx], idx))
                logits_h.append(runner(A_hat[idx], idx))
            logits_a, logits_h = torch.cat(logits_a), torch.cat(logits_h)
        tol = 1e-3 * max(1.0, float(acts.logits.abs().max()))
        if float((logits_a - acts.logits).abs().max()) > tol:
            raise ValueError(
                f"model: re-running blocks {layer + 1}..{cm.num_layers} and the head does not reproduce the logits of "
                f"{type(model).__name__}; its forward is not the {_SUPPORTED} layout this probe supports"
            )
        errs = fidelity_errors(A, A_hat)
        kl = kl_divergence(logits_a, logits_h)
        agree = (logits_a.argmax(-1) == logits_h.argmax(-1)).double()
        report = {
            "model_type": getattr(model.config, "model_type", None),
            "family": cm.family,
            "layer": layer,
            "num_layers": cm.num_layers,
            "n_suffix_blocks": cm.num_layers - layer,
            "n_images": int(A.shape[0]),
            "n_tokens": int(A.shape[1]),
            "hidden_size": int(A.shape[2]),
            "n_concepts": getattr(est, "n_concepts", None),
            "gram_weight": getattr(est, "gram_weight", None),
            "per_image": {k: _to_list(v) for k, v in errs.items()},
        }
        report["per_image"]["kl"] = _to_list(kl)
        report["per_image"]["top1_agree"] = _to_list(agree)
        report["per_image"]["lemma_holds"] = _to_list((errs["gram_error"] <= errs["lemma_rhs"] * (1 + 1e-9)).double())
        for key in ("delta_rec", "delta_rec_rel", "delta_gram", "gram_norm", "gram_error"):
            report[key] = float(errs[key].mean())
        report["kl"] = float(kl.mean())
        report["kl_max"] = float(kl.max())
        report["top1_agreement"] = float(agree.mean())
        report["lemma_holds"] = sum(report["per_image"]["lemma_holds"]) / len(kl)
        if estimate:
            consts = estimate_constants(cm, acts, A_hat, layer, power_iters=power_iters,
                                        max_images=max_images_for_constants, progress=progress)
            bound = kl_bound(consts["w_c_op"], consts["l_block"], cm.num_layers - layer, int(A.shape[1]),
                             errs["delta_rec"], consts["alpha"], errs["gram_norm"], errs["delta_gram"],
                             l_norm=consts["l_norm"])
            report["constants"] = consts
            for key in ("bound", "rec_term", "gram_term", "bound_rec_only", "bound_gram_only"):
                name = key if key.startswith("bound") else f"bound_{key}"
                report["per_image"][name] = _to_list(bound[key])
                report[name] = float(bound[key].mean())
            below = (kl <= bound["bound"]).double()
            report["per_image"]["kl_below_bound"] = _to_list(below)
            report["frac_kl_below_bound"] = float(below.mean())
    finally:
        model.train(was_training)
    if return_tensors:
        report["tensors"] = {"A": A, "A_hat": A_hat, "codes": codes, "logits": logits_a, "logits_hat": logits_h,
                             "concepts": est}
    return report


def supervised_concepts(model, inputs, layer: int, n_concepts: int, *, kl_weight: float = 1.0,
                        batch_size: int = 64, **kwargs):
    """Fit classifier-supervised concepts at layer ℓ (``L_rec + λ·KL`` through the suffix; FACE-like baseline)."""
    from ..measures.concepts import ClassifierSupervisedSemiNMF

    cm = concept_model_parts(model)
    layer = _check_layer(cm, layer)
    acts = layer_activations(model, inputs, layer, batch_size=batch_size, cm=cm)
    est = ClassifierSupervisedSemiNMF(n_concepts, kl_weight=kl_weight, batch_size=batch_size, **kwargs)
    suffix = suffix_runner(model, layer, acts.prefix, cm)
    was_training = model.training
    model.eval()
    try:
        est.fit(acts.patches, suffix)
    finally:
        model.train(was_training)
    return est


def compare_concepts(
    model,
    inputs,
    layer: int,
    n_concepts: int = 16,
    *,
    gram_weights=(0.0, 1.0),
    supervised: bool = True,
    kl_weight: float = 10.0,
    max_iter: int = 200,
    refine_iter: int = 100,
    supervised_iter: int = 100,
    estimate: bool = True,
    power_iters: int = 20,
    batch_size: int = 64,
    progress: bool = True,
) -> dict:
    """Plain / Gram-aligned (each μ in ``gram_weights``) / classifier-supervised concepts at layer ℓ, side by side.

    Returns ``runs`` (label -> :func:`concept_fidelity` report, plus fit time and loss history),
    ``agreement`` (Hungarian-matched cosine similarity of each dictionary to the supervised one, and
    ``update_cosine``: cosine between the refinement moves ``W − W_MU`` of the fit and of the supervised fit,
    all fits sharing the same plain Semi-NMF start ``W_MU``),
    ``table`` (one row per run) and ``estimators`` (label -> fitted estimator).
    """
    import time

    from ..measures.concepts import match_concepts

    if not gram_weights and not supervised:
        raise ValueError("gram_weights: expected at least one μ (or supervised=True)")
    cm = concept_model_parts(model)
    layer = _check_layer(cm, layer)
    pixels = _pixel_values(inputs)
    A = layer_activations(model, pixels, layer, batch_size=batch_size, cm=cm).patches
    runs, estimators, times = {}, {}, {}
    for mu in gram_weights:
        mu = float(mu)
        label = "plain" if mu == 0 else f"gram(mu={mu:g})"
        t0 = time.perf_counter()
        est = SemiNMF(n_concepts, gram_weight=mu, max_iter=max_iter, refine_iter=refine_iter, verbose=progress).fit(A)
        times[label] = time.perf_counter() - t0
        estimators[label] = est
    if supervised:
        t0 = time.perf_counter()
        est = supervised_concepts(model, pixels, layer, n_concepts, kl_weight=kl_weight, batch_size=batch_size,
                                  supervised_iter=supervised_iter, max_iter=max_iter, verbose=progress)
        times["supervised"] = time.perf_counter() - t0
        estimators["supervised"] = est
    for label, est in estimators.items():
        rep = concept_fidelity(model, pixels, layer, est, estimate=estimate, power_iters=power_iters,
                               batch_size=batch_size, progress=progress)
        rep["fit_seconds"] = times[label]
        rep["history"] = {k: list(v) for k, v in est.history_.items()}
        runs[label] = rep
    agreement = {}
    if supervised:
        ref = estimators["supervised"].components_
        # every fit shares the deterministic start and MU phase, so the refinements can be compared as moves
        # away from the plain Semi-NMF dictionary: cosine of vec(W_fit − W_MU) and vec(W_sup − W_MU)
        base = estimators["supervised"].start_components_
        for label, est in estimators.items():
            if label != "supervised":
                m = match_concepts(est.components_, ref)
                agreement[label] = {"mean_cosine": m["mean_cosine"], "cosine": [float(c) for c in m["cosine"]],
                                    "pairs": [[int(a), int(b)] for a, b in zip(m["rows"], m["cols"])]}
                d_fit = (est.components_ - base.to(est.components_)).flatten().double()
                d_sup = (ref - base.to(ref)).flatten().double()
                denom = float(d_fit.norm() * d_sup.norm())
                agreement[label]["update_cosine"] = float(d_fit @ d_sup) / denom if denom > 0 else None
    table = []
    for label, rep in runs.items():
        table.append({
            "method": label,
            "gram_weight": rep["gram_weight"],
            "kl": rep["kl"],
            "top1_agreement": rep["top1_agreement"],
            "delta_rec_rel": rep["delta_rec_rel"],
            "delta_gram": rep["delta_gram"],
            "bound": rep.get("bound"),
            "frac_kl_below_bound": rep.get("frac_kl_below_bound"),
            "fit_seconds": rep["fit_seconds"],
            "cosine_to_supervised": agreement.get(label, {}).get("mean_cosine", 1.0 if label == "supervised" else None),
            "update_cosine_to_supervised": agreement.get(label, {}).get("update_cosine"),
        })
    return {"layer": layer, "n_concepts": n_concepts, "kl_weight": kl_weight if supervised else None,
            "runs": runs, "agreement": agreement, "table": table, "estimators": estimators, "grid": cm.grid}
