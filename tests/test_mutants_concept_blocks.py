"""hf_tdiag.probes.concept_blocks, the behaviours its mutation sample found untested: the float64 readout is the
model's own readout (CLS, mean and last-token pooling), and CRATE-α's block is read as its sparse coding (D, D₁ and
the step size), each against the model's own modules."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_tdiag import CrateConfig, CrateForImageClassification
from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification
from hf_tdiag.probes.concept_blocks import block_pieces, float64_readout
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
