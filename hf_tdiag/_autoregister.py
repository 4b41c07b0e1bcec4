"""Register CRATE with transformers' Auto classes at the moment transformers loads them.

``import hf_tdiag`` must make ``AutoModel.from_pretrained(<crate folder>)`` work, but importing torch and
transformers takes seconds, which ``hf-tdiag --help`` must not pay. So ``install()`` registers each Auto
family right away when its transformers module is already imported, and otherwise right after that module
finishes loading (a one-shot import hook). The model classes import ``transformers.modeling_layers``, which
itself imports ``transformers.models.auto``; when that chain is still loading, the models are registered as
soon as ``modeling_layers`` (or ``modeling_crate``, when a user imports it first) has finished. The CRATE
classes are marked for ``register_for_auto_class`` (so ``save_pretrained`` writes an ``auto_map`` and copies the
model files) as soon as their modules load.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable

_CONFIG = "transformers.models.auto.configuration_auto"
_IMAGE = "transformers.models.auto.image_processing_auto"
_VIDEO = "transformers.models.auto.video_processing_auto"
_MODELING = "transformers.models.auto.modeling_auto"
_LAYERS = "transformers.modeling_layers"
_CRATE = "hf_tdiag.models.crate.modeling_crate"
_CRATE_CONFIG = "hf_tdiag.models.crate.configuration_crate"
_CRATE_IMAGE = "hf_tdiag.models.crate.image_processing_crate"
# the other white-box families: package -> (modeling module, its last class); each package defines
# register_config / register_image_processor / register_models (they also mark the classes for remote code)
_FAMILIES = {
    "hf_tdiag.models.crate_alpha": (
        "hf_tdiag.models.crate_alpha.modeling_crate_alpha",
        "CrateAlphaForImageClassification",
    ),
    "hf_tdiag.models.tost": ("hf_tdiag.models.tost.modeling_tost", "TostForImageClassification"),
    "hf_tdiag.models.crate_text": (
        "hf_tdiag.models.crate_text.modeling_crate_text",
        "CrateTextForMultipleChoice",
    ),
    "hf_tdiag.models.crate_mae": ("hf_tdiag.models.crate_mae.modeling_crate_mae", "CrateMAEForImageClassification"),
}


def _register_families(kind: str) -> None:
    import importlib

    for package in _FAMILIES:
        getattr(importlib.import_module(package), f"register_{kind}")()


def _loaded(name: str, attribute: str) -> bool:
    """``name`` is imported and finished loading far enough to define ``attribute``."""
    return hasattr(sys.modules.get(name), attribute)


def _register_config() -> None:
    from .models.crate import register_crate_config

    register_crate_config()
    _register_families("config")


def _register_image_processor() -> None:
    from .models.crate import register_crate_image_processor

    register_crate_image_processor()
    _register_families("image_processor")


def _register_no_video_processor() -> None:
    from .models.crate import register_crate_no_video_processor

    register_crate_no_video_processor()


_busy = False


def _register_models() -> None:
    global _busy
    if _busy or not _loaded(_MODELING, "AutoModel"):
        return  # (re-entered while modeling_crate itself is importing modeling_layers)
    watched = ((_LAYERS, "GradientCheckpointingLayer"), (_CRATE, "CrateForImageClassification"), *_FAMILIES.values())
    for name, attribute in watched:
        if name in sys.modules and not _loaded(name, attribute):
            return  # mid-import: the hook on that module registers the models when it is done
    from .models.crate import register_crate_models

    _busy = True
    try:
        register_crate_models()
        _register_families("models")
    finally:
        _busy = False


def _mark_config() -> None:
    sys.modules[_CRATE_CONFIG].CrateConfig.register_for_auto_class()


def _mark_image_processor() -> None:
    sys.modules[_CRATE_IMAGE].CrateImageProcessor.register_for_auto_class("AutoImageProcessor")


def _mark_models() -> None:
    module = sys.modules[_CRATE]
    module.CrateModel.register_for_auto_class("AutoModel")
    module.CrateForImageClassification.register_for_auto_class("AutoModelForImageClassification")


def _crate_models_loaded() -> None:
    _mark_models()
    _register_models()


_HOOKS: dict[str, Callable[[], None]] = {
    _CONFIG: _register_config,
    _IMAGE: _register_image_processor,
    _VIDEO: _register_no_video_processor,
    _MODELING: _register_models,
    _LAYERS: _register_models,
    _CRATE: _crate_models_loaded,
    _CRATE_CONFIG: _mark_config,
    _CRATE_IMAGE: _mark_image_processor,
    **{modeling: _register_models for modeling, _ in _FAMILIES.values()},
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``_HOOKS[name]`` right after module ``name`` has executed; removes itself when all have run."""

    def __init__(self, pending: dict[str, Callable[[], None]]) -> None:
        self.pending = dict(pending)

    def find_spec(self, name, path, target=None):
        hook = self.pending.get(name)
        if hook is None:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        run = spec.loader.exec_module

        def exec_module(module, _run=run, _name=name, _hook=hook):
            _run(module)
            self.pending.pop(_name, None)
            if not self.pending and self in sys.meta_path:
                sys.meta_path.remove(self)
            _hook()

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Register what is already loaded; hook the rest. Idempotent."""
    if any(isinstance(f, _AfterImport) for f in sys.meta_path):
        return
    for name, attribute, mark in (
        (_CRATE_CONFIG, "CrateConfig", _mark_config),
        (_CRATE_IMAGE, "CrateImageProcessor", _mark_image_processor),
        (_CRATE, "CrateForImageClassification", _mark_models),
    ):
        if _loaded(name, attribute):
            mark()
    if _loaded(_CONFIG, "AutoConfig"):
        _register_config()
    if _loaded(_IMAGE, "AutoImageProcessor"):
        _register_image_processor()
    if _loaded(_VIDEO, "AutoVideoProcessor"):
        _register_no_video_processor()
    _register_models()
    pending = {name: hook for name, hook in _HOOKS.items() if name not in sys.modules}
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))
