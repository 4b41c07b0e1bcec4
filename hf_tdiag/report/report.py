"""``build_report``: every diagnostic that applies to a model, on one self-contained HTML page plus a JSON file.

Sections (each one wires a public API of hf_tdiag to its figures; no math here):

* ``summary``   — architecture, predictions on the inputs (accuracy when labels are known);
* ``srr``       — per-layer sparse rate reduction (:func:`hf_tdiag.layer_srr`), vision and text models;
* ``schatten``  — spectrum-adaptive vs Edelman bound proxies (:func:`hf_tdiag.schatten_bounds`), any encoder;
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
import math
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
from hf_tdiag.loading import LoadedModel, load_model, pixel_values_for

from .._defaults import REPORT_SECTIONS
from .._meaning import degenerate_reason, mean_interval, wilson_interval
from .._progress import tqdm
from ..viz import images
from .attention_section import section_attention_svm
from .concept_section import _default_concept_layer, section_concept_fidelity
from .html import Figure, Section, Table, dumps, render_html, to_jsonable
from .ledger_section import section_objective_ledger
from .options import ReportInputs, ReportOptions
from .section_tools import _TITLES, _add_figures, _arch, _forward, _png, _skip

logger = logging.getLogger(__name__)

SECTION_ORDER = REPORT_SECTIONS


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


def _architecture(loaded: LoadedModel) -> tuple[list[list], dict[str, Any]]:
    """The architecture table's rows and the summary's numbers about the model itself."""
    arch = _arch(loaded)
    params = sum(p.numel() for p in loaded.model.parameters())
    rows = [
        ["source", str(loaded.source)],
        ["model type", loaded.model_type],
        ["family", arch.family],
        ["variant", getattr(loaded.config, "variant", "—") if arch.family == "crate" else "—"],
        ["layers", arch.num_layers],
        ["heads × head dim", f"{arch.num_heads} × {arch.head_dim}"],
        ["hidden size", arch.hidden_size],
        ["parameters", params],
        ["input", loaded.modality],
    ]
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
        kv = f"{arch.num_kv_heads} ({arch.num_heads // arch.num_kv_heads})"
        rows[6:6] = [["key/value heads (query heads per K/V head)", kv], ["attention", "causal"]]
        numbers.update(causal=True, num_kv_heads=arch.num_kv_heads)
    return rows, numbers


def _perplexity_summary(logits: torch.Tensor, batch: dict, numbers: dict) -> str:
    """Next-token perplexity on a causal model's inputs into ``numbers``; the summary's sentence."""
    nll = next_token_nll(logits, batch)
    numbers["next_token_perplexity"] = next_token_perplexity(logits, batch)
    numbers["num_tokens"] = int(nll.numel())
    interval = mean_interval(float(nll.mean()), float(nll.std(correction=1)) if nll.numel() > 1 else 0.0,
                             nll.numel(), ddof=1)  # fmt: skip
    if interval is not None:  # exp of the mean NLL's interval (tokens taken as independent)
        numbers.setdefault("intervals", {})["next_token_perplexity"] = [math.exp(v) for v in interval]
    return (
        f" Next-token perplexity on them: {numbers['next_token_perplexity']:.4g} "
        f"({numbers['num_tokens']:,} predicted tokens)."
    )


def _prediction_summary(loaded: LoadedModel, inputs: ReportInputs, logits: torch.Tensor, section: Section,
                        numbers: dict) -> str:  # fmt: skip
    """A classifier's predictions (and accuracy, with labels) into ``numbers``, the first images' figure into
    ``section``; the summary's sentence."""
    conf, pred = logits.softmax(-1).max(-1)
    id2label = loaded.config.id2label
    numbers["predictions"] = pred.tolist()
    numbers["confidence"] = conf.tolist()
    sentence = ""
    if inputs.labels is not None:
        correct, n = int((pred == inputs.labels).sum()), int(inputs.labels.numel())
        numbers.update(accuracy=correct / n, num_correct=correct, num_labeled=n)
        lo, hi = wilson_interval(correct, n)
        numbers.setdefault("intervals", {})["accuracy"] = [lo, hi]
        sentence = (
            f" Top-1 accuracy on them: {correct / n:.1%} ({correct} of {n}; Wilson 95% interval {lo:.1%}–{hi:.1%})."
        )
    if inputs.images:
        k = min(16, len(inputs.images))
        truths = [str(id2label.get(int(t), int(t))) for t in inputs.labels[:k]] if inputs.labels is not None else None
        fig = images.predictions_figure(
            inputs.images[:k], [str(id2label.get(int(p), int(p))) for p in pred[:k]], conf[:k].tolist(), truths
        )
        section.figures.append(Figure("Predicted label (probability) of the first inputs", _png(fig)))
    return sentence


def section_summary(loaded: LoadedModel, inputs: ReportInputs | None, options: ReportOptions) -> Section:
    rows, numbers = _architecture(loaded)
    section = Section("summary", "Model and predictions", tables=[Table("Architecture", ["property", "value"], rows)])
    section.numbers = numbers
    if inputs is None:
        section.summary = "No inputs were given: only weight-based diagnostics apply."
        return section
    numbers["num_inputs"] = inputs.num_samples
    section.summary = f"Inputs: {inputs.description} ({inputs.num_samples} samples)."
    logits, _ = _forward(loaded, inputs)
    if logits is not None and numbers.get("causal") and logits.ndim == 3 and isinstance(inputs.batch, dict):
        section.summary += _perplexity_summary(logits, inputs.batch, numbers)
    if logits is not None and loaded.is_classifier:
        section.summary += _prediction_summary(loaded, inputs, logits, section, numbers)
    return section


def next_token_perplexity(logits: torch.Tensor, batch: dict) -> float:
    """``exp`` of the mean cross-entropy of token t+1 given tokens ≤ t over the real (unpadded) tokens."""
    nll = next_token_nll(logits, batch)
    return float(torch.exp(nll.mean())) if nll.numel() else 1.0


def next_token_nll(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """The cross-entropy of each real token t+1 given tokens ≤ t (float64; padded positions left out)."""
    ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else mask
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].double().flatten(0, 1), ids[:, 1:].flatten(), reduction="none"
    )
    keep = (mask[:, 1:] * mask[:, :-1]).flatten().bool()
    return nll[keep]


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
        numbers={**report.to_dict(), "intervals": srr_intervals(report)},
    )
    from hf_tdiag import viz

    name = getattr(loaded.config, "variant", None) or loaded.model_type
    _add_figures(
        section,
        lambda: [("Per-layer R, Rᶜ, sparsity and SRR (mean ± std over samples)", viz.plot_layer_srr({name: report}))],
    )
    return section


def srr_intervals(report) -> dict[str, list[float]]:
    """95% intervals of the SRR summary's two headline means over samples (primary state): the last block's from its
    per-sample spread, the mean over blocks' from each sample's own mean over blocks (when the samples are kept)."""
    state, n = report.states[0], report.num_samples
    out = {}
    last = mean_interval(report.mean[state]["srr"][-1], report.std[state]["srr"][-1], n, ddof=0)
    if last is not None:
        out["srr_last_layer"] = list(last)
    if report.values is not None and n >= 2:
        per_sample = report.values[:, 0, :, 3].double().mean(-1)  # (n,) each sample's SRR averaged over blocks
        out["srr_mean_over_layers"] = list(
            mean_interval(float(per_sample.mean()), float(per_sample.std(correction=1)), n, ddof=1)
        )
    return out


def section_schatten(loaded: LoadedModel, inputs: ReportInputs | None, options: ReportOptions) -> Section:
    report = hf_tdiag.schatten_bounds(loaded.model, L_phi=options.L_phi)
    rows = report.matrix_rows(no_head="—")
    note = report.degenerate_note()
    breakdown = report.breakdown_tables()
    section = Section(
        "schatten",
        "Generalization-bound proxies (spectrum-adaptive Schatten vs Edelman)",
        summary=(
            f"Spectrum-adaptive proxy B_Schatten = {report.schatten_bound:.6g}; Edelman et al. proxy B_Edelman = "
            f"{report.edelman_bound:.6g} (ratio {report.edelman_bound / report.schatten_bound:.3g}×), from the weights alone "
            f"({len(report.matrices)} matrices, L_φ = {report.L_phi})." + (f" {note}" if note else "")
        ),
        tables=[
            Table(
                "Σ c(W, p) per matrix type at fixed p (B_Schatten takes the minimum per matrix)", *breakdown["types"]
            ),
            Table("Layer gains f_ℓ and propagation factors α_ℓ", *breakdown["layers"]),
            Table(
                "Per-matrix spectra and optimal p (κ↓: factor on γα_ℓL at which a larger p would win)",
                ["layer", "head", "type", "rank", "‖W‖₂", "stable rank", "p_opt", "min_p c(W,p)", "κ↓"],
                rows,
                collapsed=True,
            ),
        ],
        numbers={
            **report.to_dict(include_spectra=False),
            "flags": {"schatten_bound": degenerate_reason(len(report.matrices))} if report.degenerate else {},
        },
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


SectionFn = Callable[[LoadedModel, "ReportInputs | None", ReportOptions], Section]
SECTIONS: dict[str, SectionFn] = {
    "summary": section_summary,
    "srr": section_srr,
    "schatten": section_schatten,
    "concept_fidelity": section_concept_fidelity,
    "attention_svm": section_attention_svm,
    "objective_ledger": section_objective_ledger,
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
    ``("summary", "srr", "schatten", "concept_fidelity", "attention_svm", "objective_ledger")``.
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
    options.check(loaded.model, keys)  # the layer, head and concept count fit the model: before any section runs
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
    # one bar for the whole report, advanced after each section; each section's start is drawn at once with the
    # sections done so far ("2/6 [schatten]"; outside a terminal one plain line per section)
    bar = tqdm(total=len(keys), desc="report", unit="section", disable=not progress, postfix=keys[0] if keys else None)
    try:
        for i, key in enumerate(keys):
            if i:
                bar.set_postfix_str(key)
            report.sections.append(_run_section(key, loaded, inputs, options))
            bar.update(1)
        bar.set_postfix_str("done", refresh=False)
    finally:
        bar.close()
    return report


def _run_section(key: str, loaded: LoadedModel, inputs: ReportInputs | None, options: ReportOptions) -> Section:
    """One section, timed; a failure becomes an ``error`` section with the message (the others still run)."""
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
    return section


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
