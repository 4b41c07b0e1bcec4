"""Reading the weights of a model dispatched with Accelerate's big-model inference, one module at a time.

A model loaded with ``from_pretrained(..., device_map=..., offload_folder=...)`` (or wrapped by ``dispatch_model``,
``cpu_offload``, ``disk_offload``) keeps each offloaded module's tensors on the ``meta`` device between forward passes;
an ``AlignDevicesHook`` on the module (or on a block above it, ``place_submodules``) fills them from its offload
store (``weights_map``: the CPU state dict, or the files of the offload folder) when that module runs and empties
them afterwards. The diagnostics' forward passes run through those hooks unchanged. Their other reads go through
this module, which never holds more than what the caller asks for:

* :func:`read_tensor` — one tensor by its full name: the module's own tensor where it is real, else the offload
  store's value (no copy for CPU offload, one tensor read from disk for disk offload);
* :func:`readable` — a context in which the offloaded tensors of the given modules (and their submodules) rest on
  the CPU, back on ``meta`` afterwards (for reads such as ``module.weight`` or a computed matrix);
* :func:`runnable` — the same, only for tensors whose hook sits on a block *above* the module, so the module can be
  called directly (a module with a hook of its own fills itself when called);
* :func:`plain_copy` — a hook-free deep copy of a module with real weights (what a float64 copy starts from);
* :func:`execution_device` — where the hooks run the model;
* :func:`releasing_memory` — a context in which freed heap memory goes back to the OS after each given block's
  forward pass (a hook's copy of an offloaded block's weights is freed there, and glibc would keep those pages).

For a model in memory every function is a pass-through: the model's own tensors, no copies, nothing changed.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "OffloadedTensor",
    "offloaded_modules",
    "hook_tensor_names",
    "offload_index",
    "is_offloaded",
    "execution_device",
    "read_tensor",
    "readable",
    "runnable",
    "plain_copy",
    "releasing_memory",
]


def _align_hooks(module: nn.Module) -> list:
    """The ``AlignDevicesHook`` objects attached to ``module`` (alone or inside a ``SequentialHook``)."""
    hook = vars(module).get("_hf_hook")  # (an instance attribute: no nn.Module.__getattr__ miss per module)
    if hook is None:
        return []
    from accelerate.hooks import AlignDevicesHook, SequentialHook

    hooks = list(hook.hooks) if isinstance(hook, SequentialHook) else [hook]
    return [h for h in hooks if isinstance(h, AlignDevicesHook)]


def offloaded_modules(model: nn.Module) -> list[tuple[nn.Module, object]]:
    """``(module, hook)`` for every module whose tensors an Accelerate hook offloads (empty for a model in memory)."""
    return [(m, h) for m in model.modules() for h in _align_hooks(m) if h.offload and h.weights_map is not None]


def hook_tensor_names(module: nn.Module, hook) -> list[str]:
    """The names (relative to ``module``) of the tensors ``hook`` offloads."""
    from accelerate.utils import named_module_tensors

    return [
        name
        for name, _ in named_module_tensors(
            module, include_buffers=hook.offload_buffers, recurse=hook.place_submodules, remove_non_persistent=True
        )
    ]


@dataclass(frozen=True)
class OffloadedTensor:
    """Where one offloaded tensor lives: the hook's store, its key there, and the path of the hooked module."""

    store: Mapping
    key: str
    owner: str

    def value(self) -> torch.Tensor:
        return self.store[self.key]


def offload_index(model: nn.Module) -> dict[str, OffloadedTensor]:
    """``{full tensor name: OffloadedTensor}`` of every offloaded tensor of ``model`` (empty for a model in memory)."""
    index: dict[str, OffloadedTensor] = {}
    for path, module in model.named_modules():
        for hook in _align_hooks(module):
            if hook.offload and hook.weights_map is not None:
                for rel in hook_tensor_names(module, hook):
                    index[f"{path}.{rel}" if path else rel] = OffloadedTensor(hook.weights_map, rel, path)
    return index


def is_offloaded(model: nn.Module) -> bool:
    """Whether any tensor of ``model`` is offloaded by an Accelerate hook."""
    return bool(offloaded_modules(model))


def execution_device(model: nn.Module) -> torch.device | None:
    """The execution device of the first Accelerate hook of ``model`` (``None``: no hook)."""
    for module in model.modules():
        for hook in _align_hooks(module):
            if hook.execution_device is not None:
                dev = hook.execution_device
                return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
    return None


def _get_tensor(model: nn.Module, name: str) -> torch.Tensor:
    path, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(path) if path else model, attr)


def read_tensor(model: nn.Module, name: str, index: dict[str, OffloadedTensor] | None = None) -> torch.Tensor:
    """Tensor ``name`` of ``model``, detached: its own value where real, the offload store's where it is on meta."""
    tensor = _get_tensor(model, name)
    if tensor is not None and tensor.device.type == "meta":
        index = offload_index(model) if index is None else index
        if name in index:
            return index[name].value().detach()
    return tensor.detach() if tensor is not None else tensor


def _paths(model: nn.Module, modules) -> list[str]:
    """The paths inside ``model`` of ``modules``; a view module that is not part of ``model`` (GPT-2's
    ``FusedProjection`` over ``c_attn``) stands for the model's modules it holds; anything else is skipped."""
    where = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    paths = []
    for module in modules:
        if module is None:
            continue
        if id(module) in where:
            paths.append(where[id(module)])
        else:
            paths += [where[id(v)] for v in vars(module).values() if isinstance(v, nn.Module) and id(v) in where]
    return paths


def _under(name: str, path: str) -> bool:
    return path == "" or name == path or name.startswith(path + ".")


@contextmanager
def _resting_on_cpu(model: nn.Module, modules, only_from_above: bool) -> Iterator[None]:
    index = offload_index(model) if modules else {}
    paths = _paths(model, modules) if index else []
    names = [
        name
        for name, entry in index.items()
        if any(
            _under(name, p) and (not only_from_above or (entry.owner != p and _under(p, entry.owner))) for p in paths
        )
        and _get_tensor(model, name).device.type == "meta"
    ]
    if not names:
        yield
        return
    from accelerate.utils import set_module_tensor_to_device

    done = []
    try:
        for name in names:
            set_module_tensor_to_device(model, name, "cpu", value=index[name].value())
            done.append(name)
        yield
    finally:
        for name in done:
            set_module_tensor_to_device(model, name, "meta")


def readable(model: nn.Module, *modules: nn.Module):
    """Context: the offloaded tensors of ``modules`` (parts of ``model``) rest on the CPU, back on meta on leaving."""
    return _resting_on_cpu(model, modules, only_from_above=False)


def runnable(model: nn.Module, *modules: nn.Module):
    """Context: ``modules`` can be called directly (tensors filled by a hook above them rest on the CPU meanwhile)."""
    return _resting_on_cpu(model, modules, only_from_above=True)


@contextmanager
def releasing_memory(model: nn.Module, blocks) -> Iterator[None]:
    """Context: for an offloaded ``model``, ``malloc_trim`` after each forward pass of each of ``blocks`` (the hooks have
    dropped the block's weights by then; :mod:`hf_tdiag._memory`); nothing for a model in memory."""
    if not is_offloaded(model):
        yield
        return
    from .._memory import release_free_memory

    handles = [b.register_forward_hook(lambda *_: release_free_memory()) for b in blocks]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


_HOOK_ATTRS = ("_hf_hook", "_old_forward", "forward")


def plain_copy(model: nn.Module, module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` (a part of ``model``) without Accelerate hooks and with its offloaded weights real.

    The hooks (and the offload stores they reference) are not copied: their instance attributes are set aside on the
    caller's modules for the copy and put back at once."""
    hooked = [m for m in module.modules() if "_hf_hook" in vars(m)]
    with readable(model, module):
        if not hooked:
            return copy.deepcopy(module)
        saved = [(m, {k: vars(m).pop(k) for k in _HOOK_ATTRS if k in vars(m)}) for m in hooked]
        try:
            return copy.deepcopy(module)
        finally:
            for m, attrs in saved:
                vars(m).update(attrs)
