"""Turn the report command's input options (an image folder, a dataset name, a text file) into ReportInputs."""

from __future__ import annotations

import os

from hf_tdiag.batching import encoded_batches
from hf_tdiag.inputs import DIGITS_NAMES, digits_test_images, load_images, text_lines
from hf_tdiag.loading import LoadedModel

from .report import ReportInputs, images_to_inputs


def _label_ids(loaded: LoadedModel, names: list[str] | None) -> list[int] | None:
    """Map per-image class names to the model's label ids (by label name, or integer names); None if any fails."""
    if names is None or not loaded.is_classifier:
        return None
    label2id = {str(k).lower(): int(v) for k, v in (loaded.config.label2id or {}).items()}
    ids = []
    for name in names:
        key = name.lower()
        if key in label2id:
            ids.append(label2id[key])
        elif name.isdigit() and int(name) < loaded.config.num_labels:
            ids.append(int(name))
        else:
            return None
    return ids


def inputs_from_args(
    loaded: LoadedModel,
    *,
    images=None,
    dataset: str | None = None,
    texts=None,
    split: str = "test",
    limit: int = 64,
) -> ReportInputs | None:
    """ReportInputs from at most one of ``images`` (folder), ``dataset`` (name) or ``texts`` (file); None if none."""
    given = [n for n, v in (("images", images), ("dataset", dataset), ("texts", texts)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"inputs: give one of --images, --dataset or --texts, got {given}")
    if (images is not None or dataset is not None) and loaded.modality != "image":
        flag = "images" if images is not None else "dataset"
        raise ValueError(f"{flag}: {loaded.source!r} is a text model; images cannot be fed to it (pass --texts FILE)")
    if images is not None or (dataset is not None and dataset.strip().lower() not in DIGITS_NAMES):
        spec = images if images is not None else dataset
        if images is not None and not os.path.isdir(images):
            raise ValueError(f"images: expected a folder of images, got {str(images)!r} (not a folder)")
        found = load_images(spec, split=split if dataset is not None else None, limit=limit)  # size-checked
        names = None
        if found.labels is not None and found.label_names is not None:
            names = [found.label_names[i] for i in found.labels]
        return images_to_inputs(loaded, found.images, _label_ids(loaded, names), description=found.source)
    if dataset is not None:  # digits: the held-out split of the digits training recipe
        pil, labels = digits_test_images(limit)
        if not loaded.is_classifier or loaded.config.num_labels != 10:
            labels = None
        return images_to_inputs(loaded, pil, labels, description="scikit-learn digits, held-out test split")
    if texts is not None:
        return text_inputs(loaded, texts, limit)
    return None


def text_inputs(loaded: LoadedModel, path, limit: int) -> ReportInputs:
    """Tokenized lines of a text file (padded batch with attention_mask)."""
    if loaded.modality != "text":
        raise ValueError(f"texts: {loaded.source!r} is a vision model; give --images or --dataset instead")
    if loaded.processor is None:
        raise ValueError(f"texts: no tokenizer found for {loaded.source!r}; save one next to the model")
    lines = text_lines(path, limit)
    # one right-padded batch (causal models: a text's real tokens never see the padding), checked to fit first
    batches = encoded_batches(loaded, lines, len(lines), max_length=128, name=f"--texts {str(path)!r}",
                              hint="cut its lines to at most {limit} tokens")  # fmt: skip
    batch = next(iter(batches))
    return ReportInputs(batch, None, None, f"{len(lines)} lines of {path}", texts=lines)


__all__ = ["inputs_from_args", "text_inputs"]
