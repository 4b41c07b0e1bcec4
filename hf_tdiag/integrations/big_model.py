"""Diagnostics on models dispatched with Accelerate's big-model inference (``device_map``, CPU or disk offload).

A model loaded with ``from_pretrained(..., device_map=..., offload_folder=...)`` (or wrapped by ``dispatch_model``,
``cpu_offload``, ``disk_offload``) keeps each offloaded module's weights on the ``meta`` device between forward
passes; a hook brings them to the execution device when the module runs and sends them back afterwards. The
forward passes of :func:`hf_tdiag.layer_srr`, :func:`hf_tdiag.concept_fidelity` and
:func:`hf_tdiag.attention_svm_diagnostic` run through those hooks as they are (one block's weights on the device
at a time), but the diagnostics also read weights (``U``, ``W_Q``, ``W_V``, ``W_O``, norms) outside a forward pass.

``readable_weights(model)`` makes those reads work: while it is active, every offloaded module keeps its weights
on the CPU between forward passes (read from the hook's offload store: no copy for CPU offload, read from the
memory-mapped files for disk offload) instead of on ``meta``; the forward passes still stream them to the
execution device block by block. On leaving, the weights go back to ``meta`` and the hooks are as they were, so
the device memory of the run is that of the offloaded model and the CPU memory holds at most the offloaded
weights. ``offloaded_modules(model)`` lists the offloading hooks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


def _align_hooks(module: nn.Module) -> list:
    """The ``AlignDevicesHook`` objects attached to ``module`` (alone or inside a ``SequentialHook``)."""
    from accelerate.hooks import AlignDevicesHook, SequentialHook

    hook = getattr(module, "_hf_hook", None)
    hooks = list(hook.hooks) if isinstance(hook, SequentialHook) else [hook]
    return [h for h in hooks if isinstance(h, AlignDevicesHook)]


def offloaded_modules(model: nn.Module) -> list[tuple[nn.Module, object]]:
    """``(module, hook)`` for every module whose weights an Accelerate hook offloads (empty for a model in memory)."""
    return [(m, h) for m in model.modules() for h in _align_hooks(m) if h.offload and h.weights_map is not None]


def _tensor_names(module: nn.Module, hook) -> list[str]:
    from accelerate.utils import named_module_tensors

    return [
        name
        for name, _ in named_module_tensors(
            module, include_buffers=hook.offload_buffers, recurse=hook.place_submodules, remove_non_persistent=True
        )
    ]


def _rest_on(module: nn.Module, hook, device: str) -> None:
    """Put the module's offloaded tensors on ``device`` (``cpu``: the offload store's values; ``meta``: none)."""
    from accelerate.utils import set_module_tensor_to_device

    for name in _tensor_names(module, hook):
        value = hook.weights_map[name] if device == "cpu" else None
        set_module_tensor_to_device(module, name, device, value=value)


@contextmanager
def readable_weights(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, offloaded weights rest on the CPU between forward passes instead of on ``meta``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    patched = []
    try:
        for module, hook in offloaded_modules(model):
            original = hook._offload_weights

            def rest_on_cpu(mod, _hook=hook, _original=original):
                _original(mod)  # (frees tied-weight bookkeeping as the hook does)
                _rest_on(mod, _hook, "cpu")

            hook._offload_weights = rest_on_cpu
            patched.append((module, hook))
            _rest_on(module, hook, "cpu")
        yield model
    finally:
        for module, hook in patched:
            del hook._offload_weights  # the class's method again
            _rest_on(module, hook, "meta")


__all__ = ["readable_weights", "offloaded_modules"]
