"""The one input set of a scan: the same images and/or texts for every model, with the hash that keys the cache.

``inputs`` is ``None`` (weight-only diagnostics), a list of PIL images, a list of strings, or a mapping with
``"images"`` and/or ``"texts"``: each a list, or for images a folder / ``save_to_disk`` folder / dataset name
(``"digits"``) read with :func:`hf_tdiag.inputs.load_images`, for texts a text file (one per line). A model measures
the items of its modality: an image model the images, a text model the texts. The hash is sha256 over each image's
mode, size and pixel bytes and each text's UTF-8 bytes, so the same inputs read again give the same key.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ScanInputs", "resolve_inputs"]


@dataclass
class ScanInputs:
    """Images and texts (either may be empty), with where they came from (for the dataset card)."""

    images: list
    texts: list[str]
    described: dict

    def for_modality(self, modality: str) -> list:
        """The items a model of ``modality`` (``"image"`` or ``"text"``) measures."""
        return self.images if modality == "image" else self.texts

    def hash(self, modality: str) -> str | None:
        """sha256 of the items of ``modality``; None when there are none."""
        items = self.for_modality(modality)
        if not items:
            return None
        h = hashlib.sha256(modality.encode())
        for item in items:
            if isinstance(item, str):
                h.update(b"t" + len(item.encode()).to_bytes(8, "little") + item.encode())
            else:
                data = item.tobytes()
                h.update(f"i{item.mode}{item.size}{len(data)}".encode() + data)
        return h.hexdigest()

    def __bool__(self) -> bool:
        return bool(self.images or self.texts)


def _images(value, limit: int | None, split: str | None):
    if isinstance(value, (str, os.PathLike)):
        from ..inputs import load_images

        return list(load_images(value, split=split, limit=limit).images), os.fspath(value)
    if not isinstance(value, Sequence) or not all(hasattr(v, "tobytes") and hasattr(v, "mode") for v in value):
        raise TypeError(f"inputs: images: expected a list of PIL images or a folder/dataset name, got {value!r:.120}")
    items = list(value)[:limit]
    return items, f"{len(items)} images given"


def _texts(value, limit: int | None):
    if isinstance(value, (str, os.PathLike)):
        from ..inputs import text_lines

        return text_lines(value, limit), os.fspath(value)
    if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"inputs: texts: expected a list of strings or a text file, got {value!r:.120}")
    items = list(value)[:limit]
    return items, f"{len(items)} texts given"


def resolve_inputs(inputs=None, *, limit: int | None = None, split: str | None = None) -> ScanInputs:
    """``inputs`` (see the module docstring) read and cut to ``limit`` items per modality.

    Examples:
        >>> from hf_tdiag.zoo.inputs import resolve_inputs
        >>> s = resolve_inputs(["a text", "another"])
        >>> s.texts, s.images, s.hash("text") == resolve_inputs({"texts": ["a text", "another"]}).hash("text")
        (['a text', 'another'], [], True)
    """
    if isinstance(inputs, ScanInputs):
        return inputs
    if inputs is None:
        return ScanInputs([], [], {})
    if isinstance(inputs, Mapping):
        unknown = sorted(set(inputs) - {"images", "texts"})
        if unknown:
            raise ValueError(f"inputs: unknown key(s) {unknown}; expected 'images' and/or 'texts'")
        images, texts, described = [], [], {}
        if inputs.get("images") is not None:
            images, described["images"] = _images(inputs["images"], limit, split)
        if inputs.get("texts") is not None:
            texts, described["texts"] = _texts(inputs["texts"], limit)
        return ScanInputs(images, texts, described)
    if isinstance(inputs, (str, os.PathLike)):
        raise TypeError(
            f"inputs: got the name {os.fspath(inputs)!r}; pass {{'images': {os.fspath(inputs)!r}}} or "
            f"{{'texts': {os.fspath(inputs)!r}}} to say which it holds"
        )
    items = list(inputs)
    if items and all(isinstance(v, str) for v in items):
        texts, how = _texts(items, limit)
        return ScanInputs([], texts, {"texts": how})
    images, how = _images(items, limit, split)
    return ScanInputs(images, [], {"images": how})
