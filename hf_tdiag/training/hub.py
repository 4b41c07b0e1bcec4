"""Publishing a trained CRATE to the Hugging Face Hub.

The filled model card is pushed *last*, rendered for the repo id the Hub resolved (``model.push_to_hub`` of the
model in memory sends, with the weights, the family's card without a training record,
:mod:`hf_tdiag._hub_card`). The model push carries the safetensors weights,
the config with its ``auto_map`` and the ``configuration_crate.py`` /
``modeling_crate.py`` files (CRATE classes are registered for the Auto
classes), so the repo loads with ``trust_remote_code=True`` where hf-tdiag is
not installed; the processor push adds ``preprocessor_config.json`` and
``image_processing_crate.py``. The endpoint comes from ``HF_ENDPOINT`` as
everywhere in ``huggingface_hub``.

:func:`check_hub_reachable` runs before training when ``--push-to-hub`` is set: with ``HF_HUB_OFFLINE`` set, or
when the endpoint does not accept a connection within a few seconds, it fails at once (instead of after the
training and ``huggingface_hub``'s retries) with a message that names ``HF_HUB_OFFLINE`` and the local folder.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from .._atomic import write_text

EXTRA_FILES = ("all_results.json", "layer_srr.json", "layer_srr.png", "srr_history.json")
CONNECT_TIMEOUT_S = 5.0
_TRUE = ("1", "on", "yes", "true")


class HubUnreachableError(ConnectionError):
    """The Hub cannot be reached (offline mode, or no connection to the endpoint)."""


def _local_alternative(output_dir: str | None) -> str:
    folder = f"the local folder {output_dir!r}" if output_dir else "the output folder"
    return (
        f"the trained model stays in {folder}, which loads with from_pretrained(<folder>); train without "
        "--push-to-hub, or publish the folder later with hf_tdiag.training.publish(folder, repo_id)"
    )


def check_hub_reachable(endpoint: str | None = None, output_dir: str | None = None, timeout=CONNECT_TIMEOUT_S) -> str:
    """The Hub endpoint, after checking it accepts a TCP connection within ``timeout`` seconds; else
    :class:`HubUnreachableError` naming ``HF_HUB_OFFLINE`` and the local-folder alternative. No HTTP, no retries."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
        raise HubUnreachableError(
            f"push_to_hub: HF_HUB_OFFLINE is set, so nothing can be uploaded; {_local_alternative(output_dir)}, "
            "or unset HF_HUB_OFFLINE"
        )
    endpoint = endpoint or constants.ENDPOINT
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            pass
    except OSError as err:
        raise HubUnreachableError(
            f"push_to_hub: the Hub at {endpoint} is unreachable ({err.__class__.__name__}: {err}); "
            f"{_local_alternative(output_dir)}; with no network, set HF_HUB_OFFLINE=1 so nothing tries to connect"
        ) from None
    return endpoint


def publish(
    output_dir: str,
    repo_id: str,
    *,
    model=None,
    processor=None,
    card=None,
    token: str | None = None,
    private: bool = False,
    commit_message: str = "Upload CRATE model trained with hf-tdiag",
) -> str:
    """Create ``repo_id`` and upload model, processor, results/figure and the card; returns the repo URL.

    Without ``model``/``processor``/``card`` objects, the corresponding files are taken from ``output_dir``
    (a folder written by :func:`hf_tdiag.training.train`). ``card`` may be a callable ``card(repo_id)`` that
    renders the card for the repo id the Hub resolved (``namespace/name``), so its usage snippet names the repo;
    the pushed card is also written to ``output_dir/README.md``.
    """
    from huggingface_hub import HfApi, ModelCard

    if not isinstance(repo_id, str) or not repo_id.strip() or repo_id.count("/") > 1:
        raise ValueError(f"repo_id: expected 'name' or 'namespace/name', got {repo_id!r}")
    if not os.path.isdir(output_dir):
        raise FileNotFoundError(f"output_dir: {output_dir!r} is not a folder")
    check_hub_reachable(output_dir=output_dir)
    api = HfApi(token=token)
    url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    repo_id = url.repo_id
    if model is None or processor is None:
        from transformers import AutoModelForImageClassification

        from ..loading import load_image_processor, load_pretrained

        model = model or load_pretrained(output_dir, AutoModelForImageClassification, name="output_dir")
        processor = processor or load_image_processor(output_dir)
    model.push_to_hub(repo_id, token=token, commit_message=commit_message)
    processor.push_to_hub(repo_id, token=token, commit_message="Upload image processor")
    extras = [name for name in EXTRA_FILES if os.path.isfile(os.path.join(output_dir, name))]
    if extras:
        api.upload_folder(
            repo_id=repo_id,
            folder_path=output_dir,
            allow_patterns=list(extras),
            commit_message="Upload results and per-layer SRR figure",
        )
    if card is None:
        card = ModelCard.load(os.path.join(output_dir, "README.md"))
    elif callable(card) and not isinstance(card, ModelCard):
        card = card(repo_id)
        write_text(os.path.join(output_dir, "README.md"), card.content)
    card.push_to_hub(repo_id, token=token, commit_message="Upload model card")
    return str(url)


__all__ = ["publish", "check_hub_reachable", "HubUnreachableError", "EXTRA_FILES"]
