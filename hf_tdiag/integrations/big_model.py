"""Diagnostics on models dispatched with Accelerate's big-model inference (``device_map``, CPU or disk offload).

A model loaded with ``from_pretrained(..., device_map=..., offload_folder=...)`` (or wrapped by ``dispatch_model``,
``cpu_offload``, ``disk_offload``) keeps each offloaded module's weights on the ``meta`` device between forward
passes; a hook brings them to the execution device when the module runs and sends them back afterwards.

The public diagnostics (:func:`hf_tdiag.layer_srr`, :func:`hf_tdiag.schatten_bounds`,
:func:`hf_tdiag.concept_fidelity`, :func:`hf_tdiag.attention_svm_diagnostic`) take such a model as it is: their
forward passes run through the hooks, and their weight reads go through :mod:`hf_tdiag.probes.offload`, which reads
one module's (one job's) tensors from the offload store at a time. Nothing needs wrapping.

``readable_weights(model)`` is for code of your own that reads an offloaded model's weights outside a forward pass:
while it is active, every offloaded module keeps its weights on the CPU between forward passes (read from the
hook's offload store: no copy for CPU offload, **all offloaded weights read from disk at once** for disk offload)
instead of on ``meta``; the forward passes still stream them to the execution device block by block. On leaving,
the weights go back to ``meta`` and the hooks are as they were. ``offloaded_modules(model)`` lists the offloading
hooks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from ..probes.offload import hook_tensor_names, offloaded_modules


def _rest_on(module: nn.Module, hook, device: str) -> None:
    """Put the module's offloaded tensors on ``device`` (``cpu``: the offload store's values; ``meta``: none)."""
    from accelerate.utils import set_module_tensor_to_device

    for name in hook_tensor_names(module, hook):
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
