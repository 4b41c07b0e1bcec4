"""The public entry of a diagnostic: settings from an object and keywords by one rule, with the signature and the
docstring derived from the settings class.

A diagnostic's implementation takes ``settings`` (a validated settings object) and its own arguments;
:func:`diagnostic_entry` turns it into the public function, which accepts ``settings=`` and every field of the
settings class as a keyword: a keyword given always replaces the object's value (:func:`~.settings.resolve`).
``inspect.signature`` and ``help()`` show each field as a keyword-only parameter with its default. The call runs
under the thread policy its declaration names (:data:`~.registry.DIAGNOSTICS`' ``threads``): the one place a
diagnostic's thread count is decided; the measures below set none.
"""

from __future__ import annotations

import functools
import inspect
import os

from .._caller_state import restore_modes
from .._threads import measure_threads
from .registry import DIAGNOSTICS
from .settings import _Settings, resolve


def _settings_section(cls: type[_Settings]) -> str:
    lines = [
        f"Settings (keywords, or ``settings={cls.__name__}(...)``; a keyword given replaces the object's value):",
        *(f"    {f.name} (default ``{f.default!r}``): {f.help}; {f.constraint()}." for f in cls.fields()),
    ]
    return "\n".join(lines)


#: what every diagnostic that measures inputs accepts as its model and inputs (appended to its docstring)
INPUTS_SECTION = (
    "Model and inputs: the model is a Transformers model, a local folder or a Hub id (loaded with its processor; "
    "the repository's own code runs only with ``trust_remote_code=True``); the inputs are model inputs (a tensor, a "
    "dict batch, a DataLoader or an iterable of batches), a ``datasets`` object whose columns are model inputs "
    "(``pixel_values`` or ``input_ids``: its other columns are left out), or raw PIL images or strings, which the "
    "model's processor or tokenizer (``tokenizer=`` where none is saved beside it) encodes ``batch_size`` at a time "
    "(:func:`hf_tdiag.batching.model_and_inputs`)."
)


def _with_settings_section(doc: str | None, cls: type[_Settings], takes_inputs: bool = False) -> str:
    """``doc`` with the settings section (and, for a diagnostic that measures inputs, :data:`INPUTS_SECTION`)
    inserted before its ``Examples:`` (or appended)."""
    doc = inspect.cleandoc(doc or "")
    section = _settings_section(cls) + (f"\n\n{INPUTS_SECTION}" if takes_inputs else "")
    head, sep, tail = doc.partition("\nExamples:")
    if sep:
        return f"{head.rstrip()}\n\n{section}\n{sep}{tail}"
    return f"{doc}\n\n{section}"


def thread_policy(name: str):
    """The thread policy diagnostic ``name``'s call runs under, as a context manager (for code that calls its
    measures directly, such as the benchmarks, to run them as the diagnostic does)."""
    return measure_threads(DIAGNOSTICS[name].threads)


def _threads_kind(cls: type[_Settings]) -> str:
    kinds = {d.threads for d in DIAGNOSTICS.values() if d.settings is cls}
    if len(kinds) != 1:
        raise TypeError(f"{cls.__name__}: expected one diagnostic declared with it in DIAGNOSTICS, got {len(kinds)}")
    return kinds.pop()


def _model_and_inputs(impl_params, args: tuple, kwargs: dict, settings: _Settings, loading: dict):
    """``(args, kwargs, modes)``: the model and inputs arguments made ready (:func:`hf_tdiag.batching.model_and_inputs`:
    a model path loaded, raw images or strings encoded, a ``datasets`` object read as batches), and the model
    object's module modes to restore after the call (loading sets eval mode), or None where nothing was loaded."""
    args, kwargs = list(args), dict(kwargs)

    def get(position: int, name: str):
        return args[position] if len(args) > position else kwargs.get(name)

    def put(position: int, name: str, value) -> None:
        if len(args) > position:
            args[position] = value
        elif name in kwargs:
            kwargs[name] = value

    model, given = get(0, "model"), get(1, "inputs")
    is_path = isinstance(model, (str, os.PathLike))
    maybe_raw = isinstance(given, (list, tuple)) and bool(given)
    if not (is_path or maybe_raw or type(given).__module__.partition(".")[0] == "datasets"):
        return tuple(args), kwargs, None
    from .._caller_state import module_modes
    from ..batching import model_and_inputs

    takes_tokenizer = "tokenizer" in impl_params
    modes = None if is_path else module_modes(model)
    model, given, tokenizer = model_and_inputs(
        model,
        given,
        int(getattr(settings, "batch_size", 64)),
        tokenizer=kwargs.get("tokenizer", loading.get("tokenizer")),
        trust_remote_code=bool(loading.get("trust_remote_code", False)),
        encode_texts=not takes_tokenizer,  # a diagnostic with its own tokenizer= reads strings itself
    )
    put(0, "model", model)
    put(1, "inputs", given)
    if takes_tokenizer and tokenizer is not None:
        kwargs["tokenizer"] = tokenizer
    return tuple(args), kwargs, modes


def _public_signature(impl, cls: type[_Settings], entry_only: list[str]) -> inspect.Signature:
    """The implementation's signature with ``settings=None``, every settings field as a keyword-only parameter with
    its default, and the entry's own keywords (``entry_only``)."""
    params = []
    for p in inspect.signature(impl).parameters.values():
        if p.name != "settings":
            params.append(p)
            continue
        params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, default=None, annotation=f"{cls.__name__} | None"))
        params += [
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=f.default,
                annotation=f.type | None if f.optional else f.type,
            )
            for f in cls.fields()
        ]
    params += [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None if name == "tokenizer" else False)
        for name in entry_only
    ]
    params.sort(key=lambda p: p.kind)  # **kwargs of the implementation stays last
    return inspect.Signature(params, return_annotation=inspect.signature(impl).return_annotation)


def diagnostic_entry(cls: type[_Settings]):
    """Decorator: ``impl(..., *, settings: cls, ...)`` -> the public diagnostic taking ``settings=None`` and the
    fields of ``cls`` as keywords."""
    names = set(cls.defaults())
    kind = _threads_kind(cls)
    takes_inputs = bool(next(d for d in DIAGNOSTICS.values() if d.settings is cls).inputs)

    def wrap(impl):
        own = inspect.signature(impl).parameters
        # keywords the entry takes for the implementation: trust_remote_code, and tokenizer where it has none
        entry_only = [n for n in ("trust_remote_code", "tokenizer") if n not in own] if takes_inputs else []
        open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in own.values())
        options = sorted(n for n, p in own.items() if p.kind is inspect.Parameter.KEYWORD_ONLY and n != "settings")

        @functools.wraps(impl)
        def entry(*args, settings=None, **kwargs):
            # how a model path and raw strings are read (keywords of every diagnostic that measures inputs)
            loading = {k: kwargs.pop(k, None if k == "tokenizer" else False) for k in entry_only}
            overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
            unknown = sorted(set(kwargs) - set(own))
            if unknown and not open_ended:
                raise TypeError(
                    f"{impl.__name__}: unknown keyword(s) {unknown}; settings ({cls.__name__}): {sorted(names)}; "
                    f"other options: {options}"
                )
            resolved = resolve(cls, settings, overrides)
            modes = None
            if takes_inputs:
                args, kwargs, modes = _model_and_inputs(own, args, kwargs, resolved, loading)
            try:
                with measure_threads(kind):
                    return impl(*args, settings=resolved, **kwargs)
            finally:
                if modes is not None:
                    restore_modes(modes)

        entry.__signature__ = _public_signature(impl, cls, entry_only)
        entry.__doc__ = _with_settings_section(impl.__doc__, cls, takes_inputs)
        entry.settings_class = cls
        return entry

    return wrap


__all__ = ["INPUTS_SECTION", "diagnostic_entry", "thread_policy"]
