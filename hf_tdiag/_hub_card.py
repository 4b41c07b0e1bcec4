"""The card ``save_pretrained`` and ``push_to_hub`` write for every hf-tdiag family (CRATE, CRATE-α, CRATE-MAE,
ToST, text CRATE).

Each family's ``PreTrainedModel`` mixes in :class:`HubCardMixin` through a guarded import (where ``hf_tdiag`` is not
importable, as in a folder loaded with ``trust_remote_code``, the models keep ``transformers``' own behaviour).

- ``save_pretrained(folder)`` writes ``folder/README.md`` unless the folder already holds a README that hf-tdiag did
  not write (a user's card is never replaced).
- ``push_to_hub(repo_id)`` (and ``save_pretrained(..., push_to_hub=True)``): ``transformers`` puts the repo's
  current card, or its generic template when the repo has none, into the folder it uploads, then calls
  ``_upload_modified_files(folder, repo_id, ...)``; the mixin hooks that one call, so one commit carries the card.
  A card on the Hub that hf-tdiag did not write is kept; the generic template or an earlier hf-tdiag card is
  replaced.

The card: when the model was loaded from a local folder whose README is an hf-tdiag card (a training run's, with its
metrics) and the weights being saved are still that folder's weights, that card with its usage snippet naming the
new repo id or folder; otherwise :func:`hf_tdiag.training.model_card.build_family_card` for the config, with
``base_model`` when the model was loaded from a Hub id, and the statement that no training record came with it.
"""

from __future__ import annotations

import json
import os

README = "README.md"


class HubCardMixin:
    """``save_pretrained`` / ``push_to_hub`` write hf-tdiag's model card (see the module docstring)."""

    def save_pretrained(self, save_directory, *args, **kwargs):
        result = super().save_pretrained(save_directory, *args, **kwargs)
        is_main = kwargs.get("is_main_process", args[0] if args else True)
        if is_main and not kwargs.get("push_to_hub", False):  # a push wrote the repo's card already
            write_card(self, str(save_directory), target=None)
        return result

    def _upload_modified_files(self, working_dir, repo_id, *args, **kwargs):
        write_card(self, str(working_dir), target=repo_id)
        return super()._upload_modified_files(working_dir, repo_id, *args, **kwargs)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (FileNotFoundError, IsADirectoryError):
        return None


def _weight_index(folder: str) -> dict[str, str] | None:
    """tensor name -> safetensors file of a saved folder (one file or a sharded index), else ``None``."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as fh:
            return {k: os.path.join(folder, v) for k, v in json.load(fh)["weight_map"].items()}
    single = os.path.join(folder, "model.safetensors")
    if not os.path.isfile(single):
        return None
    from safetensors import safe_open

    with safe_open(single, framework="pt") as fh:
        return {k: single for k in fh.keys()}


def same_weights(folder_a: str, folder_b: str) -> bool:
    """Whether two saved folders hold the same tensors (names, dtypes, shapes and values), one tensor at a time."""
    import torch
    from safetensors import safe_open

    a, b = _weight_index(folder_a), _weight_index(folder_b)
    if a is None or b is None or a.keys() != b.keys():
        return False
    handles: dict[str, object] = {}
    try:
        for name in sorted(a):
            for path in (a[name], b[name]):
                if path not in handles:
                    handles[path] = safe_open(path, framework="pt").__enter__()
            x, y = handles[a[name]].get_tensor(name), handles[b[name]].get_tensor(name)
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
                return False
        return True
    finally:
        for handle in handles.values():
            handle.__exit__(None, None, None)


def auto_class_of(model, folder: str) -> str:
    """The Auto class that loads ``type(model)`` (from the ``auto_map`` the saved config carries), else ``AutoModel``."""
    config = {}
    text = _read(os.path.join(folder, "config.json"))
    if text:
        config = json.loads(text)
    auto_map = config.get("auto_map") or getattr(model.config, "auto_map", None) or {}
    name = type(model).__name__
    for auto, target in sorted(auto_map.items()):
        if auto.startswith("AutoModel") and str(target).split(".")[-1] == name:
            return auto
    return "AutoModel"


def _origin(model) -> str:
    return str(getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "") or "")


def _is_repo_id(value: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not value or os.path.isabs(value) or value.startswith("."):
        return False
    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def _same_folder(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def card_text(model, folder: str, target: str) -> str:
    """The card for ``model`` saved in ``folder``, its usage snippet naming ``target`` (a repo id or folder path)."""
    from .training.model_card import build_family_card, is_project_card, retarget_card

    origin = _origin(model)
    local = bool(origin) and os.path.isdir(origin) and not _same_folder(origin, folder)
    changed = None
    if local:
        changed = not same_weights(origin, folder)
        earlier = _read(os.path.join(origin, README))
        if not changed and is_project_card(earlier):
            return retarget_card(earlier, target)
    from_hub = _is_repo_id(origin) and not os.path.isdir(origin)  # loaded by Hub id (and not pushed back there)
    card = build_family_card(
        model.config,
        target,
        class_name=type(model).__name__,
        auto_class=auto_class_of(model, folder),
        num_parameters=sum(p.numel() for p in model.parameters()),
        base_model=origin if from_hub and origin != target else None,
        derived_from=os.path.basename(os.path.normpath(origin)) if local else None,
        weights_changed=bool(changed),
    )
    return str(card)


def write_card(model, folder: str, target: str | None) -> bool:
    """Write ``folder/README.md`` for ``model``: for a push (``target`` the repo id) unless the README there is a
    card hf-tdiag did not write and is not ``transformers``' generic one; for a save (``target`` None: the folder's
    own path, :func:`~hf_tdiag.training.model_card.folder_display`) unless the folder holds a README hf-tdiag did not
    write. Returns whether it wrote."""
    from ._atomic import write_text
    from .training.model_card import folder_display, is_placeholder_card, is_project_card

    path = os.path.join(folder, README)
    existing = _read(path)
    if target is None:
        if existing is not None and not is_project_card(existing):
            return False  # the user's README
        if existing is not None and _same_folder(_origin(model) or "", folder):
            return False  # saved back where it was loaded from: its card stays as it is
        target = folder_display(folder)
    elif not (is_placeholder_card(existing) or is_project_card(existing)):
        return False  # the repo's own card
    write_text(path, card_text(model, folder, target))
    return True


__all__ = ["HubCardMixin", "write_card", "card_text", "same_weights", "auto_class_of"]
