"""``build_report``: every diagnostic that applies to a model, on one self-contained HTML page plus a JSON file.

Sections (each one wires a public API of hf_tdiag to its figures; no math here):

* ``summary``   — architecture, predictions on the inputs (accuracy when labels are known);
* ``srr``       — per-layer sparse rate reduction (:func:`hf_tdiag.layer_srr`), vision and text models;
* ``schatten``  — spectrum-adaptive vs Edelman bound proxies (:func:`hf_tdiag.spectrum_bounds`), any encoder;
* ``concepts``  — Semi-NMF concepts, δ_rec/δ_gram, empirical KL vs the bound (:func:`hf_tdiag.concept_fidelity`),
  image classifiers and decoder LLMs on texts (next-token distribution of the last token; estimated bound only);
* ``attention`` — attention maps over the image and the attention-as-SVM head diagnostic
  (:func:`hf_tdiag.attention_svm_diagnostic`).

A section that does not apply (e.g. concepts for a text model) is listed as *skipped* with the reason; a section
that fails is listed as *error* with the message (and ``Report.errors`` is non-empty) while the others still run.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import hf_tdiag
from hf_tdiag._atomic import write_text
from hf_tdiag._cli_args import NUM_CONCEPTS
from hf_tdiag._defaults import DEFAULT_L_PHI
from hf_tdiag.loading import LoadedModel, load_model, pixel_values_for

from .._defaults import REPORT_SECTIONS
from .._progress import tqdm
from ..viz import attention_maps, figure_to_png, images
from ..viz.concepts import token_codes_figure
from .html import Figure, Section, Table, dumps, render_html, to_jsonable

logger = logging.getLogger(__name__)

SECTION_ORDER = REPORT_SECTIONS


@dataclass
class ReportInputs:
    """The inputs every section shares: model inputs, optional labels, and images for display."""

    batch: Any  # pixel_values tensor (images) or a tokenizer's dict batch (texts)
    labels: torch.Tensor | None = None
    images: list | None = None  # PIL images, same order as batch (vision models)
    description: str = ""
    texts: list | None = None  # the raw texts, same order as batch (text models)

    @property
    def num_samples(self) -> int:
        if isinstance(self.batch, torch.Tensor):
            return int(self.batch.shape[0])
        return int(next(v for v in self.batch.values() if isinstance(v, torch.Tensor)).shape[0])


@dataclass
class ReportOptions:
    """Settings of every section (shown in the report and saved in the JSON)."""

    srr_source: str = "query"
    srr_eps: float = 0.1
    srr_lam: float = 1.0
    concept_layer: int | None = None  # default: middle layer
    n_concepts: int = NUM_CONCEPTS
    concept_power_iters: int = 10  # power iterations per Lipschitz estimate of the bound's constants
    concept_constant_images: int = 8  # images used to estimate L_block and alpha
    attention_layer: int | None = None  # block number 1..L; default: the last block
    attention_head: int = 0
    max_svm_samples: int = 16
    L_phi: float = DEFAULT_L_PHI

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Report:
    """A built report: sections plus metadata; :meth:`save` writes ``report.html`` and ``report.json``."""

    title: str
    model: str
    settings: dict
    sections: list[Section] = field(default_factory=list)
    created: str = ""

    @property
    def errors(self) -> dict[str, str]:
        return {s.key: s.note for s in self.sections if s.status == "error"}

    def section(self, key: str) -> Section:
        for s in self.sections:
            if s.key == key:
                return s
        raise KeyError(f"section: no section {key!r}; sections are {[s.key for s in self.sections]}")

    def to_dict(self) -> dict:
        return {
            "title": self.title,
            "model": self.model,
            "created": self.created,
            "hf_tdiag_version": hf_tdiag.__version__,
            "settings": to_jsonable(self.settings),
            "sections": {s.key: s.to_dict() for s in self.sections},
        }

    def to_html(self, json_name: str = "report.json") -> str:
        subtitle = f"hf-tdiag {hf_tdiag.__version__} · {self.created} · {self.model}"
        return render_html(self.title, subtitle, self.sections, self.settings, json_name=json_name)

    def save(self, path: str | os.PathLike) -> tuple[Path, Path]:
        """Write the HTML page to ``path`` and the numbers to the same name with ``.json``; return both paths."""
        html_path = Path(path)
        if html_path.suffix.lower() not in (".html", ".htm"):
            raise ValueError(f"path: expected a file name ending in .html, got {str(path)!r}")
        json_path = html_path.with_suffix(".json")
        write_text(json_path, dumps(self.to_dict()))
        write_text(html_path, self.to_html(json_name=json_path.name))
        return html_path, json_path


# ----------------------------------------------------------------------------- sections


def _png(fig) -> bytes:
    return figure_to_png(fig)


def _add_figures(section: Section, make: Callable[[], list]) -> None:
    """Append the (caption, matplotlib figure) pairs from ``make()``; if drawing fails, keep the section's numbers
    and tables but mark it as an error naming the figure problem."""
    try:
        section.figures += [Figure(caption, _png(fig)) for caption, fig in make()]
    except Exception as err:  # noqa: BLE001 - a plotting failure must not lose the computed numbers
        logger.exception("report section %s: figure failed", section.key)
        section.status = "error"
        section.note = (section.note + " " if section.note else "") + (
            f"Drawing a figure failed ({type(err).__name__}: {err}); the numbers and tables are complete."
        )


def _skip(key: str, title: str, reason: str) -> Section:
    return Section(key, title, status="skipped", note=reason)


def _arch(loaded: LoadedModel):
    from hf_tdiag.probes.describe import describe

    return describe(loaded.model)


@torch.no_grad()
def _forward(loaded: LoadedModel, inputs: ReportInputs, output_attentions: bool = False, batch_size: int = 64):
    """Logits (and optionally the first sample's attentions) over the inputs, batch by batch."""
    from hf_tdiag.probes.token_states import forward_kwargs, model_device

    device = model_device(loaded.model)
    n = inputs.num_samples
    logits, first_attn = [], None
    for start in range(0, n, batch_size):
        if isinstance(inputs.batch, torch.Tensor):
            chunk = inputs.batch[start : start + batch_size]
        else:
            chunk = {k: v[start : start + batch_size] for k, v in inputs.batch.items() if isinstance(v, torch.Tensor)}
        kwargs = {k: v.to(device) for k, v in forward_kwargs(loaded.model, chunk).items()}
        out = loaded.model(**kwargs, output_attentions=output_attentions and start == 0)
        if getattr(out, "logits", None) is not None:
            logits.append(out.logits.float().cpu())
        if output_attentions and start == 0 and out.attentions:
            first_attn = torch.stack([a[0] for a in out.attentions]).float().cpu()
    return (torch.cat(logits) if logits else None), first_attn


def section_summary(loaded: LoadedModel, inputs: ReportInputs | None, options: ReportOptions) -> Section:
    arch = _arch(loaded)
    params = sum(p.numel() for p in loaded.model.parameters())
    cfg = loaded.config
    rows = [
        ["source", str(loaded.source)],
        ["model type", loaded.model_type],
        ["family", arch.family],
        ["variant", getattr(cfg, "variant", "—") if arch.family == "crate" else "—"],
        ["layers", arch.num_layers],
        ["heads × head dim", f"{arch.num_heads} × {arch.head_dim}"],
        ["hidden size", arch.hidden_size],
        ["parameters", params],
        ["input", loaded.modality],
    ]
    if arch.causal:
        rows.insert(
            6,
            [
                "key/value heads (query heads per K/V head)",
                f"{arch.num_kv_heads} ({arch.num_heads // arch.num_kv_heads})",
            ],
        )
        rows.insert(7, ["attention", "causal"])
    numbers: dict[str, Any] = {
        "model_type": loaded.model_type,
        "family": arch.family,
        "num_layers": arch.num_layers,
        "num_heads": arch.num_heads,
        "head_dim": arch.head_dim,
        "hidden_size": arch.hidden_size,
        "num_parameters": params,
    }
    if arch.causal:
        numbers.update(causal=True, num_kv_heads=arch.num_kv_heads)
    section = Section("summary", "Model and predictions", tables=[Table("Architecture", ["property", "value"], rows)])
    if inputs is None:
        section.summary = "No inputs were given: only weight-based diagnostics apply."
        section.numbers = numbers
        return section
    numbers["num_inputs"] = inputs.num_samples
    section.summary = f"Inputs: {inputs.description} ({inputs.num_samples} samples)."
    logits, _ = _forward(loaded, inputs)
    if logits is not None and arch.causal and logits.ndim == 3 and isinstance(inputs.batch, dict):
        numbers["next_token_perplexity"] = next_token_perplexity(logits, inputs.batch)
        section.summary += f" Next-token perplexity on them: {numbers['next_token_perplexity']:.4g}."
    if logits is not None and loaded.is_classifier:
        probs = logits.softmax(-1)
        conf, pred = probs.max(-1)
        id2label = cfg.id2label
        numbers["predictions"] = pred.tolist()
        numbers["confidence"] = conf.tolist()
        if inputs.labels is not None:
            acc = float((pred == inputs.labels).float().mean())
            numbers["accuracy"] = acc
            section.summary += f" Top-1 accuracy on them: {acc:.1%}."
        if inputs.images:
            k = min(16, len(inputs.images))
            truths = (
                [str(id2label.get(int(t), int(t))) for t in inputs.labels[:k]] if inputs.labels is not None else None
            )
            fig = images.predictions_figure(
                inputs.images[:k], [str(id2label.get(int(p), int(p))) for p in pred[:k]], conf[:k].tolist(), truths
            )
            section.figures.append(Figure("Predicted label (probability) of the first inputs", _png(fig)))
    section.numbers = numbers
    return section


def next_token_perplexity(logits: torch.Tensor, batch: dict) -> float:
    """``exp`` of the mean cross-entropy of token t+1 given tokens ≤ t over the real (unpadded) tokens."""
    ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else mask
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].double().flatten(0, 1), ids[:, 1:].flatten(), reduction="none"
    )
    keep = (mask[:, 1:] * mask[:, :-1]).flatten().double()
    return float(torch.exp((nll * keep).sum() / keep.sum().clamp(min=1)))


def gqa_note(settings: dict) -> str:
    """The SRR summary's words on U for a causal / grouped-query model ('' for an encoder)."""
    if not settings.get("causal"):
        return ""
    K, H = settings.get("num_subspaces"), settings.get("num_heads")
    shared = f"; K = {K} shared key/value subspaces, each read by {H // K} query heads" if K and H and K != H else ""
    return f" (causal decoder: each sample's real tokens, padding excluded; Z^L before the final norm{shared})"


def section_srr(loaded: LoadedModel, inputs: ReportInputs | None, options: ReportOptions) -> Section:
    title = "Sparse rate reduction per layer"
    if inputs is None:
        return _skip("srr", title, "needs inputs (images or texts): SRR measures the token representations")
    from hf_tdiag.diagnostics.srr import STATE_DESCRIPTIONS

    report = hf_tdiag.layer_srr(
        loaded.model, inputs.batch, source=options.srr_source, eps=options.srr_eps, lam=options.srr_lam, progress=False
    )
    columns = ["layer"] + [f"{t} mean" for t in ("R", "Rc", "sparsity", "srr")]
    tables = []
    if report.embeddings is not None:
        rows = [[0] + [report.embeddings["mean"][t] for t in ("R", "Rc", "sparsity", "srr")]]
        tables.append(Table("Embeddings Z^0 (with U^1)", columns, rows))
    for state in report.states:
        rows = [
            [ell] + [report.mean[state][t][ell - 1] for t in ("R", "Rc", "sparsity", "srr")] for ell in report.layers
        ]
        tables.append(Table(f"State {state}: {STATE_DESCRIPTIONS[state]}", columns, rows))
    section = Section(
        "srr",
        title,
        summary=(
            f"R(Z) = ½ logdet(I + d/(Nε²) ZᵀZ), Rᶜ(Z; U) = Σ_k ½ logdet(I + p/(Nε²) (U_kᵀZ)ᵀ(U_kᵀZ)), "
            f"SRR = Rᶜ − R + λ‖Z‖₀/(dN) (lower is better), measured on {report.num_samples} samples "
            f"with ε = {options.srr_eps}, λ = {options.srr_lam}"
            + ("" if loaded.model_type == "crate" else f", U from the {options.srr_source} projections")
            + gqa_note(report.settings)
            + "."
        ),
        tables=tables,
        numbers=report.to_dict(),
    )
    from hf_tdiag import viz

    name = getattr(loaded.config, "variant", None) or loaded.model_type
    _add_figures(
        section,
        lambda: [("Per-layer R, Rᶜ, sparsity and SRR (mean ± std over samples)", viz.plot_layer_srr({name: report}))],
    )
    return section


def section_schatten(loaded: LoadedModel, inputs: ReportInputs | None, options: ReportOptions) -> Section:
    report = hf_tdiag.spectrum_bounds(loaded.model, L_phi=options.L_phi)
    rows = [
        [
            m.layer,
            "—" if m.head is None else m.head,
            m.type,
            m.rank,
            m.spectral_norm,
            m.stable_rank,
            m.p_opt,
            m.min_contribution,
            m.flip_factor_down,
        ]
        for m in report.matrices
    ]
    note = report.degenerate_note()
    breakdown = report.breakdown_tables()
    section = Section(
        "schatten",
        "Generalization-bound proxies (spectrum-adaptive Schatten vs Edelman)",
        summary=(
            f"Spectrum-adaptive proxy B_ours = {report.schatten_bound:.6g}; Edelman et al. proxy B_Edelman = "
            f"{report.edelman_bound:.6g} (ratio {report.edelman_bound / report.schatten_bound:.3g}×), from the weights alone "
            f"({len(report.matrices)} matrices, L_φ = {report.L_phi})." + (f" {note}" if note else "")
        ),
        tables=[
            Table("Σ c(W, p) per matrix type at fixed p (B_ours takes the minimum per matrix)", *breakdown["types"]),
            Table("Layer gains f_ℓ and propagation factors α_ℓ", *breakdown["layers"]),
            Table(
                "Per-matrix spectra and optimal p (κ↓: factor on γα_ℓL at which a larger p would win)",
                ["layer", "head", "type", "rank", "‖W‖₂", "stable rank", "p_opt", "min_p c(W,p)", "κ↓"],
                rows,
                collapsed=True,
            ),
        ],
        numbers=report.to_dict(include_spectra=False),
    )
    from hf_tdiag.viz import schatten as VS

    _add_figures(
        section,
        lambda: [
            ("Optimal Schatten index p per matrix type (histogram)", VS.plot_optimal_p_histogram(report)),
            ("Spectral decay σᵢ/σ₁ per matrix type (colour: layer)", VS.plot_spectral_decay(report)),
            ("Contribution c(W, p) against p (minimum marked)", VS.plot_contribution_vs_p(report)),
        ],
    )
    return section


def fidelity_rows(result: dict) -> list[list]:
    """(quantity, value) rows of a concept_fidelity report: errors, KL, bound and its constants."""
    rows = [
        ["δ_rec = ‖A − Â‖_F (mean over images)", result["delta_rec"]],
        ["δ_rec relative = δ_rec / ‖A‖_F", result["delta_rec_rel"]],
        ["δ_gram = √L_gram", result["delta_gram"]],
        ["‖G‖_F", result["gram_norm"]],
        ["empirical KL (mean)", result["kl"]],
        ["empirical KL (max)", result["kl_max"]],
        ["top-1 agreement", result["top1_agreement"]],
    ]
    if "bound_certified" not in result and "bound_estimated" in result:
        rows += [
            ["KL bound, certified constants", result.get("bound_certified_note", "not computed")],
            ["KL bound, estimated constants (mean)", result["bound_estimated"]],
            ["estimated bound: reconstruction term (mean)", result["bound_estimated_rec_term"]],
            ["estimated bound: Gram term (mean)", result["bound_estimated_gram_term"]],
            ["fraction of inputs with KL ≤ estimated bound", result["frac_kl_below_bound_estimated"]],
        ]
        rows += [
            [f"constant {k} (estimated)", v]
            for k, v in result["constants_estimated"].items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
    if "bound_certified" in result:
        rows += [
            ["KL bound, certified constants (mean)", result["bound_certified"]],
            [
                "KL bound, certified chain ½(‖W_c‖ Δ)², Δ the head input's certified move (mean)",
                result["bound_certified_chain"],
            ],
            ["KL bound, estimated constants (mean)", result["bound_estimated"]],
            ["estimated bound: reconstruction term (mean)", result["bound_estimated_rec_term"]],
            ["estimated bound: Gram term (mean)", result["bound_estimated_gram_term"]],
            ["fraction of images with KL ≤ certified bound", result["frac_kl_below_bound_certified"]],
            ["fraction of images with KL ≤ estimated bound", result["frac_kl_below_bound_estimated"]],
        ]
        for kind in ("certified", "estimated"):
            for key, value in result[f"constants_{kind}"].items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    rows.append([f"constant {key} ({kind})", value])
    return rows


def _default_concept_layer(num_layers: int) -> int:
    return max(1, num_layers // 2)


def section_concepts(loaded: LoadedModel, inputs: ReportInputs | None, options: ReportOptions) -> Section:
    title = _TITLES["concepts"]
    if inputs is not None and inputs.texts and _arch(loaded).causal:
        return decoder_concepts_section(loaded, inputs, options)
    if inputs is None or loaded.modality != "image":
        return _skip("concepts", title, "needs image inputs: concepts are fitted on a layer's patch-token activations")
    if not loaded.is_classifier:
        return _skip("concepts", title, "needs an image classifier (the bound is about the classifier's output)")
    num_layers = int(loaded.config.num_hidden_layers)
    layer = _default_concept_layer(num_layers) if options.concept_layer is None else int(options.concept_layer)
    result = hf_tdiag.concept_fidelity(
        loaded.model,
        inputs.batch,
        layer,
        options.n_concepts,
        power_iters=options.concept_power_iters,
        max_images_for_constants=options.concept_constant_images,
        return_tensors=True,
        progress=False,
    )
    tensors = result.tensors
    rows = fidelity_rows(result)
    section = Section(
        "concepts",
        title,
        summary=(
            f"Semi-NMF with {result['n_concepts']} concepts of the patch tokens after block {layer} "
            f"({result['n_images']} images × {result['n_tokens']} tokens × {result['hidden_size']} dims). "
            "The empirical KL replaces the layer's patch tokens by their reconstruction Â (CLS untouched) and runs "
            "the remaining blocks and the head; the bound is "
            "½(‖W_c‖_op L_readout)² · L_block^{2L_suf} · (√N δ_rec + α‖G‖_F δ_gram)², once with certified constants "
            "(upper bounds on the ball the reconstruction provably stays in; the derivation is in the package's "
            "docs, concept_bound.md) and once with local estimates."
        ),
        tables=[Table("Fidelity", ["quantity", "value"], rows)],
        numbers=result,
    )
    _add_figures(section, lambda: concept_plots(loaded, inputs.batch, tensors["codes"], result))
    return section


def decoder_concepts_section(loaded: LoadedModel, inputs: ReportInputs, options: ReportOptions) -> Section:
    """Concepts of a decoder LLM's token states on the report's texts (see :mod:`hf_tdiag.probes.concept_decoder`)."""
    num_layers = int(_arch(loaded).num_layers)
    layer = _default_concept_layer(num_layers) if options.concept_layer is None else int(options.concept_layer)
    result = hf_tdiag.concept_fidelity(
        loaded.model,
        list(inputs.texts),
        layer,
        options.n_concepts,
        tokenizer=loaded.processor,
        power_iters=options.concept_power_iters,
        max_images_for_constants=options.concept_constant_images,
        return_tensors=True,
        progress=False,
    )
    tensors = result.tensors
    rows = fidelity_rows(result)
    section = Section(
        "concepts",
        _TITLES["concepts"],
        summary=(
            f"Semi-NMF with {result['n_concepts']} concepts of the token states after block {layer} "
            f"({result['n_images']} texts × {result['n_tokens']} tokens × {result['hidden_size']} dims; every text cut "
            "to the shortest one's token count, special tokens kept aside). The empirical KL replaces those states by "
            "their reconstruction Â, runs the remaining blocks (causal) and compares the next-token distributions of "
            "the last token (final norm + LM head); the bound ½(‖W_c‖_op L_readout)² · L_block^{2L_suf} · "
            "(√N δ_rec + α‖G‖_F δ_gram)² uses local estimates of its constants. Certified bound: "
            f"{result.get('bound_certified_note', 'see the table')}."
        ),
        tables=[Table("Fidelity", ["quantity", "value"], rows)],
        numbers=result,
    )

    def figures():
        out = []
        if tensors["codes"] is not None:
            ids = loaded.processor(list(inputs.texts[:1]), add_special_tokens=False)["input_ids"][0]
            tokens = loaded.processor.convert_ids_to_tokens(ids[: result["n_tokens"]])
            codes = tensors["codes"].reshape(result["n_images"], result["n_tokens"], -1)[0]
            out.append(
                (f"Concept codes of the first text's tokens after block {layer}", token_codes_figure(tokens, codes))
            )
        if "bound_estimated" in result.get("per_image", {}):
            from hf_tdiag.viz import concepts as VC

            out.append(
                (
                    "Empirical KL against the bound with estimated constants, per text",
                    VC.plot_kl_vs_bound({"Semi-NMF": result}, kind="estimated"),
                )
            )
        return out

    _add_figures(section, figures)
    return section


def patch_grid(config, pixel_values: torch.Tensor) -> tuple[int, int]:
    """(rows, cols) of the patch grid of ``pixel_values`` for a ViT-like ``config``."""
    patch = config.patch_size
    ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)
    return int(pixel_values.shape[-2] // ph), int(pixel_values.shape[-1] // pw)


def concept_plots(loaded: LoadedModel, pixel_values: torch.Tensor, codes, result: dict) -> list[tuple[str, Any]]:
    """(caption, matplotlib figure) pairs: concept heatmaps, top-activating patches, KL vs bound (if computed)."""
    from hf_tdiag.viz import concepts as VC

    out = []
    if codes is not None:
        grid = patch_grid(loaded.config, pixel_values)
        codes = codes.reshape(result["n_images"], result["n_tokens"], -1)
        k = min(result["n_concepts"], 6)
        out.append(
            (
                f"Concept codes over the patch grid after block {result['layer']} (strongest concepts, first images)",
                VC.plot_concept_heatmaps(pixel_values, codes, grid, n_images=4, n_concepts=k),
            )
        )
        out.append(
            (
                "Top-activating patches per concept (cyan box; value = code)",
                VC.plot_top_patches(pixel_values, codes, grid, n_concepts=k, top=8),
            )
        )
    if "bound_estimated" in result.get("per_image", {}):
        out.append(
            (
                "Empirical KL against the bound with estimated constants, per image",
                VC.plot_kl_vs_bound({"Semi-NMF": result}, kind="estimated"),
            )
        )
    return out


def section_attention(loaded: LoadedModel, inputs: ReportInputs | None, options: ReportOptions) -> Section:
    title = "Attention maps and attention-as-SVM"
    if inputs is None:
        return _skip("attention", title, "needs inputs: attention maps are computed on the inputs")
    arch = _arch(loaded)
    layer = arch.num_layers if options.attention_layer is None else int(options.attention_layer)
    if not 1 <= layer <= arch.num_layers:
        raise ValueError(f"attention_layer: expected a block number 1..{arch.num_layers}, got {layer}")
    section = Section("attention", title)
    _, attn = _forward(
        loaded,
        ReportInputs(
            inputs.batch[:1] if isinstance(inputs.batch, torch.Tensor) else {k: v[:1] for k, v in inputs.batch.items()}
        ),
        output_attentions=True,
    )
    if attn is None:
        section.note = "no attention maps: the model returned none (it has no eager attention path)"
    elif loaded.modality == "image":
        _image_attention_figures(section, loaded, inputs, attn, layer)
    else:
        _token_attention_figures(section, loaded, inputs, attn, layer)
    head = int(options.attention_head)
    if not 0 <= head < arch.num_heads:
        raise ValueError(f"attention_head: expected 0 <= head < {arch.num_heads}, got {head}")
    n = min(inputs.num_samples, int(options.max_svm_samples))
    batch = inputs.batch[:n] if isinstance(inputs.batch, torch.Tensor) else {k: v[:n] for k, v in inputs.batch.items()}
    diag = hf_tdiag.attention_svm_diagnostic(loaded.model, batch, layer, head, max_queries=64, progress=False)
    summary = diag.summary()
    section.summary = (
        f"Attention as a max-margin SVM (Tarzanagh et al. 2023), head {head} of layer {layer} on {n} inputs: each "
        "sampled query's most-attended token is its selection, W_mm = argmin ‖W‖_F s.t. (x_α − x_t)ᵀ W z ≥ 1 is "
        "solved in the head's input space and compared with the head's own W_Kᵀ W_Q / √p."
    )
    section.tables.append(svm_table(summary))
    section.numbers["attention_svm"] = diag.to_dict()
    _add_figures(section, lambda: svm_plots(diag))
    return section


def cls_pooling_note(config) -> str:
    """A sentence for CLS attention maps of a model whose head does not read the CLS token ('' when it does)."""
    if getattr(config, "pooling", "cls") == "mean":
        return (
            "This model classifies the mean of all tokens (pooling='mean'): the CLS token does not drive its "
            "prediction, so these maps show what CLS attends to, not what the classifier reads."
        )
    return ""


def _image_attention_figures(section: Section, loaded: LoadedModel, inputs: ReportInputs, attn, layer: int) -> None:
    pv = inputs.batch[0]
    grid = patch_grid(loaded.config, pv)
    shown = pv[0].numpy() if pv.shape[0] == 1 else pv.permute(1, 2, 0).numpy()
    note = cls_pooling_note(loaded.config)
    suffix = f" {note}" if note else ""
    _add_figures(
        section,
        lambda: [
            (
                f"CLS attention, mean over heads, per layer (first input).{suffix}",
                attention_maps.attention_layers_figure(shown, attn, grid),
            ),
            (
                f"CLS attention of each head of layer {layer} (first input).{suffix}",
                attention_maps.attention_heads_figure(shown, attn, grid, layer),
            ),
        ],
    )
    section.numbers["cls_attention_first_input"] = attention_maps.cls_attention_grid(attn, grid)


def _token_attention_figures(section: Section, loaded: LoadedModel, inputs: ReportInputs, attn, layer: int) -> None:
    ids = inputs.batch["input_ids"][0]
    mask = inputs.batch.get("attention_mask")
    keep = int(mask[0].sum()) if mask is not None else int(ids.shape[0])
    tokens = loaded.processor.convert_ids_to_tokens(ids[:keep].tolist()) if loaded.processor is not None else None
    if tokens is None:
        tokens = [str(int(i)) for i in ids[:keep]]
    attn = attn[:, :, :keep, :keep]
    _add_figures(
        section,
        lambda: [
            (
                f"Token-to-token attention of layer {layer}, mean over heads (first input, padding removed)",
                attention_maps.token_attention_figure(tokens, attn, layer),
            ),
            (
                "Attention of the first token (e.g. [CLS]) to every token, mean over heads, per layer (first input)",
                attention_maps.first_token_attention_figure(tokens, attn),
            ),
        ],
    )
    section.numbers["token_attention_first_input"] = {"tokens": tokens, "mean_over_heads": attn.mean(1)}


def svm_table(summary: dict) -> Table:
    """Headline numbers of an attention-SVM head diagnostic."""
    rows = [
        ["queries in the SVM", summary["num_queries"]],
        ["SVM feasible", summary["feasible"]],
        ["corr(W_h, W_mm)", summary["correlation"]],
        ["corr in the span the inputs can see", summary["correlation_in_span"]],
        ["margin ratio min γ(W_h) / γ(W_mm) (≤ 1)", summary["margin_ratio"]],
        ["SVM margin 1/‖W_mm‖", summary["svm_margin"]],
        ["median head margin", summary["head_margin_median"]],
        [
            f"fraction of nearly one-hot queries (max prob ≥ {summary['one_hot_threshold']})",
            summary["one_hot_fraction"],
        ],
        ["the same over all query tokens", summary["one_hot_fraction_all"]],
    ]
    return Table("Attention-as-SVM head diagnostic", ["quantity", "value"], rows)


def svm_plots(diag) -> list[tuple[str, Any]]:
    """(caption, figure) pairs for an attention-SVM head diagnostic."""
    from hf_tdiag.viz import attention_svm as VA

    return [
        (
            "Head margins against the max-margin solution, and the largest attention per query",
            VA.plot_head_diagnostic(diag),
        )
    ]


SectionFn = Callable[[LoadedModel, "ReportInputs | None", ReportOptions], Section]
SECTIONS: dict[str, SectionFn] = {
    "summary": section_summary,
    "srr": section_srr,
    "schatten": section_schatten,
    "concepts": section_concepts,
    "attention": section_attention,
}
_TITLES = {
    "summary": "Model and predictions",
    "srr": "Sparse rate reduction per layer",
    "schatten": "Generalization-bound proxies (spectrum-adaptive Schatten vs Edelman)",
    "concepts": "Concept fidelity",
    "attention": "Attention maps and attention-as-SVM",
}


# ----------------------------------------------------------------------------- entry point


def build_report(
    model,
    inputs: ReportInputs | None = None,
    *,
    images: list | None = None,
    labels=None,
    sections: tuple[str, ...] | list[str] | None = None,
    options: ReportOptions | None = None,
    title: str | None = None,
    progress: bool = True,
) -> Report:
    """Run every section that applies to ``model`` (object, local folder or Hub id; ``trust_remote_code=False``).

    Inputs come either as a prepared :class:`ReportInputs` or as ``images`` (PIL images, with optional ``labels``)
    which are run through the model's image processor. ``sections`` selects a subset of
    ``("summary", "srr", "schatten", "concepts", "attention")``.
    """
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    options = options or ReportOptions()
    if not isinstance(options, ReportOptions):
        raise TypeError(f"options: expected a ReportOptions, got {type(options).__name__}")
    if inputs is None and images is not None:
        inputs = images_to_inputs(loaded, images, labels)
    if inputs is not None and not isinstance(inputs, ReportInputs):
        raise TypeError(f"inputs: expected a ReportInputs (or pass images=...), got {type(inputs).__name__}")
    keys = list(SECTION_ORDER if sections is None else sections)
    unknown = [k for k in keys if k not in SECTION_ORDER]
    if unknown:
        raise ValueError(f"sections: unknown {unknown}; expected a subset of {list(SECTION_ORDER)}")
    settings = {"model": str(loaded.source), **_resolved_options(loaded, options)}
    if inputs is not None:
        settings["inputs"] = f"{inputs.description} ({inputs.num_samples} samples)"
    settings["device"] = str(next(loaded.model.parameters()).device)
    settings["platform"] = f"{platform.platform()} · torch {torch.__version__}"
    report = Report(
        title=title or f"hf-tdiag report: {os.path.basename(str(loaded.source).rstrip('/')) or loaded.source}",
        model=str(loaded.source),
        settings=settings,
        created=_dt.datetime.now().isoformat(timespec="seconds"),
    )
    bar = tqdm(keys, desc="report", unit="section", disable=not progress)
    for key in bar:
        bar.set_postfix_str(key)
        fn = SECTIONS.get(key)
        start = time.perf_counter()
        if fn is None:
            section = _skip(key, _TITLES[key], "not available in this installation")
        else:
            try:
                section = fn(loaded, inputs, options)
            except (ValueError, TypeError) as err:
                section = Section(key, _TITLES[key], status="error", note=f"{type(err).__name__}: {err}")
            except Exception as err:  # noqa: BLE001 - one failing diagnostic must not lose the others
                logger.exception("report section %s failed", key)
                section = Section(key, _TITLES[key], status="error", note=f"{type(err).__name__}: {err}")
        section.numbers.setdefault("seconds", round(time.perf_counter() - start, 3))
        report.sections.append(section)
    return report


def _resolved_options(loaded: LoadedModel, options: ReportOptions) -> dict:
    """The options as the sections use them: the default layers (None) replaced by the layer actually used."""
    values = options.to_dict()
    try:
        num_layers = _arch(loaded).num_layers
    except (ValueError, TypeError, AttributeError):
        return values
    if values["concept_layer"] is None:
        values["concept_layer"] = f"{_default_concept_layer(num_layers)} (default: the middle block)"
    if values["attention_layer"] is None:
        values["attention_layer"] = f"{num_layers} (default: the last block)"
    return values


def images_to_inputs(loaded: LoadedModel, images: list, labels=None, description: str = "images") -> ReportInputs:
    """Run PIL images through the model's processor; ``labels`` (ints) are kept for accuracy."""
    if loaded.modality != "image":
        raise ValueError(f"images: {loaded.source!r} is a text model; images cannot be fed to it")
    pixel_values = pixel_values_for(list(images), loaded)
    label_tensor = None
    if labels is not None:
        label_tensor = torch.as_tensor(list(labels), dtype=torch.long)
        if label_tensor.shape != (pixel_values.shape[0],):
            raise ValueError(f"labels: expected {pixel_values.shape[0]} labels, got shape {tuple(label_tensor.shape)}")
    return ReportInputs(pixel_values, label_tensor, list(images), description)


__all__ = ["Report", "ReportInputs", "ReportOptions", "SECTIONS", "SECTION_ORDER", "build_report", "images_to_inputs"]
