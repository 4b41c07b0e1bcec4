"""Every model, image processor and tokenizer hf-tdiag loads: a Transformers model object, a local folder written
by ``save_pretrained`` or a Hub id.

Nothing is loaded with remote code unless the caller passes ``trust_remote_code=True`` (the user's explicit flag):
a repository whose config names custom code (``auto_map``) is refused with a clear error — never a "run the custom
code? [y/N]" prompt, even under a terminal. CRATE loads without remote code because importing hf_tdiag registers
it with the Auto classes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import hf_tdiag  # noqa: F401  (registers CRATE with the Auto classes)

from ._model_limits import check_finite_weights

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")


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


def _short(err: BaseException, limit: int = 300) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_trust(trust_remote_code) -> bool:
    if not isinstance(trust_remote_code, bool):
        raise TypeError(f"trust_remote_code: expected True or False, got {trust_remote_code!r}")
    return trust_remote_code


def check_source(source, name: str = "model") -> str:
    """``source`` as a string after checking it is a folder with ``config.json`` or a well-formed Hub id."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a local model folder or a Hub id (str), got {type(source).__name__}")
    source = os.fspath(source).strip()
    if not source:
        raise ValueError(f"{name}: expected a local model folder or a Hub model id, got an empty string")
    if os.path.exists(source) and not os.path.isdir(source):
        raise ValueError(f"{name}: expected a model folder (with config.json) or a Hub id, got the file {source!r}")
    if not os.path.exists(source) and not HUB_ID.fullmatch(source):
        raise ValueError(
            f"{name}: {source!r} is not an existing folder and not a valid Hub id (expected 'name' or 'namespace/name')"
        )
    if os.path.isdir(source) and not os.path.isfile(os.path.join(source, "config.json")):
        raise ValueError(
            f"{name}: the folder {source!r} has no config.json; expected a folder written by save_pretrained"
        )
    return source


def _refusal(source: str, name: str) -> str:
    return (
        f"{name}: {source!r} needs its own Python code to load (its config has an auto_map / unknown model type); "
        "hf-tdiag loads with trust_remote_code=False and runs a repository's code only when you opt in with "
        "trust_remote_code=True (--trust-remote-code on the command line)"
    )


def load_config(source, *, trust_remote_code: bool = False, name: str = "model"):
    """``AutoConfig`` of ``source`` (folder or Hub id); a clear ValueError for a refused, missing or bad repo."""
    from transformers import AutoConfig

    source = check_source(source, name)
    trust = _check_trust(trust_remote_code)
    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=trust)
    except ValueError as err:
        if _is_native(source):  # a model type Transformers knows (CRATE included) whose values are refused
            raise ValueError(f"{name}: {os.path.join(source, 'config.json')!r}: {_short(err)}") from None
        if not trust and ("trust_remote_code" in str(err) or _has_auto_map(source)):
            raise ValueError(_refusal(source, name)) from None
        raise ValueError(f"{name}: {source!r} has a config Transformers cannot read ({_short(err)})") from None
    except OSError as err:
        if os.path.isdir(source):  # check_source saw its config.json: the file itself is unreadable or not JSON
            raise ValueError(
                f"{name}: {os.path.join(source, 'config.json')!r} is not a readable JSON config ({_short(err)})"
            ) from None
        raise ValueError(
            f"{name}: {source!r} is neither a local model folder nor a model id reachable on the Hub ({_short(err)})"
        ) from None


def _is_native(source: str) -> bool:
    """``source`` is a folder whose config.json names a model type registered with AutoConfig."""
    from transformers import CONFIG_MAPPING

    try:
        with open(os.path.join(source, "config.json"), encoding="utf-8") as fh:
            return json.load(fh).get("model_type") in CONFIG_MAPPING
    except (OSError, ValueError, AttributeError):
        return False


def _weights_error(source: str, name: str, err: BaseException) -> ValueError:
    """A damaged weights file, named: the folder's ``*.safetensors`` files (or the source when it has none)."""
    files = sorted(f for f in os.listdir(source) if f.endswith(".safetensors")) if os.path.isdir(source) else []
    where = ", ".join(repr(os.path.join(source, f)) for f in files) or repr(source)
    return ValueError(f"{name}: cannot read the weights in {where}: truncated or corrupt file ({_short(err)})")


def _has_auto_map(source: str) -> bool:
    path = os.path.join(source, "config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            return "auto_map" in json.load(fh)
    except (OSError, ValueError):
        return False


_LAYER_KEY = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)\.")


def _weight_names(source: str) -> list[str]:
    """The tensor names of a local folder's safetensors weights, from the headers only (empty if none)."""
    index = os.path.join(source, "model.safetensors.index.json")
    try:
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as fh:
                return list(json.load(fh).get("weight_map", {}))
        single = os.path.join(source, "model.safetensors")
        if os.path.isfile(single):
            from safetensors import safe_open

            with safe_open(single, framework="pt") as fh:
                return list(fh.keys())
    except Exception:  # noqa: BLE001 - a damaged file is reported by from_pretrained, with its name
        return []
    return []


def check_layers_against_weights(source, config, name: str = "model") -> None:
    """ValueError when ``config.json`` claims more blocks than the weights hold (checked before anything is built:
    a config claiming 10⁹ layers would otherwise build layers for minutes, and a few extra would be random)."""
    claimed = getattr(config, "num_hidden_layers", None)
    if not isinstance(claimed, int) or not os.path.isdir(os.fspath(source)):
        return
    found = {int(m.group(1)) for n in _weight_names(os.fspath(source)) for m in [_LAYER_KEY.search(n)] if m}
    if found and claimed > max(found) + 1:
        raise ValueError(
            f"{name}: {os.path.join(os.fspath(source), 'config.json')!r} says num_hidden_layers={claimed}, but the "
            f"weights hold {max(found) + 1} blocks; fix config.json (or the weights) so they agree"
        )


class _HeldReports(logging.Filter):
    """Holds back transformers' ``LOAD REPORT`` records while a model loads; :meth:`replay` logs them after all."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in str(record.msg):
            self.records.append(record)
            return False
        return True

    def replay(self) -> None:
        for record in self.records:
            logging.getLogger(record.name).handle(record)


@contextlib.contextmanager
def quiet_loading():
    """While a model loads: no "Loading weights" bar (transformers' progress bars off, then restored) and the
    ``LOAD REPORT`` held back (yields the holder; its ``replay()`` logs the report)."""
    from transformers.utils import logging as hf_logging

    held = _HeldReports()
    logger = logging.getLogger("transformers.modeling_utils")
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    logger.addFilter(held)
    try:
        yield held
    finally:
        logger.removeFilter(held)
        if bars:
            hf_logging.enable_progress_bar()


def _only_other_heads(model, info: dict) -> bool:
    """Whether the load left nothing to report but checkpoint weights of another head: a backbone (``AutoModel``)
    loaded from a classifier's (or a pre-training model's) checkpoint, whose head weights it has no place for. A
    missing or size-mismatched weight, or an unexpected one inside the backbone, is a real problem."""
    if info.get("missing_keys") or info.get("mismatched_keys") or info.get("error_msgs"):
        return False
    prefix = getattr(model, "base_model_prefix", "") or ""
    unexpected = list(info.get("unexpected_keys") or [])
    if not unexpected or not prefix or getattr(model, prefix, None) is not None:
        return not unexpected  # a head model: any unexpected key is its own problem
    own = {name.split(".", 1)[0] for name, _ in model.named_parameters()} | {
        name.split(".", 1)[0] for name, _ in model.named_buffers()
    }
    return all(key.split(".", 1)[0] not in own and not key.startswith(prefix + ".") for key in unexpected)


def load_pretrained(
    source, auto_class=None, *, config=None, trust_remote_code: bool = False, name: str = "model", **kwargs
) -> nn.Module:
    """``auto_class.from_pretrained(source, trust_remote_code=..., **kwargs)`` with hf-tdiag's checks and errors.

    ``auto_class`` defaults to ``AutoModelForImageClassification`` for image classifiers (and CRATE),
    ``AutoModelForCausalLM`` for a checkpoint saved from a causal language model (``*ForCausalLM`` /
    ``*LMHeadModel`` in ``config.architectures``: its LM head is what the diagnostics read out), else ``AutoModel``; ``config`` (from :func:`load_config`) is read when not given. ValueError naming ``name`` for a
    refused custom-code repo, a missing repo or unreadable weights.
    """
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForImageClassification

    trust = _check_trust(trust_remote_code)
    source = check_source(source, name)
    if config is None:
        config = load_config(source, trust_remote_code=trust, name=name)
    check_layers_against_weights(source, config, name)
    if auto_class is None:
        auto_class = (
            AutoModelForImageClassification
            if _wants_classifier(config)
            else AutoModelForCausalLM
            if _wants_causal_lm(config)
            else AutoModel
        )
    try:
        with quiet_loading() as reports:
            model, info = auto_class.from_pretrained(
                source, config=config, trust_remote_code=trust, output_loading_info=True, **kwargs
            )
        if not _only_other_heads(model, info):
            reports.replay()  # a missing, mismatched or unexpected weight of this model's own: transformers' report
        return model
    except ValueError as err:
        if not trust and "trust_remote_code" in str(err):
            raise ValueError(_refusal(source, name)) from None
        raise ValueError(f"{name}: could not load {source!r} as {auto_class.__name__}: {_short(err)}") from None
    except (OSError, KeyError, RuntimeError) as err:
        raise ValueError(
            f"{name}: could not load weights of {source!r} as {auto_class.__name__}: {_short(err)}"
        ) from None
    except Exception as err:
        if type(err).__name__ == "SafetensorError":  # safetensors' own exception type: a truncated or garbled file
            raise _weights_error(source, name, err) from None
        if type(err).__name__ == "UnpicklingError":  # a garbled pytorch_model.bin; never advise weights_only=False
            files = sorted(f for f in os.listdir(source) if f.endswith(".bin")) if os.path.isdir(source) else []
            where = ", ".join(repr(os.path.join(source, f)) for f in files) or repr(source)
            raise ValueError(
                f"{name}: cannot read the weights in {where}: not a PyTorch weights file (damaged, or not written by "
                "torch.save); nothing was run. Re-save the model with save_pretrained (safetensors)"
            ) from None
        raise


def load_image_processor(source, *, trust_remote_code: bool = False):
    """``AutoImageProcessor`` of ``source`` or None when it has none (never runs remote code unless asked)."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(source, trust_remote_code=_check_trust(trust_remote_code))
    except (OSError, ValueError, KeyError):
        return None


# a folder holds a tokenizer only with one of these (vocabulary, merges, sentencepiece model or tokenizer config)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model",
                    "spiece.model", "sentencepiece.bpe.model", "special_tokens_map.json", "tokenizer.tiktoken")  # fmt: skip


def load_tokenizer(source, *, trust_remote_code: bool = False):
    """``AutoTokenizer`` of ``source`` or None when it has none (never runs remote code unless asked)."""
    from transformers import AutoTokenizer

    if os.path.isdir(source) and not any(os.path.isfile(os.path.join(source, f)) for f in _TOKENIZER_FILES):
        return None  # transformers would build a tokenizer of special tokens only, reading every word as unknown
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=_check_trust(trust_remote_code))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _is_vision_config(config) -> bool:
    return getattr(config, "model_type", "") == "crate" or (
        hasattr(config, "image_size") and hasattr(config, "patch_size") and hasattr(config, "num_channels")
    )


def _wants_classifier(config) -> bool:
    archs = getattr(config, "architectures", None) or []
    return any(a.endswith("ForImageClassification") for a in archs) or getattr(config, "model_type", "") == "crate"


def _wants_causal_lm(config) -> bool:
    archs = getattr(config, "architectures", None) or []
    return any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in archs)


def default_image_processor(config):
    """The processor an image model without a saved one gets: CRATE's own, else ViT's at the model's size."""
    if getattr(config, "model_type", "") == "crate":
        from hf_tdiag.models.crate import CrateImageProcessor

        return CrateImageProcessor.for_config(config)
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    from hf_tdiag.models.crate.configuration_crate import size_pair

    height, width = size_pair(config.image_size, "image_size")
    channels = int(getattr(config, "num_channels", 3))
    fields = {"size": {"height": height, "width": width}}
    if channels != 3:  # ImageNet statistics have 3 entries; other channel counts get 0.5/0.5 per channel
        fields.update(image_mean=[0.5] * channels, image_std=[0.5] * channels)
    if channels == 1:
        fields["do_convert_rgb"] = False
    return ViTImageProcessorPil(**fields)


def _model_from_spec(spec, eager_attention: bool, trust: bool) -> tuple[nn.Module, str, str | None]:
    """(model, source description, folder/id to look for a processor in) for a model object or a name."""
    if isinstance(spec, nn.Module):
        if getattr(spec, "config", None) is None:
            raise TypeError(f"model: expected a Transformers model with a .config, got {type(spec).__name__}")
        source = getattr(spec.config, "_name_or_path", "") or type(spec).__name__
        return spec, source, source if source and os.path.isdir(source) else None
    if isinstance(spec, (str, os.PathLike)):
        source = check_source(spec)
        config = load_config(source, trust_remote_code=trust)
        kwargs = {"attn_implementation": "eager"} if eager_attention and config.model_type != "crate" else {}
        return load_pretrained(source, config=config, trust_remote_code=trust, **kwargs), source, source
    raise TypeError(f"model: expected a Transformers model, a folder path or a Hub id, got {type(spec).__name__}")


def load_model(spec, *, eager_attention: bool = True, trust_remote_code: bool = False) -> LoadedModel:
    """Load ``spec`` (a Transformers model, a local folder or a Hub id) for diagnostics, in eval mode, with its
    image processor or tokenizer.

    ``eager_attention`` switches the attention implementation to ``eager`` so attention maps are returned.
    Raises ValueError naming ``model`` for an unknown id, an unreadable folder, a model without a config or a
    repository that needs its own code (unless ``trust_remote_code=True``).
    """
    trust = _check_trust(trust_remote_code)
    model, source, processor_source = _model_from_spec(spec, eager_attention, trust)
    check_finite_weights(model, repr(source))  # a NaN/inf weight named now, not as NaN states later
    if eager_attention and hasattr(model, "set_attn_implementation") and model.config.model_type != "crate":
        try:
            model.set_attn_implementation("eager")
        except (ValueError, AttributeError):
            pass
    model.eval()
    if _is_vision_config(model.config):
        processor = (
            None if processor_source is None else load_image_processor(processor_source, trust_remote_code=trust)
        )
        return LoadedModel(model, processor or default_image_processor(model.config), source, "image")
    tokenizer = None if processor_source is None else load_tokenizer(processor_source, trust_remote_code=trust)
    return LoadedModel(model, tokenizer, source, "text")


# files a model needs to load without running code: configs, safetensors weights, tokenizer / processor files
HUB_MODEL_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken")


def load_hub_model(repo_id, *, eager_attention: bool = True, trust_remote_code: bool = False) -> LoadedModel:
    """:func:`load_model` of a Hub id that is never looked up on the local disk: the repo's configs, safetensors
    weights and tokenizer files are downloaded (``snapshot_download``, cached as usual), then loaded from there.

    For front ends where a typed name must not reach the server's folders. ValueError naming ``model`` for a
    malformed id, a repo the Hub does not have (or hides), or an unreachable Hub.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    if not isinstance(repo_id, str):
        raise TypeError(f"model: expected a Hub id (str), got {type(repo_id).__name__}")
    repo_id = repo_id.strip()
    if not HUB_ID.fullmatch(repo_id):
        raise ValueError(f"model: expected a Hub id such as 'google/vit-base-patch16-224', got {repo_id!r}")
    patterns = list(HUB_MODEL_FILES) + (["*.py"] if trust_remote_code else [])
    try:
        folder = snapshot_download(repo_id, allow_patterns=patterns)
    except RepositoryNotFoundError:
        raise ValueError(f"model: {repo_id!r} is not a model repository on the Hub (or it is private)") from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        raise ValueError(f"model: could not download {repo_id!r} from the Hub ({_short(err)})") from None
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ValueError(f"model: the Hub repository {repo_id!r} has no config.json; it is not a Transformers model")
    try:
        loaded = load_model(folder, eager_attention=eager_attention, trust_remote_code=trust_remote_code)
    except ValueError as err:  # name the repo, not the cache folder
        raise ValueError(str(err).replace(repr(folder), repr(repo_id)).replace(folder, repo_id)) from None
    loaded.model.config._name_or_path = repo_id  # what from_pretrained(repo_id) records, not the cache folder
    loaded.source = repo_id
    return loaded


def _convert(image, mode: str, name: str):
    if getattr(image, "mode", mode) == mode:
        return image
    try:
        return image.convert(mode)
    except ValueError:  # a mode Pillow has no conversion for (e.g. HSV to L)
        raise ValueError(
            f"{name}: Pillow cannot convert mode {image.mode} to {mode}; save it as RGB or grayscale"
        ) from None


def pixel_values_for(images: list, loaded: LoadedModel) -> torch.Tensor:
    """Processor output ``(B, C, H, W)`` for PIL images, converted to the model's channel count first."""
    if loaded.modality != "image" or loaded.processor is None:
        raise ValueError(f"model: {loaded.source!r} is not a vision model; images cannot be fed to it")
    if not images:
        raise ValueError("images: expected at least one image, got none")
    channels = int(getattr(loaded.config, "num_channels", 3))
    mode = "L" if channels == 1 else "RGB"
    from .inputs import to_pil  # one converter: EXIF orientation, 16-bit and float images scaled or refused

    images = [to_pil(im, f"images[{i}]") for i, im in enumerate(images)]
    converted = [_convert(im, mode, f"images[{i}]") for i, im in enumerate(images)]
    pixel_values = loaded.processor(images=converted, return_tensors="pt")["pixel_values"]
    if pixel_values.shape[1] != channels:
        raise ValueError(
            f"images: the processor produced {pixel_values.shape[1]} channels but the model expects {channels}"
        )
    return pixel_values


__all__ = [
    "HUB_ID",
    "LoadedModel",
    "check_source",
    "default_image_processor",
    "load_config",
    "load_hub_model",
    "load_image_processor",
    "load_model",
    "load_pretrained",
    "load_tokenizer",
    "pixel_values_for",
]
