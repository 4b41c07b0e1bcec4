"""``hf-tdiag convert-official CKPT --preset crate-small --output-dir DIR``: official CRATE checkpoint -> Transformers folder."""

from __future__ import annotations

import argparse
import json
import os

from .._cli_args import add_output_dir, plain, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "convert-official",
        help="convert a checkpoint of the official CRATE, CRATE-α or CRATE-MAE code into a Transformers model folder",
        description=plain(
            "Read a state_dict saved by the official CRATE code (.pth/.pt via torch.load(weights_only=True), or "
            ".safetensors), map it onto CrateForImageClassification and write a folder loadable with "
            "AutoModelForImageClassification (also with trust_remote_code=True where hf_tdiag is not installed)."
        ),
    )
    p.add_argument("checkpoint", metavar="CKPT", help="path to the official checkpoint")
    p.add_argument(
        "--preset",
        required=True,
        help="architecture preset, e.g. crate-tiny, crate-base, crate-alpha-base-16, crate-alpha-large-14, crate-mae-base; "
        "text: crate-lm-12l / crate-gpt-12l (CRATE-LM checkpoints), crate-bert-base (Transformers PR #27759); "
        "simdino / simdinov2: a SimDINO checkpoint into Transformers' ViTModel / Dinov2Model, shapes read from it",
    )
    add_output_dir(
        p, None, "folder to write the converted model and its image processor into", "--output", required=True
    )
    p.add_argument("--variant", default="crate", help="output-matrix variant the checkpoint was trained with")
    p.add_argument("--pooling", default="cls", choices=["cls", "mean"], help="token pooling of the checkpoint")
    p.add_argument("--image-size", type=positive_int, default=None, help="override the preset's image size")
    p.add_argument("--labels", default=None, help="optional JSON file: list of class names, or {index: name}")
    p.add_argument("--student", action="store_true", help="simdino/simdinov2: convert the student, not the teacher")
    p.add_argument(
        "--num-heads", type=positive_int, default=None, help="simdino/simdinov2: attention heads (default: width / 64)"
    )
    p.set_defaults(func=run)


def _load_checkpoint(path: str):
    """The checkpoint's contents; ValueError naming the file for a folder, an empty, truncated or foreign file."""
    if os.path.isdir(path):
        raise ValueError(f"checkpoint: {path!r} is a folder; expected a checkpoint file (.pth, .pt or .safetensors)")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint: no such file {path!r}")
    if os.path.getsize(path) == 0:
        raise ValueError(f"checkpoint: {path!r} is empty (0 bytes)")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            loaded = load_file(path)
        else:
            import torch

            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as err:  # pickle, zip and safetensors errors: the file is not a readable state_dict
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        kind = (
            "a safetensors file"
            if path.endswith(".safetensors")
            else "a PyTorch state_dict (torch.load, weights_only=True)"
        )
        raise ValueError(
            f"checkpoint: cannot read {path!r} as {kind}; is it truncated or another kind of file? "
            f"({type(err).__name__}: {first})"
        ) from None
    from hf_tdiag._validation import check_dense_tensors

    check_dense_tensors(loaded, f"checkpoint: {path!r}")
    return loaded


def _check_paths(args: argparse.Namespace) -> None:
    """The checkpoint and --labels files exist, before the output folder is claimed."""
    if not os.path.exists(args.checkpoint):
        raise FileNotFoundError(f"checkpoint: no such file {args.checkpoint!r}")
    if args.labels is not None and not os.path.isfile(args.labels):
        what = "is a folder" if os.path.isdir(args.labels) else "does not exist"
        raise FileNotFoundError(f"--labels: {args.labels!r} {what}; expected a JSON file of class names")


def _read_labels(path: str | None, num_labels: int) -> dict[int, str] | None:
    """Class names from a JSON list or ``{index: name}`` object; ValueError naming --labels for a file that is not
    UTF-8 JSON, an index that is not a whole number, a wrong count, or two classes of one name (label2id would
    merge them)."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8-sig") as fh:
            data = json.load(fh)
    except UnicodeDecodeError:
        raise ValueError(f"--labels: {path!r} is not UTF-8 text; save it as UTF-8 JSON") from None
    except ValueError as err:
        raise ValueError(f"--labels: {path!r} is not valid JSON ({err})") from None
    if isinstance(data, list):
        labels = dict(enumerate(data))
    elif isinstance(data, dict):
        bad = [k for k in data if not str(k).strip().lstrip("-").isdigit()]
        if bad:
            raise ValueError(f"--labels: {path!r} has the key {bad[0]!r}; expected class indices 0..{num_labels - 1}")
        labels = {int(k): v for k, v in data.items()}
    else:
        raise ValueError(f"--labels: expected a JSON list or object, got {type(data).__name__}")
    not_names = [v for v in labels.values() if not isinstance(v, (str, int)) or isinstance(v, bool)]
    if not_names:
        raise ValueError(f"--labels: {path!r}: class names must be strings, got {not_names[0]!r}")
    labels = {k: str(v) for k, v in labels.items()}
    if sorted(labels) != list(range(num_labels)):
        raise ValueError(f"--labels: expected names for classes 0..{num_labels - 1}, got {len(labels)} entries")
    from hf_tdiag._validation import check_unique_labels

    check_unique_labels([labels[i] for i in range(num_labels)], "--labels")
    return labels


MODEL_WRITES = ("config.json", "model.safetensors", "preprocessor_config.json")


def _claim(args: argparse.Namespace) -> None:
    """The output folder, before the checkpoint is read: never a file of the input replaced or removed (a checkpoint
    inside --output-dir stays), files no hf-tdiag run wrote refused, a folder another job writes refused."""
    from hf_tdiag._outputs import TRAIN_PATTERNS, claim_args

    claim_args(args, MODEL_WRITES, inputs=[args.checkpoint, args.labels], stale=TRAIN_PATTERNS, model_output=True)


def run(args: argparse.Namespace) -> int:
    from hf_tdiag.models.crate import CRATE_PRESETS, CrateConfig, CrateImageProcessor
    from hf_tdiag.models.crate.convert_official import convert_official_crate, unwrap_official_state_dict

    from .._atomic import staged_folder
    from ._convert_families import family_of_preset, run_family
    from ._convert_text import check_text_flags, is_text_preset, run_text

    _check_paths(args)
    from ._convert_families import check_simdino_flags, is_simdino_preset, run_simdino

    check_simdino_flags(args)
    if is_simdino_preset(args.preset):  # SimDINO / SimDINOv2 into Transformers' ViT / Dinov2 classes
        return run_simdino(args, _load_checkpoint)
    if is_text_preset(args.preset):  # CRATE-LM / Transformers PR #27759 text checkpoints
        check_text_flags(args)
        _claim(args)
        return run_text(args, _load_checkpoint(args.checkpoint))
    family = family_of_preset(args.preset)
    if args.preset not in CRATE_PRESETS and family is None:
        from ._convert_families import family_presets

        raise ValueError(f"--preset: expected one of {[*CRATE_PRESETS, *family_presets()]}, got {args.preset!r}")
    _claim(args)
    try:
        sd = unwrap_official_state_dict(_load_checkpoint(args.checkpoint))
    except TypeError as err:
        raise ValueError(f"checkpoint: {args.checkpoint!r}: {err}") from None
    if family is not None:
        return run_family(args, sd, _read_labels)
    head = sd.get("mlp_head.1.weight")
    if head is None:
        raise ValueError(
            f"checkpoint: {args.checkpoint!r} has no 'mlp_head.1.weight' (the classifier weight of the official CRATE "
            f"code); found {len(sd)} keys such as {sorted(sd)[:3]}"
        )
    overrides = dict(variant=args.variant, pooling=args.pooling, num_labels=int(head.shape[0]))
    if args.image_size is not None:
        overrides["image_size"] = args.image_size
    config = CrateConfig.from_preset(args.preset, **overrides)
    labels = _read_labels(args.labels, config.num_labels)
    if labels is not None:
        config.id2label = labels
        config.label2id = {v: k for k, v in labels.items()}
    model = convert_official_crate(sd, config)
    with staged_folder(args.output_dir) as stage:  # a full disk leaves no config without weights
        model.save_pretrained(stage)
        CrateImageProcessor.for_config(config).save_pretrained(stage)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"converted {args.checkpoint} -> {args.output_dir}: {args.preset} ({config.variant}, {config.num_hidden_layers} "
        f"layers, d={config.hidden_size}, {config.num_labels} classes, {n_params / 1e6:.2f}M parameters)"
    )
    return 0
