"""Every head class of every white-box family on a tiny config, with seeded inputs and a training forward: the cases
of tests/test_model_common.py (written for this project, after the list of checks transformers runs on its models).

A case builds its model from a config function (``**overrides`` reach the config), its inputs, the inputs of its
training forward (labels, or a masking noise), and states what its recorded outputs look like."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hf_tdiag.models.aot import (
    AotConfig,
    AotForCausalLM,
    AotForImageClassification,
    AotTextConfig,
)
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification, CrateModel
from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification, CrateAlphaModel
from hf_tdiag.models.crate_mae import (
    CrateMAEConfig,
    CrateMAEForImageClassification,
    CrateMAEForPreTraining,
    CrateMAEModel,
)
from hf_tdiag.models.crate_text import (
    CrateTextConfig,
    CrateTextForCausalLM,
    CrateTextForMaskedLM,
    CrateTextForMultipleChoice,
    CrateTextForQuestionAnswering,
    CrateTextForSequenceClassification,
    CrateTextForTokenClassification,
    CrateTextModel,
)
from hf_tdiag.models.tost import TostConfig, TostForImageClassification, TostModel

B, V, T, LAYERS, HEADS, D = 2, 29, 6, 2, 2, 16
PATCHES = {
    "aot": 4,
    "crate": 4,
    "crate-alpha": 4,
    "crate-mae": 16,
    "tost": 4,
}  # 8x8 images: patch 4 (2x2 grid) or 2 (4x4)


@dataclass
class Case:
    name: str
    family: str
    cls: type
    config: Callable[..., object]
    text: bool = False
    choices: int = 0  # multiple choice: inputs (B, C, T)
    extra: dict = field(default_factory=dict)  # inputs beyond pixel_values / input_ids

    def build(self, seed: int = 0, **overrides):
        torch.manual_seed(seed)
        return self.cls(self.config(**overrides)).eval()

    @property
    def causal(self) -> bool:
        return self.text and self.config().is_decoder

    def inputs(self, seed: int = 1) -> dict:
        g = torch.Generator().manual_seed(seed)
        if not self.text:
            out = {"pixel_values": torch.randn(B, 1, 8, 8, generator=g)}
            if "noise" in self.extra:
                out["noise"] = torch.rand(B, PATCHES[self.family], generator=g)
            return out
        shape = (B, self.choices, T) if self.choices else (B, T)
        ids = torch.randint(1, V, shape, generator=g)
        mask = torch.ones_like(ids)
        if self.causal:
            mask[1, :2] = 0  # left padding
        else:
            mask[..., 1, -2:] = 0 if not self.choices else 1  # right padding (multiple choice: none)
        ids = ids.masked_fill(mask == 0, 0)
        out = {"input_ids": ids, "attention_mask": mask}
        if self.causal:
            out["use_cache"] = False
        return out

    def training_inputs(self, seed: int = 2) -> dict:
        """Inputs of the head's training forward: its labels (the output then has a loss), or for a bare model the
        masking a pre-training forward does."""
        inputs = self.inputs(seed)
        g = torch.Generator().manual_seed(seed + 100)
        name = self.cls.__name__
        if name.endswith("ForImageClassification") or name.endswith("ForSequenceClassification"):
            inputs["labels"] = torch.randint(0, 3, (B,), generator=g)
        elif name.endswith("ForMultipleChoice"):
            inputs["labels"] = torch.randint(0, self.choices, (B,), generator=g)
        elif name.endswith("ForTokenClassification"):
            inputs["labels"] = torch.randint(0, 3, (B, T), generator=g)
        elif name.endswith("ForQuestionAnswering"):
            inputs["start_positions"] = torch.tensor([0, 1])
            inputs["end_positions"] = torch.tensor([2, 3])
        elif name.endswith("ForMaskedLM"):
            labels = inputs["input_ids"].clone()
            labels[:, ::2] = -100
            inputs["labels"] = labels
        elif name.endswith("ForCausalLM"):
            inputs["labels"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
        elif name == "CrateMAEModel":  # the encoder as pre-training runs it (masked): its mask token takes part
            inputs["noise"] = torch.rand(B, PATCHES[self.family], generator=g)
        return inputs

    def expected_states(self) -> tuple[int, tuple, int, tuple]:
        """``(count, shape)`` of ``hidden_states`` and of ``attentions`` for :meth:`inputs`."""
        if self.text:
            rows = B * (self.choices or 1)
            return LAYERS + 1, (rows, T, D), LAYERS, (rows, HEADS, T, T)
        n = PATCHES[self.family]
        if self.family == "tost":  # TSSA states have no CLS; attentions are the class attention's (one query, CLS)
            return LAYERS + 1, (B, n, D), 1, (B, HEADS, 1, n + 1)
        return LAYERS + 1, (B, n + 1, D), LAYERS, (B, HEADS, n + 1, n + 1)


def _vision(config_cls, **fixed):
    def make(**overrides):
        fields = dict(image_size=8, patch_size=4, num_channels=1, hidden_size=D, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_labels=3)  # fmt: skip
        return config_cls(**{**fields, **fixed, **overrides})

    return make


def _text(causal: bool, **fixed):
    def make(**overrides):
        preset = "crate-lm-12l" if causal else "crate-bert-base"
        fields = dict(vocab_size=V, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      max_position_embeddings=16, ista_dictionary_size=2 * D if causal else D, pad_token_id=0,
                      num_labels=3)  # fmt: skip
        return CrateTextConfig.from_preset(preset, **{**fields, **fixed, **overrides})

    return make


def _aot_text(**fixed):
    def make(**overrides):
        fields = dict(vocab_size=V, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      max_position_embeddings=16, pad_token_id=0)  # fmt: skip
        return AotTextConfig(**{**fields, **fixed, **overrides})

    return make


_MAE = _vision(CrateMAEConfig, patch_size=2, decoder_num_hidden_layers=1, decoder_num_attention_heads=HEADS)
_TOST = _vision(TostConfig, num_class_attention_layers=1)

CASES = [
    Case("crate-model", "crate", CrateModel, _vision(CrateConfig)),
    Case("crate-classification", "crate", CrateForImageClassification, _vision(CrateConfig)),
    Case("crate-alpha-model", "crate-alpha", CrateAlphaModel, _vision(CrateAlphaConfig)),
    Case("crate-alpha-classification", "crate-alpha", CrateAlphaForImageClassification, _vision(CrateAlphaConfig)),
    Case("crate-mae-model", "crate-mae", CrateMAEModel, _MAE),
    Case("crate-mae-pretraining", "crate-mae", CrateMAEForPreTraining, _MAE, extra={"noise": True}),
    Case("crate-mae-classification", "crate-mae", CrateMAEForImageClassification, _MAE),
    Case("tost-model", "tost", TostModel, _TOST),
    Case("tost-classification", "tost", TostForImageClassification, _TOST),
    Case("text-encoder-model", "crate_text", CrateTextModel, _text(False), text=True),
    Case("text-decoder-model", "crate_text", CrateTextModel, _text(True), text=True),
    Case("text-masked-lm", "crate_text", CrateTextForMaskedLM, _text(False), text=True),
    Case("text-causal-lm", "crate_text", CrateTextForCausalLM, _text(True), text=True),
    Case("text-sequence-classification", "crate_text", CrateTextForSequenceClassification, _text(False), text=True),
    Case(
        "text-decoder-sequence-classification", "crate_text", CrateTextForSequenceClassification, _text(True), text=True
    ),  # fmt: skip
    Case("text-token-classification", "crate_text", CrateTextForTokenClassification, _text(False), text=True),
    Case(
        "text-question-answering", "crate_text", CrateTextForQuestionAnswering, _text(False, num_labels=2), text=True
    ),  # fmt: skip
    Case("text-multiple-choice", "crate_text", CrateTextForMultipleChoice, _text(False), text=True, choices=3),
    Case("aot-classification", "aot", AotForImageClassification, _vision(AotConfig)),
    Case(
        "aot-mhsa-classification",
        "aot",
        AotForImageClassification,
        _vision(AotConfig, attention="mhsa", attention_bias=True),
    ),  # fmt: skip
    Case(
        "aot-subspace-output-classification",
        "aot",
        AotForImageClassification,
        _vision(AotConfig, mssa_output="subspace"),
    ),  # fmt: skip
    Case("aot-causal-lm", "aot_text", AotForCausalLM, _aot_text(), text=True),
    Case("aot-mssa-causal-lm", "aot_text", AotForCausalLM, _aot_text(attention="mssa"), text=True),
]
BY_NAME = {case.name: case for case in CASES}
# one head class per family (the checks that cost more than a forward)
FAMILY_HEADS = ["crate-classification", "crate-alpha-classification", "crate-mae-classification",
                "tost-classification", "text-causal-lm", "aot-classification", "aot-causal-lm"]  # fmt: skip


def compared(case: Case, output, inputs: dict) -> dict[str, torch.Tensor]:
    """The output's tensors that two equal models must agree on: every tensor field (and tuple of tensors), with the
    rows of padded text tokens zeroed (a padded query's row has nothing to attend to: its value is not defined)."""
    out = {}
    mask = inputs.get("attention_mask")
    if mask is not None:
        mask = mask.reshape(-1, mask.shape[-1])
    for name, value in output.items():
        if name in ("cache", "mask"):
            continue
        values = value if isinstance(value, tuple) else (value,)
        for i, tensor in enumerate(values):
            if not isinstance(tensor, torch.Tensor):
                continue
            if mask is not None and tensor.ndim >= 2 and tensor.shape[:2] == mask.shape:
                tensor = tensor * mask.reshape(*mask.shape, *[1] * (tensor.ndim - 2)).to(tensor.dtype)
            elif mask is not None and tensor.ndim == 4 and tensor.shape[0] == mask.shape[0]:  # attention maps
                tensor = tensor * mask[:, None, -tensor.shape[2] :, None].to(tensor.dtype)
            out[f"{name}.{i}"] = tensor
    return out


def _run(model, inputs):
    with torch.no_grad():
        return model(**inputs)


def _assert_same(case, a, b, inputs, atol=1e-5):
    ta, tb = compared(case, a, inputs), compared(case, b, inputs)
    assert ta.keys() == tb.keys()
    for key in ta:
        torch.testing.assert_close(ta[key], tb[key], rtol=atol, atol=atol, msg=key)
