"""Splitting a classifier at layer ℓ for concept fidelity: its blocks, readout and head, its concept tokens.

Supported: CRATE and ViT-like image classifiers (concept tokens = patch tokens; CLS, and DeiT's distillation
token, untouched), and BERT-like encoders on texts (concept tokens = the non-special tokens; ``[CLS]`` and
``[SEP]`` untouched; readout = the model's own pooled output ``tanh(W_p z_CLS + b_p)``; head = the model's
``classifier`` when it is a sequence classifier, else a linear head fitted by
:func:`hf_tdiag.probes.concept_text.fit_linear_head`), and decoder LLMs on texts (GPT-2, Llama family; readout =
the final norm of the last token, head = the LM head; :mod:`hf_tdiag.probes.concept_decoder`).

``hidden_states[ℓ]`` is the output of block ℓ (0 = the embedding output); the suffix ``g_{>ℓ}`` is blocks ℓ+1..L,
the readout, then the linear head ``h(z) = W_c z + b``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from .._caller_state import module_modes, restore_modes
from .._validation import block_number, check_block_outputs, check_model_inputs
from ..batching import concat, split
from ..models.crate.configuration_crate import size_pair
from .concept_decoder import DecoderConceptModel, decoder_block_forward, final_norm
from .describe import describe
from .offload import runnable
from .token_states import model_device, model_dtype

_SUPPORTED = (
    "CRATE (model_type 'crate'), CRATE-α or CRATE-MAE (their image classifiers), a ViT-like image classifier "
    "(ViTForImageClassification, DeiT, ...), a "
    "BERT-like encoder with a pooler (BertModel, BertForSequenceClassification, ...) or a GPT-2 / "
    "Llama-family decoder (GPT2LMHeadModel, LlamaForCausalLM, ...)"
)
_TEXT_FAMILIES = ("bert", "gpt2", "llama")
TSSA_REFUSAL = (
    "model: concept fidelity does not apply to ToST: its bound's α constant bounds how a Gram error moves the next "
    "block's softmax attention and its certified constants are those of softmax-attention blocks, but ToST's TSSA "
    "has no softmax attention (it reads per-coordinate token statistics)"
)


@dataclass
class ConceptModel:
    """Handles of a classifier needed to split it at layer ℓ."""

    model: nn.Module
    family: str  # "crate" | "crate-alpha" | "crate-mae" | "vit" | "bert" | "gpt2" | "llama"
    blocks: nn.ModuleList
    readout: Callable[[torch.Tensor], torch.Tensor]  # Z^L (B, T, d) -> head features (B, d)
    readout_modules: tuple  # modules the readout uses
    pooling: str  # "cls" | "mean"
    head: nn.Linear | None  # None: a BERT-like encoder without classifier (a head is fitted)
    num_layers: int
    num_prefix: int  # image models: leading untouched tokens; texts: 0 (see concept_positions)
    num_patches: int  # image models: patch tokens; texts: 0 until the inputs fix it
    grid: tuple[int, int] | None
    arch: object

    @property
    def modality(self) -> str:
        return "text" if self.family in _TEXT_FAMILIES else "image"

    @property
    def certified(self) -> bool:
        """Whether the certified constants of :mod:`hf_tdiag.diagnostics.concept_fidelity.constants` cover this family."""
        return True

    def block_forward(self, block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        out = block(hidden)
        return out[0] if isinstance(out, tuple) else out

    def run(self, kwargs: dict) -> tuple:
        """``(hidden_states[0..L], logits or None)`` of one forward pass on ``kwargs``."""
        out = self.model(**kwargs, output_hidden_states=True)
        return out.hidden_states, getattr(out, "logits", None)


@dataclass
class DecoderModel(DecoderConceptModel, ConceptModel):
    """A decoder LLM split for concept fidelity (:mod:`hf_tdiag.probes.concept_decoder`)."""

    @property
    def certified(self) -> bool:
        return False

    def block_forward(self, block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return decoder_block_forward(self, block, hidden)

    def run(self, kwargs: dict) -> tuple:
        """Block outputs ``Z^0..Z^L`` before the final norm (its input is read with a hook), last-token logits."""
        seen = {}
        hook = self.final_norm.register_forward_pre_hook(lambda m, a: seen.__setitem__("z", a[0]))
        try:
            out = self.model(**kwargs, output_hidden_states=True, use_cache=False)
        finally:
            hook.remove()
        logits = getattr(out, "logits", None)
        return (*out.hidden_states[:-1], seen["z"]), (logits[:, -1] if logits is not None else None)


def _image_model(model, arch, head) -> ConceptModel:
    config = model.config
    image_size, patch_size = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    if image_size is None or patch_size is None:
        raise ValueError(
            f"model: expected {_SUPPORTED} (a config with image_size and patch_size); got {type(model).__name__}"
        )
    (ih, iw), (ph, pw) = size_pair(image_size, "image_size"), size_pair(patch_size, "patch_size")
    grid = (ih // ph, iw // pw)
    if arch.family in ("crate", "crate-alpha"):  # pooling, then the classifier's own LayerNorm
        pooling = getattr(config, "pooling", "cls")
        norm = model.classifier_norm

        def readout(z, norm=norm, pooling=pooling):
            return norm(z[:, 0] if pooling == "cls" else z.mean(dim=1))

        return ConceptModel(
            model,
            arch.family,
            arch.encoder_layers,
            readout,
            (norm,),
            pooling,
            head,
            arch.num_layers,
            1,
            grid[0] * grid[1],
            grid,
            arch,
        )
    base = arch.base_model
    norm = getattr(base, "layernorm", None)
    if not isinstance(norm, nn.LayerNorm):
        raise ValueError(f"model: expected {_SUPPORTED} with a final 'layernorm'; {type(model).__name__} has none")
    num_prefix = 2 if getattr(getattr(base, "embeddings", None), "distillation_token", None) is not None else 1
    if head.in_features != arch.hidden_size:
        raise ValueError(
            f"model: {type(model).__name__}'s classifier reads {head.in_features} features, not the CLS token's "
            f"{arch.hidden_size} (a head on more than the CLS token is not supported); pass its encoder "
            f"(model.{getattr(model, 'base_model_prefix', '') or 'base_model'}) with head=, a Linear on the CLS token"
        )

    def readout(z, norm=norm):
        return norm(z[:, 0])

    return ConceptModel(
        model,
        "crate-mae" if arch.family == "crate-mae" else "vit",  # CRATE-MAE: its encoder's final LayerNorm, CLS token
        arch.encoder_layers,
        readout,
        (norm,),
        "cls",
        head,
        arch.num_layers,
        num_prefix,
        grid[0] * grid[1],
        grid,
        arch,
    )


def _text_model(model, arch, head) -> ConceptModel:
    pooler = getattr(arch.base_model, "pooler", None)
    dense = getattr(pooler, "dense", None)
    if not isinstance(dense, nn.Linear):
        raise ValueError(
            f"model: a BERT-like encoder needs its pooler (dense + tanh on [CLS]) as the readout; "
            f"{type(model).__name__} has none (load it with add_pooling_layer=True)"
        )

    def readout(z, pooler=pooler):
        return pooler(z)

    return ConceptModel(
        model, "bert", arch.encoder_layers, readout, (pooler,), "cls", head, arch.num_layers, 0, 0, None, arch
    )


def _decoder_model(model, arch, head) -> ConceptModel:
    norm = final_norm(model, arch)
    if head is None:
        lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        head = lm_head if isinstance(lm_head, nn.Linear) and lm_head.weight.shape[1] == arch.hidden_size else None

    def readout(z, norm=norm):
        return norm(z[:, -1])

    return DecoderModel(
        model,
        arch.family,
        arch.encoder_layers,
        readout,
        (norm,),
        "last",
        head,
        arch.num_layers,
        0,
        0,
        None,
        arch,
        final_norm=norm,
    )


def concept_model_parts(model: nn.Module, head: nn.Linear | None = None) -> ConceptModel:
    """Find blocks, readout and head of a supported classifier (``head`` overrides/supplies the linear head)."""
    if not isinstance(model, nn.Module) or getattr(model, "config", None) is None:
        raise TypeError(f"model: expected a Transformers model ({_SUPPORTED}), got {type(model).__name__}")
    if head is not None and not isinstance(head, nn.Linear):
        raise TypeError(f"head: expected a torch.nn.Linear, got {type(head).__name__}")
    try:
        arch = describe(model)
    except (ValueError, TypeError) as err:
        raise ValueError(f"model: expected {_SUPPORTED}; {err}") from None
    if arch.attention == "tssa":
        raise ValueError(TSSA_REFUSAL)
    if arch.family == "crate_text":
        from .families.crate_text import CONCEPTS_REFUSAL

        raise ValueError(CONCEPTS_REFUSAL)
    if arch.causal:
        return _decoder_model(model, arch, head)
    own = getattr(model, "classifier", None)
    head = head if head is not None else (own if isinstance(own, nn.Linear) else None)
    if arch.family == "bert":
        return _text_model(model, arch, head)
    if head is None:
        raise ValueError(
            f"model: expected {_SUPPORTED} with a linear 'classifier' head; {type(model).__name__} "
            f"(model_type {getattr(model.config, 'model_type', None)!r}) has none"
        )
    return _image_model(model, arch, head)


def check_layer(cm: ConceptModel, layer) -> int:
    """``layer`` as a block number in ``0..L`` (0 = the embeddings; = the ``hidden_states`` index), or a clear error."""
    return block_number(layer, cm.num_layers, embeddings=True)


def pixel_values(inputs) -> torch.Tensor:
    """``(images, C, H, W)`` pixel values from a tensor, a dict/BatchFeature or an iterable of batches."""
    if (
        not isinstance(inputs, (torch.Tensor, Mapping, str, bytes))
        and hasattr(inputs, "__iter__")
        and not hasattr(inputs, "keys")
    ):
        parts = list(inputs)  # an iterable of batches (e.g. hf_tdiag.inputs.LazyBatches)
        if parts and all(isinstance(p, (torch.Tensor, Mapping)) or hasattr(p, "keys") for p in parts):
            return concat([pixel_values(p) for p in parts])
        raise TypeError(
            "inputs: expected pixel_values as a tensor (images, channels, height, width), a dict/BatchFeature with "
            "'pixel_values' or an iterable of such batches (run the image processor first)"
        )
    if isinstance(inputs, Mapping) or hasattr(inputs, "keys"):
        if "pixel_values" not in inputs:
            raise ValueError(f"inputs: expected a 'pixel_values' entry, got keys {list(inputs.keys())}")
        inputs = inputs["pixel_values"]
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(
            "inputs: expected pixel_values as a tensor (images, channels, height, width) or a dict/BatchFeature "
            f"with 'pixel_values' (run the image processor first), got {type(inputs).__name__}"
        )
    if inputs.ndim != 4:
        raise ValueError(
            f"inputs: expected pixel_values of shape (images, channels, height, width), got {tuple(inputs.shape)}"
        )
    if inputs.shape[0] == 0:
        raise ValueError(f"inputs: expected at least one image, got an empty batch of shape {tuple(inputs.shape)}")
    if not inputs.is_floating_point():
        raise ValueError(f"inputs: pixel_values must be floating point (run the image processor), got {inputs.dtype}")
    check_model_inputs(inputs)  # NaN/inf or float32-overflowing values, named with their position
    return inputs


def text_encoding(inputs) -> dict:
    """``input_ids`` (texts, T) of equal length, no padding, plus ``concept_mask`` (T,) from
    :func:`hf_tdiag.probes.concept_text.encode_texts`; other entries (token_type_ids, attention_mask) kept."""
    if not (isinstance(inputs, Mapping) or hasattr(inputs, "keys")) or "input_ids" not in inputs:
        raise TypeError(
            "inputs: a BERT-like encoder takes texts encoded by hf_tdiag.probes.concept_text.encode_texts (a dict with "
            f"input_ids and concept_mask), or strings with tokenizer=; got {type(inputs).__name__}"
        )
    enc = dict(inputs)
    ids = enc["input_ids"]
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2:
        raise ValueError(f"inputs: expected input_ids of shape (texts, tokens), got {getattr(ids, 'shape', type(ids))}")
    mask = enc.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError("inputs: padded texts are not supported; encode them with concept_text.encode_texts")
    if "concept_mask" not in enc:
        raise ValueError(
            "inputs: expected a 'concept_mask' (which tokens are concept tokens); use concept_text.encode_texts"
        )
    return enc


def concept_positions(cm: ConceptModel, n_tokens: int, encoding: dict | None = None) -> torch.Tensor:
    """Positions (LongTensor) of the concept tokens among the ``n_tokens`` of each input."""
    if cm.modality == "text":
        mask = encoding["concept_mask"].bool()
        if mask.shape != (n_tokens,) or not bool(mask.any()):
            raise ValueError(f"inputs: concept_mask must have shape ({n_tokens},) with at least one concept token")
        return torch.nonzero(mask).flatten()
    if n_tokens != cm.num_prefix + cm.num_patches:
        raise ValueError(
            f"inputs: expected {cm.num_prefix + cm.num_patches} tokens ({cm.num_prefix} prefix + {cm.num_patches} patches "
            f"for image size {cm.model.config.image_size}), the model produced {n_tokens}"
        )
    return torch.arange(cm.num_prefix, n_tokens)


@dataclass
class LayerActivations:
    """Layer-ℓ concept tokens ``A`` (inputs, N, d), the full layer-ℓ states, the head's features and logits."""

    patches: torch.Tensor
    frame: torch.Tensor  # hidden_states[ℓ] (inputs, T, d): the untouched tokens are read from here
    positions: torch.Tensor  # positions of the concept tokens in T
    features: torch.Tensor  # readout(Z^L) (inputs, d): what the head sees
    logits: torch.Tensor | None  # the model's own logits (None for an encoder without classifier)
    block_inputs: list  # hidden_states[ℓ..L] (inputs, T, d): inputs of the suffix blocks, then Z^L

    @property
    def prefix(self) -> torch.Tensor:
        """The untouched tokens before the first concept token (image models: CLS [+ distillation])."""
        return self.frame[:, : int(self.positions[0])]


def _model_batches(cm: ConceptModel, inputs, batch_size: int):
    """(batches of forward kwargs, encoding or None)."""
    if cm.modality == "text":
        enc = text_encoding(inputs)
        keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc]
        return split({k: enc[k] for k in keys}, batch_size), enc
    return split({"pixel_values": pixel_values(inputs)}, batch_size), None


def layer_activations(
    model, inputs, layer: int, batch_size: int = 64, cm: ConceptModel | None = None
) -> LayerActivations:
    """Run the model once and return the layer-ℓ concept tokens (``hidden_states[ℓ]`` at the concept positions)."""
    cm = cm or concept_model_parts(model)
    layer = check_layer(cm, layer)
    batches, encoding = _model_batches(cm, inputs, batch_size)
    device, dtype = model_device(model), model_dtype(model)
    outs, logits, pooled = [], [], []
    saved = module_modes(model)  # every submodule's flag, not only the top one's (hf_tdiag._caller_state)
    model.eval()
    try:
        with torch.no_grad():
            for kw in batches:
                kw = {
                    k: v.to(device=device, dtype=dtype) if v.is_floating_point() else v.to(device)
                    for k, v in kw.items()
                }
                hidden_states, out_logits = cm.run(kw)
                check_block_outputs(hidden_states, kw, start=0)  # NaN from finite inputs: the block, named
                outs.append(hidden_states[layer:])
                logits.append(out_logits)
                with runnable(model, *cm.readout_modules):  # readout modules inside an offloaded block
                    pooled.append(cm.readout(hidden_states[-1]))
    finally:
        restore_modes(saved)
    states = [torch.cat([o[j] for o in outs]) for j in range(len(outs[0]))]
    h = states[0]
    positions = concept_positions(cm, h.shape[1], encoding).to(h.device)
    model_logits = torch.cat(logits) if logits[0] is not None else None
    return LayerActivations(h[:, positions], h, positions, torch.cat(pooled), model_logits, states)


def suffix_runner(
    model, layer: int, prefix: torch.Tensor, cm: ConceptModel | None = None, positions: torch.Tensor | None = None
) -> Callable:
    """``g(patches, index=None) = h(readout(blocks_{ℓ+1..L}(Z with its concept tokens replaced)))``: logits.

    ``prefix`` holds the untouched tokens of all inputs at layer ℓ: the leading prefix (CLS) tokens, or the full
    layer-ℓ states (``LayerActivations.frame``) together with the concept ``positions``. ``index`` (a slice or
    index tensor) selects the inputs of a chunk, ``None`` means all of them.
    """
    cm = cm or concept_model_parts(model)
    layer = check_layer(cm, layer)
    if cm.head is None:
        raise ValueError("model: has no linear head; fit one (concept_text.fit_linear_head) and pass head=")
    blocks = list(cm.blocks)[layer:]
    n_concepts = cm.num_patches if positions is None else positions.numel()

    def run(patches: torch.Tensor, index=None) -> torch.Tensor:
        if patches.ndim != 3 or patches.shape[1] != n_concepts:
            raise ValueError(f"patches: expected (inputs, {n_concepts}, d), got {tuple(patches.shape)}")
        pre = prefix if index is None else prefix[index]
        if pre.shape[0] != patches.shape[0]:
            raise ValueError(f"patches: {patches.shape[0]} inputs but the prefix selection has {pre.shape[0]}")
        if positions is None:  # leading prefix tokens, then the concept tokens
            z = torch.cat([pre.to(patches), patches], dim=1)
        else:  # the full layer-ℓ states with the concept positions overwritten
            z = pre.to(patches).index_copy(1, positions.to(patches.device), patches)
        # blocks or readout modules whose weights an Accelerate hook above them offloads rest on the CPU meanwhile
        with runnable(model, *blocks, *cm.readout_modules, cm.head):
            for block in blocks:
                z = cm.block_forward(block, z)
            return cm.head(cm.readout(z))

    return run
