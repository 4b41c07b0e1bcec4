"""The caller's model comes back as it was found: every submodule's train/eval flag, not only the top one's.

``model.train(was_training)`` after a measurement sets every submodule to the top module's flag, so a model with
one part frozen in eval mode (a frozen backbone under a training head) would come back with all parts training.
``saved = module_modes(model)`` before, ``restore_modes(saved)`` after, keep each flag.
"""

from __future__ import annotations

import functools


def module_modes(model) -> list[tuple[object, bool]]:
    """``(module, training)`` for ``model`` and every submodule (empty for an object without ``modules()``)."""
    return [(m, m.training) for m in model.modules()] if hasattr(model, "modules") else []


def restore_modes(saved: list[tuple[object, bool]]) -> None:
    """Set each module's ``training`` flag back to what :func:`module_modes` recorded."""
    for module, training in saved:
        module.training = training


def keeps_modes(function):
    """Decorator: the first argument's (a model's) submodule flags are restored when ``function`` returns or raises
    (for public functions whose helpers reset the modes with ``model.train(flag)``)."""

    @functools.wraps(function)
    def wrapper(model, *args, **kwargs):
        saved = module_modes(model)
        try:
            return function(model, *args, **kwargs)
        finally:
            restore_modes(saved)

    return wrapper


__all__ = ["keeps_modes", "module_modes", "restore_modes"]
