"""The models of a scan: what the user named, expanded to one entry per model, and each model's fingerprint.

A model is named by a local ``save_pretrained`` folder, a Hub id, a glob (``runs/main/checkpoint-*``; checkpoint
folders sort by their step, others by name), or a list file: ``@models.txt`` (or any existing text file) holds one
of those per line (``#`` starts a comment). A folder that holds ``checkpoint-<step>`` folders but no ``config.json``
(a training run's folder without its final model) stands for its checkpoints. A ``checkpoint-<step>`` folder of
hf-tdiag's trainer (``Accelerator.save_state``: ``model.safetensors`` without a ``config.json``) is the run's model
(the parent folder's config and processor) with that checkpoint's weights (:func:`run_checkpoint_parent`).

The fingerprint is what the cache keys a model by: ``sha256`` over the model's weight files' *contents* and its
``config.json`` (method ``"sha256-content"``). Hashing reads every byte once; a rerun reuses the hash of a file
whose path, size and modification time are unchanged (``hashes.json`` in the scan folder), so a scan of large
models reads them again only when they change. A Hub id is downloaded first (configs and safetensors, into the
Hugging Face cache) and hashed the same way; its revision is the commit the download resolved.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re

__all__ = ["HASH_METHOD", "WEIGHT_PATTERNS", "expand_models", "fingerprint", "local_folder", "run_checkpoint_parent"]

HASH_METHOD = "sha256-content"
# the files whose contents define a model's numbers: its weights (every format Transformers reads) and config
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.pt", "*.pth", "tf_model.h5", "flax_model.msgpack")
_STEP = re.compile(r"checkpoint-(\d+)$")
_CHUNK = 1 << 22


def _sort_key(path: str):
    """Checkpoint folders by step (checkpoint-10 after checkpoint-9), the rest by name."""
    m = _STEP.search(os.path.normpath(path))
    return (os.path.dirname(os.path.normpath(path)), 0 if m else 1, int(m.group(1)) if m else 0, path)


def _checkpoints_of(folder: str) -> list[str]:
    found = [os.path.join(folder, n) for n in os.listdir(folder) if _STEP.fullmatch(n)]
    return sorted((p for p in found if os.path.isdir(p)), key=_sort_key)


def run_checkpoint_parent(folder: str) -> str | None:
    """The training run folder whose config a trainer checkpoint ``folder`` (``checkpoint-<step>`` with
    ``model.safetensors`` and no ``config.json``) is read with; None for any other folder."""
    folder = os.path.normpath(folder)
    parent = os.path.dirname(folder) or "."
    if (
        _STEP.fullmatch(os.path.basename(folder))
        and not os.path.isfile(os.path.join(folder, "config.json"))
        and os.path.isfile(os.path.join(folder, "model.safetensors"))
        and os.path.isfile(os.path.join(parent, "config.json"))
    ):
        return parent
    return None


def _read_list(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8-sig") as fh:
            lines = [line.split("#", 1)[0].strip() for line in fh]
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"models: cannot read the list file {path!r} ({err}); expected one model per line") from None
    base = os.path.dirname(os.path.abspath(path))
    out = []
    for line in filter(None, lines):
        local = line if os.path.isabs(line) else os.path.join(base, line)  # relative to the list file
        out.append(local if (os.path.exists(local) or glob.has_magic(line)) else line)
    if not out:
        raise ValueError(f"models: the list file {path!r} names no model; expected one folder, Hub id or glob per line")
    return out


def _expand_one(item: str, depth: int = 0) -> list[str]:
    if item.startswith("@") or (os.path.isfile(item) and not glob.has_magic(item)):
        if depth >= 4:
            raise ValueError(f"models: list files nest too deeply at {item!r} (a list naming itself?)")
        return [m for line in _read_list(item.removeprefix("@")) for m in _expand_one(line, depth + 1)]
    if glob.has_magic(item):
        hits = sorted((p for p in glob.glob(item) if os.path.isdir(p)), key=_sort_key)
        if not hits:
            raise ValueError(f"models: the pattern {item!r} matches no folder; check the path, or quote the pattern")
        return hits
    if os.path.isdir(item) and not os.path.isfile(os.path.join(item, "config.json")):
        checkpoints = _checkpoints_of(item)
        if checkpoints:
            return checkpoints
    return [item]


def expand_models(models) -> list[str]:
    """The models named by ``models`` (one name, or a list of names, globs and list files), in order, each once.

    Examples:
        >>> from hf_tdiag.zoo.models import expand_models
        >>> expand_models(["org/model-a", "org/model-b", "org/model-a"])
        ['org/model-a', 'org/model-b']
    """
    if isinstance(models, (str, os.PathLike)):
        models = [models]
    if not isinstance(models, (list, tuple)) or not all(isinstance(m, (str, os.PathLike)) for m in models):
        raise TypeError(f"models: expected folder paths, Hub ids, globs or list files (strings), got {models!r:.200}")
    out = []
    for item in models:
        text = os.fspath(item).strip()
        if not text:
            raise ValueError("models: got an empty name; expected a folder, a Hub id, a glob or @list.txt")
        out.extend(_expand_one(text))
    from ..loading import check_source

    seen, unique = set(), []
    for m in out:
        key = os.path.realpath(m) if os.path.exists(m) else m
        if key not in seen:
            seen.add(key)
            unique.append(m if run_checkpoint_parent(m) else check_source(m, "models"))
    if not unique:
        raise ValueError(f"models: {list(models)!r} names no model")
    return unique


def local_folder(source: str) -> tuple[str, str | None]:
    """``(folder, revision)``: a local folder as it is (no revision), a Hub id downloaded (configs, safetensors and
    tokenizer files) into the Hugging Face cache with the commit it resolved."""
    if os.path.isdir(source):
        return source, None
    from huggingface_hub import snapshot_download

    from ..loading import HUB_MODEL_FILES

    try:
        folder = snapshot_download(source, allow_patterns=list(HUB_MODEL_FILES))
    except Exception as err:  # an unknown repo, an unreachable Hub: this model fails, the scan goes on
        raise ValueError(f"model: could not download {source!r} from the Hub ({type(err).__name__}: {err})") from None
    return folder, os.path.basename(os.path.normpath(folder))


def _weight_files(folder: str) -> list[str]:
    import fnmatch

    parent = run_checkpoint_parent(folder)
    if parent is not None:  # a trainer checkpoint: its weights, the run's config
        return [os.path.join(os.pardir, "config.json"), "model.safetensors"]
    names = sorted(n for n in os.listdir(folder) if any(fnmatch.fnmatchcase(n, p) for p in WEIGHT_PATTERNS))
    if not names:
        raise ValueError(f"model: the folder {folder!r} holds no weight files ({', '.join(WEIGHT_PATTERNS)})")
    return ["config.json", *names] if os.path.isfile(os.path.join(folder, "config.json")) else names


def _file_digest(path: str, memo: dict) -> str:
    st = os.stat(path)
    stamp = [int(st.st_size), int(st.st_mtime_ns)]
    key = os.path.realpath(path)
    hit = memo.get(key)
    if isinstance(hit, dict) and hit.get("stat") == stamp and isinstance(hit.get("sha256"), str):
        return hit["sha256"]
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    memo[key] = {"stat": stamp, "sha256": h.hexdigest()}
    return memo[key]["sha256"]


def fingerprint(folder: str, memo: dict | None = None) -> dict:
    """``{"hash", "method", "files", "bytes"}`` of the model in ``folder``: sha256 over the names and sha256 digests
    of its config and weight files (``memo``: path -> cached digest by size and modification time, updated).

    Two folders holding the same bytes have the same hash, whatever their paths; a changed weight or config
    changes it."""
    memo = {} if memo is None else memo
    files = _weight_files(folder)
    h = hashlib.sha256()
    size = 0
    for name in files:
        path = os.path.join(folder, name)
        size += os.path.getsize(path)
        h.update(json.dumps([name, _file_digest(path, memo)]).encode())
    return {"hash": h.hexdigest(), "method": HASH_METHOD, "files": files, "bytes": size}
