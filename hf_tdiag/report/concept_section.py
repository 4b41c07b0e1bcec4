"""The report's ``concepts`` section: Semi-NMF concepts of an image classifier's patch tokens (or a decoder's token
states), their fidelity numbers, the KL against both bounds, and the concept figures (shared with the Space)."""

from __future__ import annotations

import logging
import re
from typing import Any

import torch

import hf_tdiag
from hf_tdiag.loading import LoadedModel

from .._meaning import concept_bound_flags, concept_intervals
from ..viz.concept_fidelity import token_codes_figure
from .html import Section, Table
from .options import ReportInputs, ReportOptions
from .section_tools import _TITLES, _add_figures, _arch, _skip

logger = logging.getLogger("hf_tdiag.report.report")

_BOUND_WORDS = {
    "bound_certified": "Certified",
    "bound_certified_chain": "Certified chain",
    "bound_estimated": "Estimated",
}


def num_classes(loaded: LoadedModel, result) -> int | None:
    """C of the KL bounds' vacuity rule: the width of the logits the KL compares (classes, or a decoder's
    vocabulary)."""
    tensors = getattr(result, "tensors", None) or {}
    logits = tensors.get("logits")
    if logits is not None:
        return int(logits.shape[-1])
    return result.get("num_classes") or getattr(loaded.config, "num_labels", None)


def fidelity_rows(result: dict, flags: dict | None = None) -> list[list]:
    """(quantity, value) rows of a concept_fidelity report: errors, KL, bound and its constants; a row saying why
    after each bound in ``flags`` (:func:`hf_tdiag._meaning.concept_bound_flags`)."""
    rows = _fidelity_rows(result)
    names = {
        "bound_certified": "KL bound, certified constants (mean)",
        "bound_certified_chain": "KL bound, certified chain",
        "bound_estimated": "KL bound, estimated constants (mean)",
    }
    for key, reason in (flags or {}).items():
        at = next(i for i, row in enumerate(rows) if row[0].startswith(names[key]))
        label, why = _short_reason(reason)
        rows.insert(at + 1, [f"↳ {names[key].split(' (')[0]}: {why}", label])
    return rows


def _short_reason(reason: str) -> tuple[str, str]:
    """A table row's form of a one-line label: ``("vacuous", "above log C = 2.3")`` (the whole line is in the
    section's text)."""
    found = re.search(r"^(\w+): .*? is (above log C = [^ ]+)", reason)
    return (found.group(1), found.group(2)) if found else (reason.split(":", 1)[0], reason.split(":", 1)[-1].strip())


def _fidelity_rows(result: dict) -> list[list]:
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


def _concept_layer(num_layers: int, options: ReportOptions) -> int:
    """The layer the options name, else the middle block."""
    return _default_concept_layer(num_layers) if options.concept_layer is None else int(options.concept_layer)


def _fit(loaded: LoadedModel, data, layer: int, options: ReportOptions, **extra):
    """Concepts of ``data`` at ``layer`` with the report's settings: (result, flags on the bounds, table rows)."""
    result = hf_tdiag.concept_fidelity(
        loaded.model,
        data,
        layer,
        options.n_concepts,
        power_iters=options.concept_power_iters,
        max_images_for_constants=options.concept_constant_images,
        return_tensors=True,
        progress=False,
        **extra,
    )
    flags = concept_bound_flags(result, num_classes(loaded, result))
    return result, flags, fidelity_rows(result, flags)


def section_concept_fidelity(loaded: LoadedModel, inputs: ReportInputs | None, options: ReportOptions) -> Section:
    title = _TITLES["concept_fidelity"]
    if _arch(loaded).family == "crate_text":
        from hf_tdiag.probes.families.crate_text import CONCEPTS_REFUSAL

        return _skip("concept_fidelity", title, CONCEPTS_REFUSAL.removeprefix("model: "))
    if inputs is not None and inputs.texts and _arch(loaded).causal:
        return decoder_concepts_section(loaded, inputs, options)
    if inputs is None or loaded.modality != "image":
        return _skip(
            "concept_fidelity", title, "needs image inputs: concepts are fitted on a layer's patch-token activations"
        )
    if not loaded.is_classifier:
        return _skip(
            "concept_fidelity", title, "needs an image classifier (the bound is about the classifier's output)"
        )
    layer = _concept_layer(int(loaded.config.num_hidden_layers), options)
    result, flags, rows = _fit(loaded, inputs.batch, layer, options)
    tensors = result.tensors
    section = Section(
        "concept_fidelity",
        title,
        summary=(
            f"Semi-NMF with {result['n_concepts']} concepts of the patch tokens after block {layer} "
            f"({result['n_images']} images × {result['n_tokens']} tokens × {result['hidden_size']} dims). "
            "The empirical KL replaces the layer's patch tokens by their reconstruction Â (CLS untouched) and runs "
            "the remaining blocks and the head; the bound is "
            "½(‖W_c‖_op L_readout)² · L_block^{2L_suf} · (√N δ_rec + α‖G‖_F δ_gram)², once with certified constants "
            "(upper bounds on the ball the reconstruction provably stays in; the derivation is in the package's "
            "docs, concept_bound.md) and once with local estimates."
            + "".join(f" {_BOUND_WORDS[k]} bound: {reason}." for k, reason in flags.items())
        ),
        tables=[Table("Fidelity", ["quantity", "value"], rows)],
        numbers={**result, "intervals": concept_intervals(result), "flags": flags},
    )
    _add_figures(section, lambda: concept_plots(loaded, inputs.batch, tensors["codes"], result))
    return section


def decoder_concepts_section(loaded: LoadedModel, inputs: ReportInputs, options: ReportOptions) -> Section:
    """Concepts of a decoder LLM's token states on the report's texts (see :mod:`hf_tdiag.probes.concept_decoder`)."""
    layer = _concept_layer(int(_arch(loaded).num_layers), options)
    result, flags, rows = _fit(loaded, list(inputs.texts), layer, options, tokenizer=loaded.processor)
    tensors = result.tensors
    section = Section(
        "concept_fidelity",
        _TITLES["concept_fidelity"],
        summary=(
            f"Semi-NMF with {result['n_concepts']} concepts of the token states after block {layer} "
            f"({result['n_images']} texts × {result['n_tokens']} tokens × {result['hidden_size']} dims; every text cut "
            "to the shortest one's token count, special tokens kept aside). The empirical KL replaces those states by "
            "their reconstruction Â, runs the remaining blocks (causal) and compares the next-token distributions of "
            "the last token (final norm + LM head); the bound ½(‖W_c‖_op L_readout)² · L_block^{2L_suf} · "
            "(√N δ_rec + α‖G‖_F δ_gram)² uses local estimates of its constants. Certified bound: "
            f"{result.get('bound_certified_note', 'see the table')}."
            + "".join(f" {_BOUND_WORDS[k]} bound: {reason}." for k, reason in flags.items())
        ),
        tables=[Table("Fidelity", ["quantity", "value"], rows)],
        numbers={**result, "intervals": concept_intervals(result), "flags": flags},
    )

    def figures():
        out = []
        if tensors["codes"] is not None:
            ids = loaded.processor(list(inputs.texts[:1]), add_special_tokens=False)["input_ids"][0]
            from .attention_section import display_tokens

            tokens = display_tokens(loaded.processor, ids[: result["n_tokens"]])
            codes = tensors["codes"].reshape(result["n_images"], result["n_tokens"], -1)[0]
            out.append(
                (f"Concept codes of the first text's tokens after block {layer}", token_codes_figure(tokens, codes))
            )
        if "bound_estimated" in result.get("per_image", {}):
            from hf_tdiag.viz import concept_fidelity as VC

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


MAX_SHOWN_CONCEPTS = 6


def shown_concepts(codes, limit: int = MAX_SHOWN_CONCEPTS) -> list[int]:
    """The concepts the figures show: at most ``limit``, the largest mean code first, only concepts active on some
    patch (a code above 0)."""
    flat = torch.as_tensor(codes).reshape(-1, codes.shape[-1]).double()
    order = torch.argsort(flat.mean(0), descending=True, stable=True).tolist()
    active = set(_active(flat))
    return [k for k in order if k in active][:limit]


def _active(flat) -> list[int]:
    return [k for k in range(flat.shape[-1]) if float(flat[:, k].max()) > 0]


def _listed(ks) -> str:
    return ", ".join(str(k) for k in ks)


def shown_concepts_note(codes, shown: list[int]) -> str:
    """One sentence: which concepts the figures show of how many, and why the others are left out (never active on
    these inputs, or weaker than the ones shown)."""
    flat = torch.as_tensor(codes).reshape(-1, codes.shape[-1]).double()
    total = flat.shape[-1]
    inactive = [k for k in range(total) if k not in set(_active(flat))]
    weaker = [k for k in range(total) if k not in shown and k not in inactive]
    words = f"Shown: {len(shown)} of {total} concepts ({_listed(sorted(shown))}), largest mean code first"
    if inactive:
        words += (
            f"; {len(inactive)} of {total} concepts ({_listed(inactive)}) are active on no patch of these inputs "
            "(every code 0)"
        )
    if weaker:
        words += f"; left out as weaker (smaller mean code): {_listed(weaker)}"
    return words + "."


def concept_plots(loaded: LoadedModel, pixel_values: torch.Tensor, codes, result: dict) -> list[tuple[str, Any]]:
    """(caption, matplotlib figure) pairs: concept heatmaps, top-activating patches, KL vs bound (if computed)."""
    from hf_tdiag.viz import concept_fidelity as VC

    out = []
    if codes is not None:
        grid = patch_grid(loaded.config, pixel_values)
        codes = codes.reshape(result["n_images"], result["n_tokens"], -1)
        shown = shown_concepts(codes)
        note = shown_concepts_note(codes, shown)
    if codes is not None and shown:
        out.append(
            (
                f"Concept codes over the patch grid after block {result['layer']} (first images). {note}",
                VC.plot_concept_heatmaps(pixel_values, codes, grid, n_images=4, concepts=shown),
            )
        )
        out.append(
            (
                "Top-activating patches per concept (cyan box; value = code)",
                VC.plot_top_patches(pixel_values, codes, grid, concepts=shown, top=8),
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
