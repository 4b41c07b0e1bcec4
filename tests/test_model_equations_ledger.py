"""The objective ledger's objectives on tiny models of every family, in the default run, against the objectives
written out here token by token (float64): ``Rᶜ(Z; U) = Σ_k ½ logdet(I + p/(Nε²) (ZU_k)ᵀ(ZU_k))``, the LASSO
``mean_n ½‖x_n − D a_n‖² + λ‖a_n‖₁`` with the codes of the ISTA steps recomputed here, and ToST's
``Rᶜ_var = Σ_k ½ (n_k/N) Σ_i log(1 + Σ_n Π_k(n) w_ki(n)² / n_k)``. λ (0.3) and ε (0.5) are not the defaults, so a
ledger that ignored either would differ. The block states come from the models' recorded outputs."""

from __future__ import annotations

import math

import pytest
import torch

from hf_tdiag.diagnostics.objective_ledger import objective_ledger
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification
from hf_tdiag.models.crate_mae import CrateMAEConfig, CrateMAEForImageClassification
from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM, CrateTextForMaskedLM
from hf_tdiag.models.tost import TostConfig, TostForImageClassification

EPS, LAM, ETA = 0.5, 0.3, 0.1
VISION = dict(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
              num_labels=3)  # fmt: skip


def _rc(Z: torch.Tensor, U: torch.Tensor) -> float:
    N = Z.shape[0]
    total = 0.0
    for k in range(U.shape[0]):
        A = Z.double() @ U[k].double()  # (N, p): token n's projection U_kᵀ z_n as row n
        p = A.shape[1]
        total += 0.5 * float(torch.logdet(torch.eye(p, dtype=torch.float64) + p / (N * EPS**2) * A.T @ A))
    return total


def _lasso(x: torch.Tensor, D: torch.Tensor, a: torch.Tensor) -> float:
    x, D, a = x.double(), D.double(), a.double()
    terms = [0.5 * float(((x[n] - D @ a[n]) ** 2).sum()) + LAM * float(a[n].abs().sum()) for n in range(x.shape[0])]
    return sum(terms) / len(terms)


def _relu(v):
    return torch.clamp(v, min=0)


def _U(attention) -> torch.Tensor:
    K, p = attention.num_heads, attention.head_dim
    return torch.stack([attention.qkv.weight[k * p : (k + 1) * p].T for k in range(K)])  # (K, d, p)


def _table(report) -> dict:
    return {(s.layer, s.step): (s.before, s.after) for s in report.steps}


def _check(report, expected: dict):
    table = _table(report)
    assert set(table) == set(expected)
    for key, (before, after) in expected.items():
        assert table[key][0] == pytest.approx(before, rel=1e-5, abs=1e-7), key
        assert table[key][1] == pytest.approx(after, rel=1e-5, abs=1e-7), key


def _vision_expected(blocks, states, family: str, masks=None) -> dict:
    """``{(layer, step): (mean before, mean after)}`` from per-sample states ``(z_in, z_mid, z_out)`` per block."""
    sums: dict = {}
    for i, block in enumerate(blocks, start=1):
        z_in, z_mid, z_out = states[i - 1]
        for b in range(z_in.shape[0]):
            keep = slice(None) if masks is None else masks[b].bool()
            zi, zm, zo = z_in[b][keep], z_mid[b][keep], z_out[b][keep]
            U = _U(block.attention)
            values = {"mssa": (_rc(zi, U), _rc(zm, U))}
            x = block.layernorm_after(zm).double()
            if family == "crate-alpha":
                D = block.sparse_coding.D.double()
                a1 = torch.stack([_relu(ETA * D.T @ t - ETA * LAM) for t in x])
                a2 = torch.stack([_relu(a - ETA * D.T @ (D @ a - t) - ETA * LAM) for a, t in zip(a1, x)])
                values["ista_1"] = (_lasso(x, D, 0 * a1), _lasso(x, D, a1))
                values["ista_2"] = (_lasso(x, D, a1), _lasso(x, D, a2))
            elif family == "crate-lm":
                D = block.ista.weight.double().T  # (d, m)
                z0 = torch.stack([_relu(ETA * D.T @ t - ETA * LAM) for t in x])
                z1 = torch.stack([_relu(a + ETA * D.T @ (t - D @ a) - ETA * LAM) for a, t in zip(z0, x)])
                values["ista_1"] = (_lasso(x, D, 0 * z0), _lasso(x, D, z0))
                values["ista_2"] = (_lasso(x, D, z0), _lasso(x, D, z1))
            else:  # one ISTA step from a = x on a square D; its output is the block output
                D = block.ista.weight.double()
                code = torch.stack([_relu(t + ETA * D.T @ (t - D @ t) - ETA * LAM) for t in x])
                torch.testing.assert_close(code, zo.double(), rtol=1e-4, atol=1e-5)
                values["ista"] = (_lasso(x, D, x), _lasso(x, D, code))
            for step, (before, after) in values.items():
                acc = sums.setdefault((i, step), [0.0, 0.0])
                acc[0] += before / z_in.shape[0]
                acc[1] += after / z_in.shape[0]
    return {k: tuple(v) for k, v in sums.items()}


def _states(base, **inputs):
    out = base(**inputs, output_hidden_states=True, output_mid_hidden_states=True)
    return [(out.hidden_states[i], out.mid_hidden_states[i], out.hidden_states[i + 1]) for i in range(2)]


def _pixels(seed=0):
    return torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def test_crate_ledger():
    torch.manual_seed(0)
    model = CrateForImageClassification(CrateConfig(**VISION, ista_lambda=LAM)).eval()
    x = _pixels()
    with torch.no_grad():
        expected = _vision_expected(model.crate.encoder.layer, _states(model.crate, pixel_values=x), "crate")
    _check(objective_ledger(model, x, eps=EPS), expected)


def test_crate_alpha_ledger():
    torch.manual_seed(0)
    model = CrateAlphaForImageClassification(CrateAlphaConfig(**VISION, ista_lambda=LAM)).eval()
    x = _pixels(1)
    with torch.no_grad():
        states = _states(model.crate_alpha, pixel_values=x)
        expected = _vision_expected(model.crate_alpha.encoder.layer, states, "crate-alpha")
    assert all(v[1] != v[0] for v in expected.values())
    _check(objective_ledger(model, x, eps=EPS), expected)


def test_crate_mae_ledger_reads_the_unmasked_encoder():
    torch.manual_seed(0)
    config = CrateMAEConfig(**{**VISION, "patch_size": 2}, decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
                            ista_lambda=LAM)  # fmt: skip
    model = CrateMAEForImageClassification(config).eval()
    x = _pixels(2)
    with torch.no_grad():
        expected = _vision_expected(model.crate_mae.encoder, _states(model.crate_mae, pixel_values=x), "crate")
    _check(objective_ledger(model, x, eps=EPS), expected)


def test_tost_ledger():
    torch.manual_seed(0)
    model = TostForImageClassification(TostConfig(**VISION, num_class_attention_layers=1)).eval()
    with torch.no_grad():
        for layer in model.tost.layer:
            layer.attention.qkv.weight.mul_(20.0)  # objective values of order one
    x = _pixels(3)
    with torch.no_grad():
        out = model.tost(pixel_values=x, output_hidden_states=True, output_mid_hidden_states=True,
                         output_memberships=True)  # fmt: skip
    expected = {}
    for i, layer in enumerate(model.tost.layer):
        U, pi = _U(layer.attention).detach().double(), out.memberships[i].double()
        values = []
        for state in (out.hidden_states[i], out.mid_hidden_states[i]):
            total = 0.0
            for b in range(x.shape[0]):
                N = state.shape[1]
                for k in range(U.shape[0]):
                    w = state[b].double() @ U[k]  # (N, p)
                    nk = float(pi[b, k].sum())
                    second = [(pi[b, k] * w[:, j] ** 2).sum() / nk for j in range(w.shape[1])]
                    total += 0.5 * nk / N * sum(math.log1p(float(s)) for s in second)
            values.append(total / x.shape[0])
        expected[(i + 1, "tssa")] = tuple(values)
    _check(objective_ledger(model, x, eps=EPS), expected)


@pytest.mark.parametrize("block", ["crate-lm", "crate"])
def test_text_ledger_counts_real_tokens_only(block):
    causal = block == "crate-lm"
    preset = "crate-lm-12l" if causal else "crate-bert-base"
    config = CrateTextConfig.from_preset(
        preset, vocab_size=29, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=16, ista_lambda=LAM, pad_token_id=0,
        **({"ista_dictionary_size": 32} if causal else {"ista_dictionary_size": 16}),
    )  # fmt: skip
    torch.manual_seed(0)
    model = (CrateTextForCausalLM if causal else CrateTextForMaskedLM)(config).eval()
    ids = torch.randint(1, 29, (2, 7), generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[1] * 7, [0, 0] + [1] * 5]) if causal else torch.tensor([[1] * 7, [1] * 5 + [0, 0]])
    with torch.no_grad():
        kwargs = {"use_cache": False} if causal else {}
        states = _states(model.crate, input_ids=ids, attention_mask=mask, **kwargs)
        expected = _vision_expected(model.crate.layer, states, block, masks=mask)
    _check(objective_ledger(model, {"input_ids": ids, "attention_mask": mask}, eps=EPS), expected)
