"""Basic CRATE model behaviour: Auto registration, forward, output fields."""

import torch
from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

import hf_tdiag  # noqa: F401  (registers crate)
from hf_tdiag import CrateConfig, CrateForImageClassification, CrateModel


def test_auto_classes_build_crate():
    config = CrateConfig.from_preset("crate-digits", num_labels=10)
    assert isinstance(AutoConfig.for_model("crate"), CrateConfig)
    assert isinstance(AutoModel.from_config(config), CrateModel)
    assert isinstance(AutoModelForImageClassification.from_config(config), CrateForImageClassification)


def test_forward_shapes_and_output_fields():
    config = CrateConfig.from_preset("crate-digits", num_labels=10)
    model = CrateForImageClassification(config).eval()
    x = torch.randn(3, 1, 8, 8)
    out = model(
        x,
        labels=torch.tensor([0, 1, 2]),
        output_hidden_states=True,
        output_mid_hidden_states=True,
        output_attentions=True,
    )
    n_tokens = 16 + 1
    assert out.logits.shape == (3, 10)
    assert len(out.hidden_states) == config.num_hidden_layers + 1
    assert len(out.mid_hidden_states) == config.num_hidden_layers
    assert len(out.attentions) == config.num_hidden_layers
    assert out.hidden_states[0].shape == (3, n_tokens, config.hidden_size)
    assert out.attentions[0].shape == (3, config.num_attention_heads, n_tokens, n_tokens)
    # attention rows are probability vectors
    torch.testing.assert_close(out.attentions[0].sum(-1), torch.ones(3, config.num_attention_heads, n_tokens))
    # loss is the cross-entropy of the returned logits
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, torch.tensor([0, 1, 2])))
    # the last hidden state feeds the head through LN + Linear on the CLS token
    cls = out.hidden_states[-1][:, 0]
    torch.testing.assert_close(model.classifier(model.classifier_norm(cls)), out.logits)
    # block l output is ISTA(LN2(mid_l)), no residual
    layer = model.crate.encoder.layer[0]
    torch.testing.assert_close(layer.ista(layer.layernorm_after(out.mid_hidden_states[0])), out.hidden_states[1])
