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

from .._threads import measure_threads
from .registry import DIAGNOSTICS
from .settings import _Settings, resolve


def _settings_section(cls: type[_Settings]) -> str:
    lines = [
        f"Settings (keywords, or ``settings={cls.__name__}(...)``; a keyword given replaces the object's value):",
        *(f"    {f.name} (default ``{f.default!r}``): {f.help}; {f.constraint()}." for f in cls.fields()),
    ]
    return "\n".join(lines)


def _with_settings_section(doc: str | None, cls: type[_Settings]) -> str:
    """``doc`` with the settings section inserted before its ``Examples:`` (or appended)."""
    doc = inspect.cleandoc(doc or "")
    section = _settings_section(cls)
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


def _dataset_inputs(args: tuple, kwargs: dict, settings: _Settings) -> tuple[tuple, dict]:
    """A ``datasets`` object given as the inputs (second argument, or ``inputs=``) replaced by a DataLoader of its
    model-input columns (:func:`hf_tdiag.batching.dataset_batches`), in batches of the settings' ``batch_size``."""
    given = args[1] if len(args) > 1 else kwargs.get("inputs")
    if type(given).__module__.partition(".")[0] != "datasets":
        return args, kwargs
    from ..batching import dataset_batches, is_dataset

    if not is_dataset(given):
        return args, kwargs
    batches = dataset_batches(given, int(getattr(settings, "batch_size", 64)))
    if len(args) > 1:
        return (args[0], batches, *args[2:]), kwargs
    return args, {**kwargs, "inputs": batches}


def diagnostic_entry(cls: type[_Settings]):
    """Decorator: ``impl(..., *, settings: cls, ...)`` -> the public diagnostic taking ``settings=None`` and the
    fields of ``cls`` as keywords."""
    names = set(cls.defaults())
    kind = _threads_kind(cls)

    def wrap(impl):
        own = inspect.signature(impl).parameters
        open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in own.values())
        options = sorted(n for n, p in own.items() if p.kind is inspect.Parameter.KEYWORD_ONLY and n != "settings")

        @functools.wraps(impl)
        def entry(*args, settings=None, **kwargs):
            overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
            unknown = sorted(set(kwargs) - set(own))
            if unknown and not open_ended:
                raise TypeError(
                    f"{impl.__name__}: unknown keyword(s) {unknown}; settings ({cls.__name__}): {sorted(names)}; "
                    f"other options: {options}"
                )
            resolved = resolve(cls, settings, overrides)
            args, kwargs = _dataset_inputs(args, kwargs, resolved)
            with measure_threads(kind):
                return impl(*args, settings=resolved, **kwargs)

        params = []
        for p in inspect.signature(impl).parameters.values():
            if p.name == "settings":
                params.append(
                    p.replace(kind=inspect.Parameter.KEYWORD_ONLY, default=None, annotation=f"{cls.__name__} | None")
                )
                params += [
                    inspect.Parameter(
                        f.name,
                        inspect.Parameter.KEYWORD_ONLY,
                        default=f.default,
                        annotation=f.type | None if f.optional else f.type,
                    )
                    for f in cls.fields()
                ]
            else:
                params.append(p)
        params.sort(key=lambda p: p.kind)  # **kwargs of the implementation stays last
        entry.__signature__ = inspect.Signature(params, return_annotation=inspect.signature(impl).return_annotation)
        entry.__doc__ = _with_settings_section(impl.__doc__, cls)
        entry.settings_class = cls
        return entry

    return wrap


__all__ = ["diagnostic_entry", "thread_policy"]
