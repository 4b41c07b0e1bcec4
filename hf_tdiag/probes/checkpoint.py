"""Read a checkpoint's safetensors tensors a few at a time, without instantiating the model.

:func:`open_checkpoint` takes a local folder written by ``save_pretrained`` or a Hub id (its ``*.json`` and
``*.safetensors`` files are downloaded to the Hugging Face cache — disk, not memory) and returns a
:class:`Checkpoint`: the config, the tensor → shard map (``model.safetensors.index.json``, or the keys of a single
``model.safetensors``) and the module tree built on PyTorch's ``meta`` device (no weights allocated), from which
the family adapters locate their tensors exactly as on a loaded model.

:meth:`Checkpoint.tensors` opens only the shards that hold the requested tensors with ``safetensors.safe_open``
and closes them on exit: safetensors maps the file and hands out tensors backed by that mapping, so the
memory a read costs is the bytes of the tensors read, released when the caller drops them.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["Checkpoint", "open_checkpoint"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass
class Checkpoint:
    """A checkpoint on disk: ``folder``, ``config``, ``weight_map`` (checkpoint key → shard file name) and ``meta_model``
    (the model class built on the meta device); names given to :meth:`tensors` are resolved against the keys by
    :meth:`key` (a base model's ``layers.0…`` is the checkpoint's ``model.layers.0…``)."""

    source: str
    folder: str
    config: object
    weight_map: dict[str, str]
    meta_model: nn.Module
    _keys: dict[str, str] = field(default_factory=dict)

    def key(self, name: str) -> str:
        """The checkpoint key of model tensor ``name``: itself, or the one key ending in ``"." + name``."""
        if name in self.weight_map:
            return name
        if name not in self._keys:
            hits = [k for k in self.weight_map if k.endswith("." + name)]
            if len(hits) != 1:
                sample = sorted(self.weight_map)[:5]
                raise ValueError(
                    f"model_or_path: the checkpoint {self.source!r} has {'no' if not hits else 'several'} tensor(s) "
                    f"for {name!r} ({hits or 'none'}; its keys look like {sample}); it was not written by this model class"
                )
            self._keys[name] = hits[0]
        return self._keys[name]

    def nbytes(self, name: str) -> int:
        """Bytes of tensor ``name`` as stored (from the shard's header; nothing is read)."""
        from safetensors import safe_open

        key = self.key(name)
        with safe_open(os.path.join(self.folder, self.weight_map[key]), framework="pt") as fh:
            sl = fh.get_slice(key)
            dtype = sl.get_dtype()
            count = 1
            for s in sl.get_shape():
                count *= int(s)
        return count * _DTYPE_BYTES[dtype]

    @contextmanager
    def tensors(self, names):
        """``get(name) -> tensor`` over the shards holding ``names``, open for the duration of the ``with`` block."""
        from safetensors import safe_open

        keys = {n: self.key(n) for n in names}
        files = sorted({self.weight_map[k] for k in keys.values()})
        with ExitStack() as stack:
            handles = {f: stack.enter_context(safe_open(os.path.join(self.folder, f), framework="pt")) for f in files}

            def get(name: str) -> torch.Tensor:
                if name not in keys:
                    raise KeyError(f"{name!r} was not among the tensors opened ({sorted(keys)})")
                key = keys[name]
                return handles[self.weight_map[key]].get_tensor(key)

            yield get


_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


def _download(repo_id: str) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors"])
    except RepositoryNotFoundError:
        raise ValueError(
            f"model_or_path: {repo_id!r} is not a model repository on the Hub (or it is private)"
        ) from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        raise ValueError(f"model_or_path: could not download {repo_id!r} from the Hub ({err})") from None


def _weight_map(folder: str, source: str) -> dict[str, str]:
    index = os.path.join(folder, INDEX)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as fh:
            data = json.load(fh)
        wm = data.get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise ValueError(f"model_or_path: {index} has no weight_map")
        return {str(k): str(v) for k, v in wm.items()}
    single = os.path.join(folder, SINGLE)
    if os.path.isfile(single):
        from safetensors import safe_open

        with safe_open(single, framework="pt") as fh:
            return {k: SINGLE for k in fh.keys()}
    raise ValueError(
        f"model_or_path: streaming reads safetensors checkpoints; {source!r} has neither {INDEX} nor {SINGLE}"
    )


def open_checkpoint(source, *, trust_remote_code: bool = False) -> Checkpoint:
    """A :class:`Checkpoint` of a local folder or Hub id; the model is built on the meta device, never loaded."""
    from transformers import AutoModel

    from hf_tdiag.loading import check_source, load_config

    source = check_source(source, "model_or_path")
    config = load_config(source, trust_remote_code=trust_remote_code, name="model_or_path")
    folder = source if os.path.isdir(source) else _download(source)
    weight_map = _weight_map(folder, source)
    try:
        with torch.device("meta"):
            meta = AutoModel.from_config(config, trust_remote_code=trust_remote_code)
    except ValueError as err:
        raise ValueError(f"model_or_path: cannot build {source!r} from its config: {err}") from None
    return Checkpoint(source=source, folder=folder, config=config, weight_map=weight_map, meta_model=meta)
