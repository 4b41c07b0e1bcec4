"""Argument checks shared across hf_tdiag: each error names the argument, what was expected and what was given.

``positive_int(batch_size, "batch_size")`` -> ``batch_size: expected a positive integer, got 0``. The scalar checks
import no numpy or torch (the command line uses them before torch is loaded); ``check_tensor`` imports torch lazily.
"""

from __future__ import annotations

import math
import numbers

__all__ = [
    "ArgumentTypeError",
    "integer",
    "block_number",
    "positive_int",
    "non_negative_int",
    "real",
    "finite_float",
    "positive_float",
    "non_negative_float",
    "all_finite",
    "check_tensor",
    "check_unique_labels",
    "check_dense_tensors",
    "check_token_ids",
    "check_model_inputs",
    "check_block_outputs",
    "whole_number",
]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type. A ``TypeError``, and a ``ValueError`` as well: the hand-written checks this
    module replaced raised ``ValueError`` for a wrong type in most places, ``TypeError`` in others."""


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)  # numpy integers are Integral


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _int_words(low: int | None, high: int | None) -> str:
    if high is not None:
        return f"an integer in [{0 if low is None else low}, {high})"
    if low == 1:
        return "a positive integer"
    return "an integer" if low is None else f"an integer >= {low}"


def integer(
    value, name: str, *, low: int | None = None, high: int | None = None, allow_none: bool = False, none_means: str = ""
) -> int | None:
    """An int (not a bool) with ``low <= value < high`` where given; ``None`` passes when ``allow_none``
    (``none_means``, e.g. ``" for every query"``, says what it stands for in the message)."""
    if value is None and allow_none:
        return None
    expected = _int_words(low, high) + (f" or None{none_means}" if allow_none else "")
    if not _is_int(value):
        raise ArgumentTypeError(f"{name}: expected {expected}, got {value!r}")
    if (low is not None and value < low) or (high is not None and value >= high):
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return int(value)


def block_number(
    value, num_layers: int, name: str = "layer", *, embeddings: bool = False, from_end: bool = False
) -> int:
    """A layer number as every entry point reads it: block ``l`` in ``1..L`` is the ``l``-th transformer block (its
    output ``Z^l``); ``0`` is the embedding output where ``embeddings`` (a diagnostic that measures it); ``-1`` is the
    last block, ``-2`` the one before, ... where ``from_end``. Returns the block number (never negative)."""
    given = integer(value, name)
    number = given + num_layers + 1 if from_end and -num_layers <= given < 0 else given
    if not (0 if embeddings else 1) <= number <= num_layers:
        words = f"a block number {0 if embeddings else 1}..{num_layers}" + (
            " (0 = the embeddings)" if embeddings else ""
        )
        if from_end:
            words += f" or -{num_layers}..-1 from the end"
        raise ValueError(f"{name}: expected {words}, got {given}")
    return number


def positive_int(value, name: str, *, allow_none: bool = False, none_means: str = "") -> int | None:
    """An int >= 1 (``None`` passes when ``allow_none``; ``none_means`` says what it stands for in the message)."""
    return integer(value, name, low=1, allow_none=allow_none, none_means=none_means)


def non_negative_int(value, name: str, *, allow_none: bool = False, none_means: str = "") -> int | None:
    """An int >= 0 (``None`` passes when ``allow_none``; ``none_means`` says what it stands for in the message)."""
    return integer(value, name, low=0, allow_none=allow_none, none_means=none_means)


def _real_words(low, high, low_open: bool, high_open: bool) -> str:
    if low is None and high is None:
        return "a finite number"
    if high is None:
        return f"a finite number {'>' if low_open else '>='} {low}"
    if low is None:
        return f"a finite number {'<' if high_open else '<='} {high}"
    return f"a finite number in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def real(
    value,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_none: bool = False,
) -> float | None:
    """A finite real number (int or float, not a bool) in the given bounds, returned as a float."""
    if value is None and allow_none:
        return None
    expected = _real_words(low, high, low_open, high_open) + (" or None" if allow_none else "")
    if not _is_real(value):
        raise ArgumentTypeError(f"{name}: expected {expected}, got {value!r}")
    v = float(value)
    too_low = low is not None and (v <= low if low_open else v < low)
    too_high = high is not None and (v >= high if high_open else v > high)
    if not math.isfinite(v) or too_low or too_high:
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return v


def finite_float(value, name: str, *, allow_none: bool = False) -> float | None:
    """A finite number."""
    return real(value, name, allow_none=allow_none)


def positive_float(value, name: str) -> float:
    """A finite number > 0."""
    return real(value, name, low=0, low_open=True)


def non_negative_float(value, name: str) -> float:
    """A finite number >= 0."""
    return real(value, name, low=0)


# ----------------------------------------------------------------------------- tensors

_SHAPE_WORDS = {1: "(n,)", 2: "(rows, d)", 3: "(images, N, d)"}


def all_finite(t) -> bool:
    """True iff every entry of the tensor ``t`` is finite.

    One reduction instead of an elementwise mask: a NaN or ±inf entry makes the sum NaN or ±inf, so a finite sum
    proves every entry finite; only when the sum is not finite (a bad entry, or an overflow of huge finite values)
    is the exact mask taken.
    """
    import torch

    if t.numel() == 0:
        return True
    if math.isfinite(float(t.detach().sum())):
        return True
    return bool(torch.isfinite(t.detach()).all())


def check_tensor(
    x,
    name: str,
    *,
    ndim: int | tuple[int, ...] | None = None,
    min_ndim: int | None = None,
    shape: str | None = None,
    finite: bool = True,
    allow_numpy: bool = False,
    nonempty_trailing: int | None = None,
):
    """A floating torch tensor (float16/bfloat16/float32/float64), returned as given (a numpy array is converted
    when ``allow_numpy``).

    ``ndim``: the allowed number(s) of dimensions; ``min_ndim``: at least that many; ``shape``: the expected shape in
    words for the messages (e.g. ``"(..., N, d)"``). The tensor must be non-empty; with ``nonempty_trailing=k`` only
    its last k dimensions must be (empty leading batch dimensions pass). ``finite``: no NaN or inf entries.
    """
    import torch

    if allow_numpy and type(x).__module__ == "numpy" and hasattr(x, "dtype"):
        x = torch.from_numpy(x)
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if shape is None and ndims is not None and all(n in _SHAPE_WORDS for n in ndims):
        shape = " or ".join(_SHAPE_WORDS[n] for n in ndims)
    of_shape = f" of shape {shape}" if shape else ""
    if not isinstance(x, torch.Tensor):
        kinds = "a torch.Tensor or numpy array" if allow_numpy else "a torch.Tensor"
        raise ArgumentTypeError(f"{name}: expected {kinds}{of_shape}, got {type(x).__name__}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise ArgumentTypeError(
            f"{name}: expected a floating tensor (float16/bfloat16/float32/float64), got dtype {x.dtype}"
        )
    if (ndims is not None and x.ndim not in ndims) or (min_ndim is not None and x.ndim < min_ndim):
        wanted = shape or (f"{' or '.join(map(str, ndims))} dimensions" if ndims else f">= {min_ndim} dimensions")
        raise ValueError(f"{name}: expected shape {wanted}, got {tuple(x.shape)}")
    dims = x.shape[-nonempty_trailing:] if nonempty_trailing else x.shape
    if any(s == 0 for s in dims):
        which = "non-empty trailing dimensions" if nonempty_trailing else "a non-empty tensor"
        raise ValueError(f"{name}: expected {which}{of_shape}, got shape {tuple(x.shape)}")
    if finite and not all_finite(x):
        raise ValueError(f"{name}: contains NaN or inf values (shape {tuple(x.shape)})")
    return x


# ----------------------------------------------------------------------------- what users give as data


def check_unique_labels(names, name: str = "labels") -> list[str]:
    """Class names as a list of strings, each once: two classes of one name would share one ``label2id`` entry
    (the second silently replacing the first). ValueError naming both indices."""
    names = [str(n) for n in names]
    seen: dict[str, int] = {}
    for i, label in enumerate(names):
        if label in seen:
            raise ValueError(
                f"{name}: the name {label!r} is given twice (classes {seen[label]} and {i}); label2id needs one name "
                "per class"
            )
        seen[label] = i
    return names


def check_dense_tensors(tensors, source: str) -> None:
    """Every tensor of a loaded checkpoint (a mapping, possibly nested one level) holds data in the usual dense
    layout: ValueError naming ``source`` and the key for a meta tensor (shapes only, no values: saved from a model
    built on the meta device) or a sparse one."""
    import torch

    def walk(obj, prefix: str = "", depth: int = 0):
        if isinstance(obj, torch.Tensor):
            yield prefix, obj
        elif isinstance(obj, dict) and depth < 3:
            for key, value in obj.items():
                yield from walk(value, f"{prefix}.{key}" if prefix else str(key), depth + 1)

    for key, t in walk(tensors):
        if t.is_meta:
            raise ValueError(
                f"{source}: the tensor {key!r} is on the meta device (a shape without values); save the checkpoint "
                "from a model whose weights are loaded"
            )
        if t.layout != torch.strided:
            raise ValueError(
                f"{source}: the tensor {key!r} is {str(t.layout).replace('torch.', '')}; convert it with "
                "tensor.to_dense() before saving the checkpoint"
            )


def check_token_ids(input_ids, vocab_size: int, name: str = "input_ids") -> None:
    """Token ids a text model can embed: a non-empty integer tensor with every id in ``[0, vocab_size)``.
    ValueError naming ``name``, the offending id and the vocabulary size (an embedding lookup would fail with an
    index error, or on a GPU a device-side assert)."""
    import torch

    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        kind = getattr(input_ids, "dtype", type(input_ids).__name__)
        raise ArgumentTypeError(f"{name}: expected an integer tensor of token ids, got {kind}")
    if input_ids.numel() == 0 or input_ids.shape[-1] == 0:
        raise ValueError(f"{name}: no tokens (shape {tuple(input_ids.shape)}); give at least one token per sequence")
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(
            f"{name}: the id {bad} is outside the vocabulary of {vocab_size} tokens (ids 0..{vocab_size - 1}); was "
            "the text tokenized with this model's tokenizer?"
        )


# the largest |value| a model input may hold: its square (LayerNorm's variance, a Gram matrix) must stay below
# float32's largest number (3.4e38) with room for sums over features and tokens: sqrt(3.4e38) / 1000 ~ 1.8e16
INPUT_LIMIT = math.sqrt(3.4028234663852886e38) / 1000


def check_model_inputs(batch, name: str | None = None):
    """Before any work: every floating tensor of a model's ``batch`` (a tensor, or a dict batch: its
    ``pixel_values``, ...) is finite and small enough for float32 arithmetic. ValueError naming the input (``name``,
    else the dict key, else ``pixel_values``), the first bad position and the value range. Returns ``batch``."""
    import torch

    items = [(name or "pixel_values", batch)] if isinstance(batch, torch.Tensor) else []
    if not items and hasattr(batch, "items"):
        items = [(f"{name}[{key!r}]" if name else str(key), value) for key, value in batch.items()]
    for key, t in items:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
            continue
        t = t.detach()
        for dim in range(t.ndim):  # a broadcast (expanded) dimension repeats one slice: check that slice once
            if t.stride(dim) == 0 and t.shape[dim] > 1:
                t = t.narrow(dim, 0, 1)
        if not all_finite(t):
            bad = ~torch.isfinite(t)
            first = tuple(int(i) for i in bad.nonzero()[0])
            kind = "NaN" if bool(torch.isnan(t[first])) else "inf"
            raise ValueError(
                f"{key}: contains {kind} at index {first} ({int(bad.sum())} non-finite of {t.numel()} values); "
                "give finite values (as the model's image processor or tokenizer makes them)"
            )
        top = max(abs(float(t.amax())), abs(float(t.amin())))  # no |t| copy of the whole tensor
        if top > INPUT_LIMIT:
            raise ValueError(
                f"{key}: values up to {top:.3g} overflow float32 (their squares pass its largest number, 3.4e+38); "
                f"keep |values| below {INPUT_LIMIT:.2g}: normalized pixel values lie within a few units"
            )
    return batch


def check_block_outputs(outputs, inputs=None, start: int = 1) -> None:
    """After a forward pass on inputs :func:`check_model_inputs` accepted: block ``start + i``'s output
    ``outputs[i]`` is finite (block 0: the embeddings); else a ValueError naming the first block that produced NaN/inf
    and saying that the model's weights or the inputs are at fault (``inputs``: the batch, whose value range the
    message gives)."""
    import torch

    for i, z in enumerate(outputs):
        if z is None or not isinstance(z, torch.Tensor) or all_finite(z):
            continue
        where = "the embedding output (block 0)" if start + i == 0 else f"block {start + i}'s output"
        given = ""
        pixels = inputs if isinstance(inputs, torch.Tensor) else None
        if pixels is None and hasattr(inputs, "get"):
            pixels = inputs.get("pixel_values")
        if isinstance(pixels, torch.Tensor) and pixels.is_floating_point() and pixels.numel():
            given = f" (pixel_values from {float(pixels.min()):.3g} to {float(pixels.max()):.3g})"
        raise ValueError(
            f"model: {where} contains NaN or inf although its inputs are finite{given}; the "
            "model's weights (too large, or a diverged training) or inputs far from the scale it was trained on are "
            "at fault"
        )


def whole_number(value, name: str, *, default: int | None = None) -> int:
    """A whole number typed into a form (the Space's number boxes give floats: ``3.0`` -> 3); a fractional value is
    refused naming ``name``, never truncated (``2.5`` is not layer 2). ``None`` gives ``default`` where one is set."""
    if value is None and default is not None:
        return default
    if _is_int(value):
        return int(value)
    if _is_real(value) and math.isfinite(float(value)) and float(value).is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value.strip())
    raise ValueError(f"{name}: expected a whole number, got {value!r}")
