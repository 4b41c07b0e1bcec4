"""hf_tdiag.probes.concept_blocks, the behaviours its mutation sample found untested: the float64 readout is the
model's own readout (CLS, mean and last-token pooling), and CRATE-α's block is read as its sparse coding (D, D₁ and
the step size), each against the model's own modules."""

import copy

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    ViTConfig,
    ViTForImageClassification,
)

from hf_tdiag import CrateConfig, CrateForImageClassification
from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification
from hf_tdiag.probes.concept_blocks import block_pieces, float64_readout, head_weight, readout_pieces
from hf_tdiag.probes.concept_model import concept_model_parts

SMALL = dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, image_size=8, patch_size=4, num_channels=1,
             num_labels=3)  # fmt: skip


def _same_readout(model, pooled):
    """float64_readout(cm) on states Z equals the model's float32 readout of Z, and reads the pooled token(s)."""
    cm = concept_model_parts(model.eval())
    assert cm.pooling == pooled
    Z = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = cm.readout(Z)
    got = float64_readout(cm)(Z.double())
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want.double(), rtol=1e-5, atol=1e-5)


def test_the_float64_readout_pools_the_cls_token_or_the_mean_as_the_model_does():
    torch.manual_seed(0)
    for pooling in ("cls", "mean"):
        _same_readout(CrateForImageClassification(CrateConfig(**SMALL, pooling=pooling)), pooling)


def test_the_float64_readout_of_a_decoder_reads_the_last_token():
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=11, n_positions=8)
    _same_readout(GPT2LMHeadModel(cfg), "last")


def test_a_crate_alpha_block_is_read_as_its_sparse_coding_in_float64():
    torch.manual_seed(0)
    model = CrateAlphaForImageClassification(CrateAlphaConfig(**SMALL)).eval()
    cm = concept_model_parts(model)
    Z = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    pieces = block_pieces(cm, 0, Z)
    coder = model.get_submodule("crate_alpha.encoder.layer.0.sparse_coding")
    assert pieces.branch == "sparse" and pieces.step_size == coder.step_size and pieces.activation is None
    D, D1 = pieces.branch_weights
    assert D.dtype == D1.dtype == torch.float64
    assert torch.equal(D, coder.D.double()) and torch.equal(D1, coder.D1.double())


def _vit(dtype=torch.float32):
    torch.manual_seed(0)
    cfg = ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, image_size=8,
                    patch_size=4, num_channels=1, num_labels=3)  # fmt: skip
    model = ViTForImageClassification(cfg).to(dtype).eval()
    with torch.no_grad():  # LayerNorms away from their (1, 0) initialisation
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.rand(p.shape, dtype=dtype))
    return model


def test_a_vit_block_is_read_as_pre_norm_with_its_norms_and_mlp():
    model = _vit()
    block = model.get_submodule("vit.layers.0")
    pieces = block_pieces(concept_model_parts(model), 0, torch.randn(2, 5, 8))
    assert pieces.post_norm is False and pieces.branch == "mlp" and pieces.activation == "gelu"
    for norm, module in ((pieces.ln1, block.layernorm_before), (pieces.ln2, block.layernorm_after)):
        assert torch.equal(norm.weight, module.weight.double()) and torch.equal(norm.bias, module.bias.double())
    W_in, W_out = pieces.branch_weights
    assert torch.equal(W_in, block.mlp.fc1.weight.double())
    assert torch.equal(W_out, block.mlp.fc2.weight.double())
    assert torch.equal(pieces.attention["W_q"], block.attention.q_proj.weight.double())


def _bert():
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, vocab_size=11,
                     num_labels=3)  # fmt: skip
    return BertForSequenceClassification(cfg).eval()


def test_a_bert_block_is_read_as_post_norm():
    pieces = block_pieces(concept_model_parts(_bert()), 0, torch.randn(2, 5, 8))
    assert pieces.post_norm is True and pieces.branch == "mlp"


def test_berts_readout_is_its_pooler_weight_on_the_cls_token():
    model = _bert()
    readout = readout_pieces(concept_model_parts(model))
    assert readout.pooling == "cls" and readout.norm is None
    assert torch.equal(readout.pooler_weight, model.get_submodule("bert.pooler.dense").weight.double())


def test_an_offloaded_block_is_read_as_the_block_in_memory():
    from accelerate import cpu_offload

    model = _vit()
    Z = torch.randn(2, 5, 8)
    want = block_pieces(concept_model_parts(model), 0, Z)
    got = block_pieces(concept_model_parts(cpu_offload(copy.deepcopy(model), torch.device("cpu"))), 0, Z)
    for key in ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k"):
        assert torch.equal(got.attention[key], want.attention[key]), key
    for a, b in zip(
        got.branch_weights + (got.ln1.weight, got.ln2.bias), want.branch_weights + (want.ln1.weight, want.ln2.bias)
    ):
        assert a.device.type == "cpu" and torch.equal(a, b)  # fmt: skip


def test_an_offloaded_models_head_and_final_norm_are_read_from_the_offload_store():
    from accelerate import cpu_offload

    model = _vit()
    offloaded = concept_model_parts(cpu_offload(copy.deepcopy(model), torch.device("cpu")))
    assert torch.equal(head_weight(offloaded), model.classifier.weight.double())
    norm = readout_pieces(offloaded).norm  # the final LayerNorm, read from the offload store
    final = model.get_submodule("vit.layernorm")
    assert torch.equal(norm.weight, final.weight.double()) and torch.equal(norm.bias, final.bias.double())


def test_the_float64_weights_of_a_float64_model_are_copies():
    model = _vit(torch.float64)
    pieces = block_pieces(concept_model_parts(model), 0, torch.randn(2, 5, 8, dtype=torch.float64))
    before = pieces.attention["W_q"].clone(), pieces.ln1.weight.clone(), pieces.branch_weights[0].clone()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)  # the model changes afterwards; what was read does not
    after = pieces.attention["W_q"], pieces.ln1.weight, pieces.branch_weights[0]
    assert all(torch.equal(a, b) for a, b in zip(after, before))
