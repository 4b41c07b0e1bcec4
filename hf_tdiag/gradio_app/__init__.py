"""hf-tdiag's Gradio app (the Hugging Face Space): ``layout`` builds the Blocks, ``handlers`` does the work (plain
functions, tested directly), ``default_model`` trains and caches the bundled digits CRATE on first use.

``space/app.py`` only calls :func:`launch`. Importing this package does not import Gradio (``default_model`` is
used without it); ``build_demo`` and ``launch`` import it on first access.
"""

from __future__ import annotations

from .._lazy import lazy_exports as _lazy_exports

_LAZY = {
    "build_demo": "hf_tdiag.gradio_app.layout:build_demo",
    "launch": "hf_tdiag.gradio_app.layout:launch",
    "ensure_default_model": "hf_tdiag.gradio_app.default_model:ensure_default_model",
}

__getattr__ = _lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
