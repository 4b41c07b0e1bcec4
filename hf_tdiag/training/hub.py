"""Publishing a trained CRATE to the Hugging Face Hub.

Order matters: ``model.push_to_hub`` writes a generic README, so the filled
model card is pushed *last*. The model push carries the safetensors weights,
the config with its ``auto_map`` and the ``configuration_crate.py`` /
``modeling_crate.py`` files (CRATE classes are registered for the Auto
classes), so the repo loads with ``trust_remote_code=True`` where hf-tdiag is
not installed; the processor push adds ``preprocessor_config.json`` and
``image_processing_crate.py``. The endpoint comes from ``HF_ENDPOINT`` as
everywhere in ``huggingface_hub``.
"""

from __future__ import annotations

import os

EXTRA_FILES = ("all_results.json", "layer_srr.json", "layer_srr.png", "srr_history.json")


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
    (a folder written by :func:`hf_tdiag.training.train`).
    """
    from huggingface_hub import HfApi, ModelCard

    if not isinstance(repo_id, str) or not repo_id.strip() or repo_id.count("/") > 1:
        raise ValueError(f"repo_id: expected 'name' or 'namespace/name', got {repo_id!r}")
    if not os.path.isdir(output_dir):
        raise FileNotFoundError(f"output_dir: {output_dir!r} is not a folder")
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
    card.push_to_hub(repo_id, token=token, commit_message="Upload model card")
    return str(url)


__all__ = ["publish", "EXTRA_FILES"]
