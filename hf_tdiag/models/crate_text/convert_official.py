"""Load the two published text-CRATE checkpoint layouts into the ``crate_text`` classes.

Transformers PR #27759 (RoBERTa-shaped CRATE encoder; ``base_model_prefix = "crate"``)::

    crate.embeddings.{word,position,token_type}_embeddings.weight, crate.embeddings.LayerNorm
    crate.encoder.layer.i.attention.self.prenorm   LayerNorm (default eps 1e-5)
    crate.encoder.layer.i.attention.self.qkv       (d, d), no bias: U for q = k = v
    crate.encoder.layer.i.attention.output.dense   (d, d), no bias; residual onto the un-normalized input
    crate.encoder.layer.i.output.prenorm           LayerNorm
    crate.encoder.layer.i.output.weight            (d, d) square ISTA dictionary, no residual
    crate.pooler.dense (multiple choice), lm_head.{dense,layer_norm,decoder,bias}, classifier.{dense,out_proj} |
    classifier (token / multiple choice), qa_outputs

Positions follow RoBERTa (row ``pad_token_id + 1`` is position 0). The PR's ``CrateForCausalLM`` calls ``exit()`` when
``is_decoder`` is set, so its weights are this same bidirectional layout and are converted as a masked LM.

CRATE-LM (Bai & Ma 2024; nanoGPT-style ``{"model": state_dict, "model_args": {...}}``, possibly ``_orig_mod.``)::

    transformer.wte.weight (V, d) tied with lm_head.weight, transformer.wpe.weight (T, d)
    transformer.h.i.prenorm_1 / prenorm_2          LayerNorm (eps 1e-5, with bias)
    transformer.h.i.attn.c_attn.weight             (d, d), no bias: U for q = k = v, causal
    transformer.h.i.attn.c_proj.{weight,bias}      (d, d) with bias
    transformer.h.i.ista.weight                    (4d, d) = D^T (crate_overcomplete.py) or (d, d) (crate.py)
    transformer.ln_f                               final LayerNorm (crate_overcomplete.py only)
    transformer.h.i.attn.bias                      causal-mask buffer of the non-flash path (ignored)

Imports only torch/transformers and the sibling modules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from .configuration_crate_text import CrateTextConfig
from .modeling_crate_text import (
    CrateTextForCausalLM,
    CrateTextForMaskedLM,
    CrateTextForMultipleChoice,
    CrateTextForQuestionAnswering,
    CrateTextForSequenceClassification,
    CrateTextForTokenClassification,
    CrateTextModel,
)

_PREFIXES = ("module.", "_orig_mod.")


def unwrap_state_dict(checkpoint: Mapping) -> tuple[dict[str, torch.Tensor], dict]:
    """``(state_dict, model_args)``: unwrap ``{"model"|"state_dict": ...}``, strip ``module.``/``_orig_mod.``."""
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(checkpoint).__name__}")
    args = checkpoint.get("model_args") if isinstance(checkpoint.get("model_args"), Mapping) else {}
    sd = checkpoint
    for key in ("model", "state_dict", "model_state_dict"):
        if isinstance(sd.get(key), Mapping):
            sd = sd[key]
            break
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        name = str(key)
        while name.startswith(_PREFIXES):
            name = name.split(".", 1)[1]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"state_dict[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
        out[name] = value
    return out, dict(args)


def _layers(sd: Mapping[str, torch.Tensor], pattern: str) -> int:
    found = {int(m.group(1)) for k in sd if (m := re.match(pattern, k))}
    if found != set(range(len(found))):
        raise ValueError(f"state_dict: layer indices {sorted(found)} are not 0..{len(found) - 1}")
    return len(found)


def _load(model, mapping: dict[str, str], sd: Mapping[str, torch.Tensor], ignored=()) -> None:
    """Copy ``sd[src]`` into ``model``'s ``dst`` for each pair; missing/unexpected/mis-shaped keys raise ValueError."""
    target = model.state_dict()
    missing = [src for src in mapping if src not in sd]
    if missing:
        raise ValueError(f"state_dict is missing {len(missing)} key(s), e.g. {missing[:5]}")
    unexpected = [k for k in sd if k not in mapping and not any(re.fullmatch(p, k) for p in ignored)]
    if unexpected:
        raise ValueError(f"state_dict has {len(unexpected)} unexpected key(s), e.g. {unexpected[:5]}")
    converted = {}
    for src, dst in mapping.items():
        tensor = sd[src]
        if tuple(tensor.shape) != tuple(target[dst].shape):
            raise ValueError(
                f"state_dict[{src!r}] has shape {tuple(tensor.shape)}, expected {tuple(target[dst].shape)} for {dst}"
            )
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"state_dict[{src!r}] must be finite floating point")
        converted[dst] = tensor.detach().to(target[dst].dtype)
    tied = {dst for src, dst in mapping.items()}
    if model.config.tie_word_embeddings and "lm_head.decoder.weight" in target:
        tied.add("lm_head.decoder.weight")
    left = [k for k in target if k not in tied and k not in converted]
    if left:
        raise ValueError(f"the converted model has parameters the checkpoint does not fill: {left[:5]}")
    model.load_state_dict(converted, strict=False)


_PR_TASKS = {
    "masked-lm": CrateTextForMaskedLM,
    "sequence-classification": CrateTextForSequenceClassification,
    "token-classification": CrateTextForTokenClassification,
    "question-answering": CrateTextForQuestionAnswering,
    "multiple-choice": CrateTextForMultipleChoice,
    "base": CrateTextModel,
}


def _pr_task(sd: Mapping[str, torch.Tensor]) -> str:
    if any(k.startswith("lm_head.") for k in sd):
        return "masked-lm"
    if "classifier.out_proj.weight" in sd:
        return "sequence-classification"
    if "qa_outputs.weight" in sd:
        return "question-answering"
    if "classifier.weight" in sd:
        return "multiple-choice" if sd["classifier.weight"].shape[0] == 1 else "token-classification"
    return "base"


def _pr_head_map(task: str) -> dict[str, str]:
    names = {
        "masked-lm": ["lm_head.dense.weight", "lm_head.dense.bias", "lm_head.layer_norm.weight"]
        + ["lm_head.layer_norm.bias", "lm_head.decoder.weight"],
        "sequence-classification": [f"classifier.{m}.{p}" for m in ("dense", "out_proj") for p in ("weight", "bias")],
        "token-classification": ["classifier.weight", "classifier.bias"],
        "multiple-choice": ["classifier.weight", "classifier.bias"],
        "question-answering": ["qa_outputs.weight", "qa_outputs.bias"],
        "base": [],
    }[task]
    return {name: name for name in names}


def pr_key_map(config: CrateTextConfig, task: str, base_prefix: str = "crate.") -> dict[str, str]:
    """PR #27759 parameter name -> ``crate_text`` parameter name for ``task``."""
    ours = "" if task == "base" else "crate."
    emb = {"word_embeddings": "word_embeddings", "position_embeddings": "position_embeddings"}
    if config.type_vocab_size:
        emb["token_type_embeddings"] = "token_type_embeddings"
    m = {f"{base_prefix}embeddings.{a}.weight": f"{ours}embeddings.{b}.weight" for a, b in emb.items()}
    if config.embedding_layernorm:
        for p in ("weight", "bias"):
            m[f"{base_prefix}embeddings.LayerNorm.{p}"] = f"{ours}embeddings.layernorm.{p}"
    for i in range(config.num_hidden_layers):
        src, dst = f"{base_prefix}encoder.layer.{i}", f"{ours}layer.{i}"
        for p in ("weight", "bias"):
            m[f"{src}.attention.self.prenorm.{p}"] = f"{dst}.layernorm_before.{p}"
            m[f"{src}.output.prenorm.{p}"] = f"{dst}.layernorm_after.{p}"
        m[f"{src}.attention.self.qkv.weight"] = f"{dst}.attention.qkv.weight"
        m[f"{src}.attention.output.dense.weight"] = f"{dst}.attention.out_proj.weight"
        m[f"{src}.output.weight"] = f"{dst}.ista.weight"
    if task in ("multiple-choice", "base"):
        for p in ("weight", "bias"):
            m[f"{base_prefix}pooler.dense.{p}"] = f"{ours}pooler.dense.{p}"
    m.update(_pr_head_map(task))
    return m


def convert_pr_crate(
    state_dict: Mapping,
    num_attention_heads: int = 12,
    task: str | None = None,
    pad_token_id: int = 1,
    head_layer_norm_eps: float = 1e-12,
    **config_overrides,
):
    """A ``crate_text`` model holding the weights of a Transformers-PR-#27759 CRATE ``state_dict``.

    Sizes are read from the tensors; the head count (not visible in the shapes) defaults to the PR's 12. ``task``
    (``masked-lm``, ``sequence-classification``, ``token-classification``, ``question-answering``,
    ``multiple-choice``, ``base``) is inferred from the head's keys when omitted.
    """
    sd, _ = unwrap_state_dict(state_dict)
    task = task or _pr_task(sd)
    if task not in _PR_TASKS:
        raise ValueError(f"task must be one of {list(_PR_TASKS)}, got {task!r}")
    prefix = "crate." if any(k.startswith("crate.") for k in sd) else ""
    words = sd.get(f"{prefix}embeddings.word_embeddings.weight")
    if words is None:
        raise ValueError(f"state_dict is missing {prefix}embeddings.word_embeddings.weight")
    types = sd.get(f"{prefix}embeddings.token_type_embeddings.weight")
    fields = dict(
        vocab_size=int(words.shape[0]),
        hidden_size=int(words.shape[1]),
        num_attention_heads=num_attention_heads,
        num_hidden_layers=_layers(sd, rf"{re.escape(prefix)}encoder\.layer\.(\d+)\."),
        max_position_embeddings=int(sd[f"{prefix}embeddings.position_embeddings.weight"].shape[0]),
        type_vocab_size=int(types.shape[0]) if types is not None else 0,
        position_offset=pad_token_id + 1,
        pad_token_id=pad_token_id,
        head_layer_norm_eps=head_layer_norm_eps,
        embedding_layernorm=f"{prefix}embeddings.LayerNorm.weight" in sd,
    )
    if task == "masked-lm":
        decoder = sd["lm_head.decoder.weight"]
        fields["tie_word_embeddings"] = bool(torch.equal(decoder, words))
    labels = {"sequence-classification": "classifier.out_proj.weight", "token-classification": "classifier.weight"}
    if task in labels:
        fields["num_labels"] = int(sd[labels[task]].shape[0])
    fields.update(config_overrides)
    config = CrateTextConfig.from_preset("crate-bert-base", **fields)
    model = _PR_TASKS[task](config)
    mapping = pr_key_map(config, task, prefix)
    if task == "masked-lm":
        bias = "lm_head.bias" if "lm_head.bias" in sd else "lm_head.decoder.bias"
        mapping[bias] = "lm_head.decoder.bias"
    ignored = (r".*position_ids", r".*token_type_ids", r"lm_head\.decoder\.bias")
    _load(model, mapping, sd, ignored)
    return model.eval()


def crate_lm_key_map(config: CrateTextConfig) -> dict[str, str]:
    """CRATE-LM (nanoGPT layout) parameter name -> ``CrateTextForCausalLM`` parameter name."""
    m = {
        "transformer.wte.weight": "crate.embeddings.word_embeddings.weight",
        "transformer.wpe.weight": "crate.embeddings.position_embeddings.weight",
    }
    for i in range(config.num_hidden_layers):
        src, dst = f"transformer.h.{i}", f"crate.layer.{i}"
        for p in ("weight", "bias"):
            m[f"{src}.prenorm_1.{p}"] = f"{dst}.layernorm_before.{p}"
            m[f"{src}.prenorm_2.{p}"] = f"{dst}.layernorm_after.{p}"
            m[f"{src}.attn.c_proj.{p}"] = f"{dst}.attention.out_proj.{p}"
        m[f"{src}.attn.c_attn.weight"] = f"{dst}.attention.qkv.weight"
        m[f"{src}.ista.weight"] = f"{dst}.ista.weight"
    if config.final_layernorm:
        for p in ("weight", "bias"):
            m[f"transformer.ln_f.{p}"] = f"crate.final_layernorm.{p}"
    if not config.tie_word_embeddings:
        m["lm_head.weight"] = "lm_head.decoder.weight"
    return m


def convert_crate_lm(state_dict: Mapping, num_attention_heads: int | None = None, **config_overrides):
    """A :class:`CrateTextForCausalLM` holding a CRATE-LM checkpoint (``crate_overcomplete.py`` or ``crate.py``).

    The head count is read from the checkpoint's ``model_args["n_head"]`` or must be passed (the shapes do not show
    it). A ``(4d, d)`` ISTA weight selects ``block="crate-lm"``, a square one ``block="crate"``; ``transformer.ln_f``
    turns on the final LayerNorm.
    """
    sd, args = unwrap_state_dict(state_dict)
    heads = num_attention_heads if num_attention_heads is not None else args.get("n_head")
    if heads is None:
        raise ValueError("convert_crate_lm: pass num_attention_heads (the checkpoint has no model_args['n_head'])")
    words = sd.get("transformer.wte.weight")
    if words is None or "transformer.h.0.ista.weight" not in sd:
        raise ValueError("state_dict is not a CRATE-LM checkpoint (no transformer.wte.weight / transformer.h.0.ista)")
    hidden = int(words.shape[1])
    atoms = int(sd["transformer.h.0.ista.weight"].shape[0])
    head = sd.get("lm_head.weight")
    fields = dict(
        vocab_size=int(words.shape[0]),
        hidden_size=hidden,
        num_attention_heads=int(heads),
        num_hidden_layers=_layers(sd, r"transformer\.h\.(\d+)\."),
        max_position_embeddings=int(sd["transformer.wpe.weight"].shape[0]),
        block="crate" if atoms == hidden else "crate-lm",
        ista_dictionary_size=atoms,
        final_layernorm="transformer.ln_f.weight" in sd,
        tie_word_embeddings=head is None or bool(torch.equal(head, words)),
    )
    fields.update(config_overrides)
    config = CrateTextConfig.from_preset("crate-lm-12l", **fields)
    model = CrateTextForCausalLM(config)
    ignored = (r"transformer\.h\.\d+\.attn\.bias", r"lm_head\.weight") if config.tie_word_embeddings else (
        r"transformer\.h\.\d+\.attn\.bias",
    )  # fmt: skip
    _load(model, crate_lm_key_map(config), sd, ignored)
    return model.eval()


__all__ = ["convert_pr_crate", "convert_crate_lm", "pr_key_map", "crate_lm_key_map", "unwrap_state_dict"]
