"""The report's headline box: each key number with its sample count, its 95% interval where it is an estimate from
samples, and a ``vacuous`` / ``degenerate`` label with the one-line reason where it cannot be read as a measurement.

The sections put what this needs into their ``numbers``: counts (``num_samples``, ``n_images``, ...), intervals under
``intervals`` (name -> ``[low, high]``) and labels under ``flags`` (name -> one-line reason starting with the label);
the rules are :mod:`hf_tdiag._meaning`'s.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: (section, label, path into ``Section.numbers``, kind): kind "percent" or "number"
HEADLINE = (
    ("summary", "top-1 accuracy", ("accuracy",), "percent"),
    ("summary", "next-token perplexity", ("next_token_perplexity",), "number"),
    ("srr", "SRR, last block", ("summary", "srr_last_layer"), "number"),
    ("srr", "SRR, mean over blocks", ("summary", "srr_mean_over_layers"), "number"),
    ("schatten", "B_Schatten (Schatten proxy)", ("schatten_bound",), "number"),
    ("schatten", "B_Edelman", ("edelman_bound",), "number"),
    ("concept_fidelity", "concept KL (mean)", ("kl",), "number"),
    ("concept_fidelity", "KL bound, certified", ("bound_certified",), "number"),
    ("concept_fidelity", "KL bound, estimated", ("bound_estimated",), "number"),
    ("concept_fidelity", "top-1 agreement with concepts", ("top1_agreement",), "percent"),
    ("attention_svm", "corr(W_h, W_mm)", ("attention_svm", "correlation"), "number"),
    ("attention_svm", "margin ratio (≤ 1)", ("attention_svm", "margin_ratio"), "number"),
)


def _count(key: str, name: str, numbers: dict) -> str:
    """What the number was measured on, in words ('' where the section did not record it)."""
    if key == "summary" and name == "accuracy":
        n, correct = numbers.get("num_labeled"), numbers.get("num_correct")
        return f"{correct:,} of {n:,} labelled inputs" if n is not None and correct is not None else ""
    if key == "summary":
        n, tokens = numbers.get("num_inputs"), numbers.get("num_tokens")
        return f"n = {n:,} texts, {tokens:,} predicted tokens" if n is not None and tokens is not None else ""
    if key == "srr":
        n = numbers.get("num_samples")
        return f"n = {n:,} samples" if n is not None else ""
    if key == "schatten":
        n = len(numbers.get("matrices") or [])
        return f"from the weights of {n:,} matrices (no inputs)" if n else "from the weights (no inputs)"
    if key == "concept_fidelity":
        n, unit = numbers.get("n_images"), "texts" if numbers.get("modality") == "text" else "images"
        count = f"n = {n:,} {unit}" if n is not None else ""
        if name == "bound_estimated":
            return "local estimates of its constants, not a proven bound" + (f"; {count}" if count else "")
        return count
    if key == "attention_svm":
        queries, n = (numbers.get("attention_svm") or {}).get("num_queries"), numbers.get("num_inputs")
        return f"{queries:,} queries of {n:,} inputs, one head" if queries is not None and n is not None else ""
    return ""


def _interval(kind: str, bounds) -> str:
    lo, hi = (float(v) for v in bounds)
    if kind == "percent":
        return f"95% CI {lo:.1%}–{hi:.1%}"
    from .html import format_value

    return f"95% CI {format_value(lo)} to {format_value(hi)}"


def key_numbers(sections) -> list[dict[str, Any]]:
    """The key numbers of the sections that ran, in page order: ``{"label", "value" (formatted), "section",
    "detail" (count and interval), "flag" ("" or e.g. "vacuous"), "reason" (one line, "" when not flagged)}``."""
    from .html import format_value

    by_key = {s.key: s for s in sections if s.status == "ok"}
    out = []
    for key, label, path, kind in HEADLINE:
        numbers = by_key[key].numbers if key in by_key else None
        value = numbers
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not math.isfinite(value):
            continue
        name = path[-1]
        detail = _count(key, name, numbers)
        bounds = (numbers.get("intervals") or {}).get(name)
        if bounds is not None:
            detail = " · ".join(filter(None, [detail, _interval(kind, bounds)]))
        reason = (numbers.get("flags") or {}).get(name, "")
        out.append(
            {
                "label": label,
                "value": f"{float(value):.1%}" if kind == "percent" else format_value(float(value)),
                "section": key,
                "detail": detail,
                "flag": reason.split(":", 1)[0] if reason else "",
                "reason": reason,
            }
        )
    return out


__all__ = ["HEADLINE", "key_numbers"]
