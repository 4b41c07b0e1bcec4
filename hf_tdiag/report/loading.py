"""Load a model (object, local folder or Hub id) and its processor for the report and the Space.

Models named by a string are always loaded with ``trust_remote_code=False``: a user-typed id never runs code from
the Hub. CRATE loads anyway because importing hf_tdiag registers it with the Auto classes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError
from torch import nn

import hf_tdiag  # noqa: F401  (registers CRATE with the Auto classes)


MAX_IMAGE_PIXELS = 4096 * 4096
MAX_IMAGE_BYTES = 25 * 1024 * 1024


class UserInputError(ValueError):
    """Bad input from a person (shown to them verbatim)."""


@dataclass
class LoadedModel:
    """A model ready for diagnostics: the module (eval mode), its processor (or None) and where it came from."""

    model: nn.Module
    processor: Any
    source: str
    modality: str  # "image" | "text"

    @property
    def config(self):
        return self.model.config

    @property
    def model_type(self) -> str:
        return getattr(self.model.config, "model_type", "") or ""

    @property
    def is_classifier(self) -> bool:
        return hasattr(self.model, "classifier") and int(getattr(self.model.config, "num_labels", 0) or 0) > 0


def _is_vision_config(config) -> bool:
    return getattr(config, "model_type", "") == "crate" or (
        hasattr(config, "image_size") and hasattr(config, "patch_size") and hasattr(config, "num_channels")
    )


def _wants_classifier(config) -> bool:
    archs = getattr(config, "architectures", None) or []
    return any(a.endswith("ForImageClassification") for a in archs) or getattr(config, "model_type", "") == "crate"


def _image_processor_for(model: nn.Module, source: str | None):
    from transformers import AutoImageProcessor

    if source is not None:
        try:
            return AutoImageProcessor.from_pretrained(source, trust_remote_code=False)
        except (OSError, ValueError, KeyError):
            pass
    config = model.config
    if getattr(config, "model_type", "") == "crate":
        from hf_tdiag.models.crate import CrateImageProcessor

        return CrateImageProcessor.for_config(config)
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
    channels = int(getattr(config, "num_channels", 3))
    fields = {"size": {"height": size, "width": size}}
    if channels != 3:  # ImageNet statistics have 3 entries; other channel counts get 0.5/0.5 per channel
        fields.update(image_mean=[0.5] * channels, image_std=[0.5] * channels)
    if channels == 1:
        fields["do_convert_rgb"] = False
    return ViTImageProcessorPil(**fields)


def _text_processor_for(source: str | None):
    if source is None:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_model(spec, *, eager_attention: bool = True) -> LoadedModel:
    """Load ``spec`` (a Transformers model, a local folder or a Hub id) for diagnostics, in eval mode.

    ``eager_attention`` switches the attention implementation to ``eager`` so attention maps are returned.
    Raises ValueError naming ``model`` for an unknown id, an unreadable folder or a model without a config.
    """
    source = None
    if isinstance(spec, nn.Module):
        model = spec
        if getattr(model, "config", None) is None:
            raise TypeError(f"model: expected a Transformers model with a .config, got {type(model).__name__}")
        source = getattr(model.config, "_name_or_path", "") or type(model).__name__
        name_for_processor = source if source and os.path.isdir(source) else None
    elif isinstance(spec, (str, os.PathLike)):
        source = os.fspath(spec).strip()
        if not source:
            raise ValueError("model: expected a local model folder or a Hub model id, got an empty string")
        model = _from_pretrained(source, eager_attention)
        name_for_processor = source
    else:
        raise TypeError(f"model: expected a Transformers model, a folder path or a Hub id, got {type(spec).__name__}")
    if eager_attention and hasattr(model, "set_attn_implementation") and model.config.model_type != "crate":
        try:
            model.set_attn_implementation("eager")
        except (ValueError, AttributeError):
            pass
    model.eval()
    if _is_vision_config(model.config):
        return LoadedModel(model, _image_processor_for(model, name_for_processor), source, "image")
    return LoadedModel(model, _text_processor_for(name_for_processor), source, "text")


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")


def _from_pretrained(source: str, eager_attention: bool) -> nn.Module:
    from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

    if os.path.exists(source) and not os.path.isdir(source):
        raise ValueError(f"model: expected a model folder (with config.json) or a Hub id, got the file {source!r}")
    if not os.path.exists(source) and not _HUB_ID.fullmatch(source):
        raise ValueError(
            f"model: {source!r} is not an existing folder and not a valid Hub id (expected 'name' or 'namespace/name')"
        )
    if os.path.isdir(source) and not os.path.isfile(os.path.join(source, "config.json")):
        raise ValueError(f"model: the folder {source!r} has no config.json; expected a folder written by save_pretrained")
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    except ValueError as err:
        raise ValueError(
            f"model: {source!r} could not be loaded without running its own code (trust_remote_code=False): {err}"
        ) from None
    except (OSError, EnvironmentError) as err:
        raise ValueError(
            f"model: {source!r} is neither a local model folder nor a model id reachable on the Hub ({_short(err)})"
        ) from None
    kwargs: dict[str, Any] = {"trust_remote_code": False}
    if eager_attention and config.model_type != "crate":
        kwargs["attn_implementation"] = "eager"
    auto = AutoModelForImageClassification if _wants_classifier(config) else AutoModel
    try:
        return auto.from_pretrained(source, **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise ValueError(f"model: could not load weights of {source!r} as {auto.__name__}: {_short(err)}") from None


def _short(err: BaseException, limit: int = 300) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def pixel_values_for(images: list, loaded: LoadedModel) -> torch.Tensor:
    """Processor output ``(B, C, H, W)`` for PIL images, converted to the model's channel count first."""
    if loaded.modality != "image" or loaded.processor is None:
        raise ValueError(f"model: {loaded.source!r} is not a vision model; images cannot be fed to it")
    if not images:
        raise ValueError("images: expected at least one image, got none")
    channels = int(getattr(loaded.config, "num_channels", 3))
    mode = "L" if channels == 1 else "RGB"
    converted = [im.convert(mode) if getattr(im, "mode", mode) != mode else im for im in images]
    pixel_values = loaded.processor(images=converted, return_tensors="pt")["pixel_values"]
    if pixel_values.shape[1] != channels:
        raise ValueError(
            f"images: the processor produced {pixel_values.shape[1]} channels but the model expects {channels}"
        )
    return pixel_values


def check_image_size(image, max_pixels: int = MAX_IMAGE_PIXELS) -> None:
    """UserInputError when ``image`` (PIL) is empty or has more than ``max_pixels`` pixels."""
    width, height = image.size
    if width * height > max_pixels:
        raise UserInputError(
            f"image: {width}x{height} pixels is too large; the limit is {max_pixels:,} pixels (e.g. 4096x4096)"
        )
    if width < 1 or height < 1:
        raise UserInputError(f"image: expected a non-empty image, got {width}x{height}")


def open_image(path, *, max_pixels: int = MAX_IMAGE_PIXELS, max_bytes: int = MAX_IMAGE_BYTES) -> Image.Image:
    """Open an uploaded image file with size checks before decoding; UserInputError for anything unusable."""
    if path is None or (isinstance(path, str) and not path.strip()):
        raise UserInputError("image: no image given; upload an image or pick a digits example")
    if isinstance(path, Image.Image):
        image = path
    else:
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise UserInputError(f"image: file not found: {os.path.basename(path)!r}")
        size = os.path.getsize(path)
        if size > max_bytes:
            raise UserInputError(f"image: file is {size / 2**20:.1f} MiB; the limit is {max_bytes / 2**20:.0f} MiB")
        try:
            image = Image.open(path)  # reads the header only
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError):
            raise UserInputError(
                f"image: {os.path.basename(path)!r} is not an image file Pillow can read (PNG, JPEG, WebP, BMP, GIF…)"
            ) from None
    check_image_size(image, max_pixels)
    try:
        image.load()
    except (OSError, ValueError) as err:
        raise UserInputError(f"image: the file is damaged or truncated ({err})") from None
    return image


__all__ = ["LoadedModel", "UserInputError", "check_image_size", "load_model", "open_image", "pixel_values_for"]
