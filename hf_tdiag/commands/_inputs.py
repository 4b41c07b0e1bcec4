"""The inputs a measuring command's flags name, as batches for the loaded model: the lines of ``--texts`` through its
tokenizer, or the images of ``--images``/``--dataset`` through its image processor, one batch at a time."""

from __future__ import annotations

import os


def flag_batches(args, loaded):
    """``(batches, count)`` of the inputs ``args`` names for ``loaded`` (``--batch-size`` per batch; texts cut to
    ``--max-length`` tokens and checked to fit the model first)."""
    from hf_tdiag.batching import encoded_batches
    from hf_tdiag.inputs import load_images, text_lines

    if args.texts is not None:
        if loaded.modality != "text" or loaded.processor is None:
            raise ValueError(f"texts: {loaded.source!r} is not a text model with a tokenizer in its folder")
        items, name = text_lines(args.texts, args.max_samples), f"--texts {args.texts!r}"
    else:
        if args.images is not None and not os.path.isdir(args.images):
            raise ValueError(f"images: expected a folder, got {args.images!r}")
        items = load_images(args.images or args.dataset, split=args.split, limit=args.max_samples).images
        name = "images"
    return encoded_batches(loaded, items, args.batch_size, max_length=args.max_length, name=name), len(items)
