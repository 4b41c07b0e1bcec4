"""The Space's controls of a diagnostic's settings, derived from the fields declared with ``space=`` in
:mod:`hf_tdiag.diagnostics.settings`.

:func:`settings_controls` builds one Gradio component per such field (a slider where the declaration gives
``minimum``/``maximum``, a dropdown for choices, a checkbox for a switch, a number box otherwise), and
:func:`takes_settings` turns a handler ``fn(..., settings, ...)`` into one whose signature has those fields, in
declaration order, in place of ``settings`` — so the layout wires ``[..., *settings_controls(cls), ...]`` in the
same order, and a field marked for the Space reaches the diagnostic with no other edit.
"""

from __future__ import annotations

import functools
import inspect
import numbers

import gradio as gr

from hf_tdiag.inputs import UserInputError


def space_fields(cls):
    """The fields of settings class ``cls`` declared for the Space, in order."""
    return [f for f in cls.fields() if f.space is not None]


def _control(f):
    options = dict(f.space)
    label = options.pop("label", f"{f.name}: {f.help}")
    if "minimum" in options and "maximum" in options:
        return gr.Slider(value=f.default, label=label, **options)
    if f.choices is not None:
        return gr.Dropdown(choices=list(f.choices), value=f.default, label=label, **options)
    if f.type is bool:
        return gr.Checkbox(value=f.default, label=label, **options)
    return gr.Number(value=f.default, label=label, precision=0 if f.type is int else None, **options)


def settings_controls(cls) -> list:
    """One Gradio component per field of ``cls`` marked for the Space (call inside a Blocks context)."""
    return [_control(f) for f in space_fields(cls)]


def _read(f, value):
    """A control's value as the field's type: a whole number for an integer field, a float for a real one."""
    if f.type is int and isinstance(value, numbers.Real) and not isinstance(value, bool):
        if float(value) != int(value):
            raise UserInputError(f"{f.name}: expected a whole number, got {value!r}")
        return int(value)
    if f.type is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            words = f.bounds.words() if f.bounds is not None else "a number"
            raise UserInputError(f"{f.name}: expected {words}, got {value!r}") from None
    return value


def takes_settings(cls):
    """Decorator: handler ``fn(..., settings, ...)`` -> ``fn(..., <field>=<default>, ...)`` for the fields of
    ``cls`` marked for the Space; the handler receives ``settings=cls(...)`` built from them."""

    def wrap(fn):
        fields = space_fields(cls)
        params = []
        for p in inspect.signature(fn).parameters.values():
            if p.name == "settings":
                kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
                params += [inspect.Parameter(f.name, kind, default=f.default) for f in fields]
            else:
                params.append(p)
        signature = inspect.Signature(params)

        @functools.wraps(fn)
        def handler(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            values = {f.name: _read(f, bound.arguments.pop(f.name)) for f in fields}
            return fn(**bound.arguments, settings=cls(**values))

        handler.__signature__ = signature
        return handler

    return wrap


__all__ = ["settings_controls", "space_fields", "takes_settings"]
