"""describe() on the text CRATE (probes/families/crate_text.py) and the per-layer SRR it enables, checked against
coding rates computed here from the model's own hidden states with torch.logdet (real tokens only, so padding and
the causal mask are respected)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForMultipleChoice

import hf_tdiag
from hf_tdiag.diagnostics.settings import SRRSettings
from hf_tdiag.models.crate_text import CrateTextConfig
from hf_tdiag.probes.describe import describe

pytestmark = pytest.mark.slow


def _config(causal):
    preset = "crate-lm-12l" if causal else "crate-bert-base"
    extra = {} if causal else {"ista_dictionary_size": 32}
    return CrateTextConfig.from_preset(
        preset, vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=32, pad_token_id=0, **extra,
    )  # fmt: skip


@pytest.mark.parametrize("auto,causal", [(AutoModelForCausalLM, True), (AutoModelForMaskedLM, False),
                                         (AutoModelForMultipleChoice, False)])  # fmt: skip
def test_describe_hands_back_the_models_own_modules(auto, causal):
    model = auto.from_config(_config(causal))
    desc = describe(model)
    assert desc.family == "crate_text" and desc.causal is causal and desc.projection_layout == "shared"
    assert desc.base_model is model.crate and desc.num_layers == 2 and (desc.num_heads, desc.head_dim) == (4, 8)
    for i, h in enumerate(desc.layers):
        block = model.crate.layer[i]
        assert h.block is block and h.query is h.key is h.value is block.attention.qkv
        assert h.attn_output is block.attention.out_proj
        if causal:  # crate-lm-12l: CRATE-LM's overcomplete block, read as x ↦ D z(Dᵀx) with the one parameter
            assert h.ista is None and h.ffn_in is block.ista
            assert torch.equal(h.ffn_out.weight, block.ista.weight.T)
        else:  # the square one-step block
            assert h.ista is block.ista and h.ffn_in is None and h.ffn_out is None
        assert h.attention_norm is block.layernorm_before and h.ffn_norm is block.layernorm_after
        assert torch.equal(h.output_weight(), block.attention.out_proj.weight)


def _rates(Z, U, eps):
    """(R, Rc) of one sample's real tokens Z (N, d): R = 1/2 logdet(I + d/(N eps^2) Z^T Z),
    Rc = sum_k 1/2 logdet(I + p/(N eps^2) (Z U_k)^T (Z U_k)) with U_k the rows k*p:(k+1)*p of the qkv weight."""
    Z = Z.double()
    n, d = Z.shape
    R = 0.5 * torch.logdet(torch.eye(d, dtype=torch.float64) + d / (n * eps**2) * Z.T @ Z)
    heads, p = 4, d // 4
    Rc = 0.0
    for k in range(heads):
        A = Z @ U[k * p : (k + 1) * p].double().T
        Rc = Rc + 0.5 * torch.logdet(torch.eye(p, dtype=torch.float64) + p / (n * eps**2) * A.T @ A)
    return float(R), float(Rc)


@pytest.mark.parametrize("causal", [True, False])
def test_layer_srr_on_text_crate_matches_rates_of_its_hidden_states(causal):
    model = (AutoModelForCausalLM if causal else AutoModelForMaskedLM).from_config(_config(causal)).eval()
    ids = torch.randint(1, 50, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, -5:] = 0
    report = hf_tdiag.layer_srr(model, {"input_ids": ids, "attention_mask": mask}, progress=False)
    table = report.to_pandas()
    eps = SRRSettings().eps
    with torch.no_grad():
        states = model.crate(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for layer in (1, 2):
        U = model.crate.layer[layer - 1].attention.qkv.weight.detach()
        rates = [_rates(states[layer][b][mask[b].bool()], U, eps) for b in range(3)]
        row = table[(table.layer == layer) & (table.state == "output")].iloc[0]
        assert row["R"] == pytest.approx(sum(r for r, _ in rates) / 3, rel=1e-6)
        assert row["Rc"] == pytest.approx(sum(c for _, c in rates) / 3, rel=1e-6)
