"""The report's ``attention`` section: attention maps over the image or the tokens, and the attention-as-SVM
diagnostic of one head (table and figures shared with the Space)."""

from __future__ import annotations

import logging
from typing import Any

import torch

import hf_tdiag
from hf_tdiag.loading import LoadedModel

from .._validation import block_number
from ..viz import attention_maps
from .concept_section import patch_grid
from .html import Section, Table
from .options import ReportInputs, ReportOptions
from .section_tools import _add_figures, _arch, _forward, _skip

logger = logging.getLogger("hf_tdiag.report.report")


def section_attention_svm(loaded: LoadedModel, inputs: ReportInputs | None, options: ReportOptions) -> Section:
    title = "Attention maps and attention-as-SVM"
    if inputs is None:
        return _skip("attention_svm", title, "needs inputs: attention maps are computed on the inputs")
    arch = _arch(loaded)
    layer = arch.num_layers if options.attention_layer is None else options.attention_layer
    layer = block_number(layer, arch.num_layers, "attention_layer")
    section = Section("attention_svm", title)
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
    section.numbers["num_inputs"] = n
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
    tokens = display_tokens(loaded.processor, ids[:keep].tolist())
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


_SHOWN_WHITESPACE = {"\n": "↵", "\r": "↵", "\t": "⇥"}


def display_tokens(tokenizer, ids) -> list[str]:
    """Each token id as a person reads it on an axis: the tokenizer's own decoding of that one token (``Ġfor`` ->
    ``for``, ``Ċ`` -> ``↵``), surrounding spaces dropped, a token of spaces only shown as ``␣``; the raw token
    where one token is part of a character (``�``); the id itself without a tokenizer."""
    ids = [int(i) for i in ids]
    if tokenizer is None:
        return [str(i) for i in ids]
    raw = tokenizer.convert_ids_to_tokens(ids)
    out = []
    for i, token in zip(ids, raw):
        text = tokenizer.decode([i], clean_up_tokenization_spaces=False)
        if "\ufffd" in text or not text:
            out.append(str(token))
            continue
        text = "".join(_SHOWN_WHITESPACE.get(c, c) for c in text).strip(" ")
        out.append(text or "␣")
    return out


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
