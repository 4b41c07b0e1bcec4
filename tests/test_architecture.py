"""The architecture adapter finds the right modules in ViT, BERT-like and DistilBERT models."""

import pytest
import torch
from transformers import (
    BertConfig,
    BertModel,
    DistilBertConfig,
    DistilBertModel,
    RobertaConfig,
    RobertaForSequenceClassification,
    ViTConfig,
    ViTForImageClassification,
)

from hf_tdiag.probes.architecture import describe


def _small(cls, **kw):
    return cls(**kw)


def test_vit_is_pre_norm_and_exposes_projections():
    cfg = ViTConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, image_size=16, patch_size=8
    )
    model = ViTForImageClassification(cfg)
    arch = describe(model)
    assert arch.family == "vit" and arch.pre_norm
    assert arch.num_layers == 3 and arch.num_heads == 4 and arch.head_dim == 8
    layer = arch.encoder_layers[1]  # transformers v5 ViT: layers[i].attention.q_proj/k_proj/v_proj/o_proj, mlp.fc1/fc2
    h = arch.layers[1]
    assert h.query is layer.attention.q_proj
    assert h.key is layer.attention.k_proj
    assert h.value is layer.attention.v_proj
    assert h.attention_output is layer.attention.o_proj
    assert h.intermediate is layer.mlp.fc1
    assert h.ffn_output is layer.mlp.fc2
    assert h.attention_norm is layer.layernorm_before
    assert h.projection_weight("key").shape == (32, 32)


@pytest.mark.parametrize("cls,cfg_cls", [(BertModel, BertConfig), (RobertaForSequenceClassification, RobertaConfig)])
def test_bert_like_is_post_norm(cls, cfg_cls):
    cfg = cfg_cls(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=50)
    model = cls(cfg)
    arch = describe(model)
    assert arch.family == "bert" and not arch.pre_norm
    layer = arch.encoder_layers[0]
    h = arch.layers[0]
    assert h.attention_norm is None
    assert h.query is layer.attention.self.query
    assert h.attention_output is layer.attention.output.dense
    assert h.intermediate is layer.intermediate.dense
    assert h.ffn_output is layer.output.dense
    assert h.head_dim == 16


def test_distilbert_naming():
    cfg = DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=50)
    model = DistilBertModel(cfg)
    arch = describe(model)
    layer = arch.encoder_layers[1]
    h = arch.layers[1]
    assert arch.num_layers == 2 and h.num_heads == 4
    assert h.query is layer.attention.q_lin and h.value is layer.attention.v_lin
    assert h.attention_output is layer.attention.out_lin
    assert h.intermediate is layer.ffn.lin1 and h.ffn_output is layer.ffn.lin2


def test_unsupported_models_get_clear_errors():
    with pytest.raises(TypeError, match="model"):
        describe("bert-base-uncased")
    mlp = torch.nn.Sequential(torch.nn.Linear(3, 3))
    with pytest.raises(TypeError, match="config"):
        describe(mlp)
    mlp.config = BertConfig(hidden_size=3, num_attention_heads=1, num_hidden_layers=1)
    with pytest.raises(ValueError, match="query/key/value"):
        describe(mlp)
