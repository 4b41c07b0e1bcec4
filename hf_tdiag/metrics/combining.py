"""What lets hf-tdiag's four `evaluate` modules run together under ``evaluate.combine``.

``evaluate.combine([...]).compute(**kwargs)`` hands every keyword to every module. Each module therefore takes
its own options plain (``layer=2``) or prefixed with its name (``attention_svm_layer=2``; the prefixed form wins),
and ignores, inside ``combine``, the options that only another bundled module takes. Called on its own, a module
refuses an option it does not take. ``layer`` is the same block number ℓ wherever it appears: concept fidelity
reads ``hidden_states[ℓ]`` (the output of block ℓ; 0 = the embeddings), attention-SVM the attention of block ℓ.

Every module's ``compute`` returns a flat dict of scalars (:func:`flat_scalars`); ``return_report=True`` adds the
full report as ``report``. :func:`kept_modes` leaves a caller's model in the train/eval mode it was found in.
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from .._caller_state import module_modes, restore_modes
from ..diagnostics.registry import DIAGNOSTICS, diagnostic, module_options

#: the options each bundled module takes besides its inputs: its diagnostic's settings and its own options
#: (derived from :mod:`hf_tdiag.diagnostics.registry`; a test checks them against each module's ``_compute``)
MODULE_OPTIONS: dict[str, tuple[str, ...]] = {d.metric: module_options(d.metric) for d in DIAGNOSTICS.values()}

#: what a module reads its model and inputs from (each module takes the ones it needs)
INPUT_NAMES = ("model", "models", "images", "texts", "pixel_values")

#: ``compute``'s default for ``predictions``/``references``: ``combine`` passes both as an explicit ``None``
ABSENT = object()


def called_by_combine(predictions, references) -> bool:
    """True when ``compute`` got ``predictions=None, references=None`` explicitly, as ``evaluate.combine`` sends."""
    return predictions is None and references is None


def route_options(
    name: str,
    kwargs: Mapping[str, Any],
    *,
    in_combine: bool,
    inputs: tuple[str, ...] = ("model",),
    options: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Module ``name``'s options out of ``kwargs``: its own (``options``, default ``MODULE_OPTIONS[name]``; plain or
    ``<name>_<option>``, the prefixed one wins) and its ``inputs``; in ``combine`` the other modules' options and
    inputs are dropped; anything else is a one-line error."""
    own = set(MODULE_OPTIONS[name] if options is None else options) | set(inputs)
    plain: dict[str, Any] = {}
    prefixed: dict[str, Any] = {}
    unknown = []
    for key, value in kwargs.items():
        owner = name if key.startswith(name + "_") and key[len(name) + 1 :] in own else _prefix_owner(key)
        if owner == name:
            prefixed[key[len(name) + 1 :]] = value
        elif owner is not None:
            continue
        elif key in own:
            plain[key] = value
        elif not (in_combine and (key in INPUT_NAMES or any(key in opts for opts in MODULE_OPTIONS.values()))):
            unknown.append(key)
    if unknown:
        raise TypeError(
            f"{name}: unknown argument(s) {sorted(unknown)}; it takes {', '.join(sorted(own))} "
            f"(plain or as {name}_<option>)"
        )
    return {**plain, **prefixed}


def _prefix_owner(key: str) -> str | None:
    for module, options in MODULE_OPTIONS.items():
        if key.startswith(module + "_") and key[len(module) + 1 :] in options:
            return module
    return None


def compute_options(module) -> tuple[str, ...]:
    """The options of an evaluate module: its ``_compute`` keywords besides its inputs, and, where ``_compute``
    takes ``**settings``, its diagnostic's settings fields."""
    skip = {"self", "inputs", "pixel_values", *INPUT_NAMES}
    params = inspect.signature(module._compute).parameters.values()
    own = tuple(p.name for p in params if p.name not in skip and p.kind is not inspect.Parameter.VAR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        own += diagnostic(module.metric_label).keywords()
    return own


def flat_scalars(mapping: Mapping[str, Any], prefix: str = "", suffix: str = "") -> dict[str, Any]:
    """The numbers of ``mapping`` as one flat dict: nested dicts joined with ``_``, lists, strings and None left out."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_scalars(value, f"{name}_", suffix))
        elif isinstance(value, bool):
            out[f"{name}{suffix}"] = value
        elif isinstance(value, numbers.Integral):
            out[f"{name}{suffix}"] = int(value)
        elif isinstance(value, numbers.Real):
            out[f"{name}{suffix}"] = float(value)
    return out


def per_layer_scalars(values: Mapping[str, Iterable[float]], layers: Iterable[int]) -> dict[str, float]:
    """``{term: [v_1, ..., v_L]}`` as ``{term_layer_1: v_1, ...}``."""
    layers = list(layers)
    return {f"{term}_layer_{l}": float(v) for term, vs in values.items() for l, v in zip(layers, vs)}


@contextlib.contextmanager
def kept_modes(*models):
    """Restore the train/eval flag of every submodule of each ``torch.nn.Module`` in ``models`` on exit."""
    saved = [pair for model in models for pair in module_modes(model)]
    try:
        yield
    finally:
        restore_modes(saved)


__all__ = [
    "ABSENT",
    "INPUT_NAMES",
    "MODULE_OPTIONS",
    "called_by_combine",
    "compute_options",
    "flat_scalars",
    "kept_modes",
    "per_layer_scalars",
    "route_options",
]
