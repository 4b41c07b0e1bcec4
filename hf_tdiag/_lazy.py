"""Lazy package exports: a module-level ``__getattr__`` that imports a name's module on first access."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, targets: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """``__getattr__`` for ``package``: ``targets`` maps a public name to ``"module:attribute"``;
    the value is imported once and cached in ``namespace`` (the package's ``globals()``)."""

    def __getattr__(name: str) -> Any:
        target = targets.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, attr = target.split(":")
        value = getattr(importlib.import_module(module_name), attr)
        namespace[name] = value
        return value

    return __getattr__
