"""The objective ledger: each family's objectives against an independent computation from the equations, the
increase flag against ISTA's monotonicity (step ≤ 1/‖D‖²), the report contract, the CLI and the refusal."""

import json

import pytest
import torch
import torch.nn.functional as F

import hf_tdiag  # noqa: F401
from hf_tdiag.cli import main as cli_main
from hf_tdiag.diagnostics.objective_ledger import ObjectiveLedgerReport, objective_ledger
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification
from hf_tdiag.models.tost import TostConfig, TostForImageClassification

pytestmark = pytest.mark.slow

EPS = 0.1


def _rc(Z, U):
    """Σ_k ½ logdet(I_p + p/(Nε²) (U_kᵀZ)(U_kᵀZ)ᵀ) for Z (N, d) and U (K, d, p), columns-as-tokens form."""
    N = Z.shape[0]
    total = 0.0
    for Uk in U.double():
        A = Uk.T @ Z.double().T  # (p, N)
        p = A.shape[0]
        total += 0.5 * torch.logdet(torch.eye(p, dtype=torch.float64) + p / (N * EPS**2) * A @ A.T)
    return float(total)


def _lasso(x, D, a, lam):
    """Mean over tokens of ½‖x_n − D a_n‖² + λ Σ_j |a_nj|, token by token."""
    vals = [0.5 * float(((x[n] - D @ a[n]) ** 2).sum()) + lam * float(a[n].abs().sum()) for n in range(x.shape[0])]
    return sum(vals) / len(vals)


def _heads(weight, K):
    p = weight.shape[0] // K
    return torch.stack([weight[k * p : (k + 1) * p].T for k in range(K)])  # (K, d, p)


def _ledger_table(report):
    return {(s.layer, s.step): (s.before, s.after) for s in report.steps}


def _check(table, expected):
    assert set(table) == set(expected)
    for key, (b, a) in expected.items():
        assert table[key][0] == pytest.approx(b, rel=1e-5, abs=1e-8), key
        assert table[key][1] == pytest.approx(a, rel=1e-5, abs=1e-8), key


def test_crate_ledger_matches_independent_objectives():
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    report = objective_ledger(model, x, eps=EPS)
    expected = {}
    with torch.no_grad():
        z = model.crate.embeddings(x)
        for i, layer in enumerate(model.crate.encoder.layer, start=1):
            U = _heads(layer.attention.qkv.weight, 4)
            mid = z + layer.attention(layer.layernorm_before(z))[0]
            W, lam, eta = layer.ista.weight.double(), 0.1, 0.1
            sums = [0.0] * 4
            for b in range(3):
                xin = F.layer_norm(mid[b], (64,), layer.layernorm_after.weight, layer.layernorm_after.bias).double()
                code = torch.relu(xin + eta * (xin - xin @ W.T) @ W - eta * lam)  # x + η Dᵀ(x − D x) − ηλ per row
                sums = [s + v for s, v in zip(sums, (_rc(z[b], U), _rc(mid[b], U), _lasso(xin, W, xin, lam),
                                                     _lasso(xin, W, code, lam)))]  # fmt: skip
            expected[(i, "mssa")] = (sums[0] / 3, sums[1] / 3)
            expected[(i, "ista")] = (sums[2] / 3, sums[3] / 3)
            z = layer(z)[0]
    _check(_ledger_table(report), expected)
    assert report.family == "crate" and report.num_samples == 3


def _alpha(scale=1.0):
    model = CrateAlphaForImageClassification(CrateAlphaConfig.from_preset("crate-alpha-digits", num_labels=10)).eval()
    with torch.no_grad():
        for layer in model.crate_alpha.encoder.layer:
            D = layer.sparse_coding.D
            D.mul_(scale / torch.linalg.matrix_norm(D, ord=2))  # ‖D‖₂ = scale
    return model


def test_crate_alpha_ledger_matches_independent_objectives():
    model = _alpha(scale=2.0)
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    report = objective_ledger(model, x)
    expected = {}
    with torch.no_grad():
        z = model.crate_alpha.embeddings(x)
        for i, layer in enumerate(model.crate_alpha.encoder.layer, start=1):
            U = _heads(layer.attention.qkv.weight, 4)
            mid = z + layer.attention(layer.layernorm_before(z))[0]
            D = layer.sparse_coding.D.double()
            sums = [0.0] * 5
            for b in range(2):
                xin = F.layer_norm(mid[b], (64,), layer.layernorm_after.weight, layer.layernorm_after.bias, 1e-6)
                xin = xin.double()
                a1 = torch.stack([torch.relu(0.1 * D.T @ t - 0.01) for t in xin])
                a2 = torch.stack([torch.relu(a - 0.1 * D.T @ (D @ a - t) - 0.01) for a, t in zip(a1, xin)])
                vals = (_rc(z[b], U), _rc(mid[b], U), _lasso(xin, D, 0 * a1, 0.1), _lasso(xin, D, a1, 0.1),
                        _lasso(xin, D, a2, 0.1))  # fmt: skip
                sums = [s + v for s, v in zip(sums, vals)]
            s = [v / 2 for v in sums]
            expected.update({(i, "mssa"): (s[0], s[1]), (i, "ista_1"): (s[2], s[3]), (i, "ista_2"): (s[3], s[4])})
            z = layer(z)[0]
    _check(_ledger_table(report), expected)


def test_the_flag_follows_ista_monotonicity():
    """ISTA with step η ≤ 1/‖D‖₂² never increases the LASSO objective; with η‖D‖₂² = 10 its steps overshoot."""
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    safe = objective_ledger(_alpha(scale=3.0), x)  # η‖D‖² = 0.9
    assert not [s for s in safe.steps if s.step.startswith("ista") and s.increased]
    assert all(s.change < 0 for s in safe.steps if s.step.startswith("ista"))
    wild = objective_ledger(_alpha(scale=10.0), x)  # η‖D‖² = 10
    flagged = [(layer, step) for layer, step in wild.increasing_steps() if step == "ista_2"]
    assert len(flagged) == 4  # every block's second step increases its objective
    assert wild.summary()["num_increasing_steps"] == len(wild.increasing_steps()) >= 4


def _tost_by_equations(model, x):
    """Per block (R_var before, after): memberships from the TSSA equations on LN1(z)U + b, objective written out."""
    out = {}
    with torch.no_grad():
        z = model.tost.embed(x)
        for i, layer in enumerate(model.tost.layer, start=1):
            att = layer.attention
            K, p = att.num_heads, att.head_dim
            w = att.qkv(layer.layernorm_before(z)).double()
            w = w.view(*w.shape[:2], K, p).permute(0, 2, 1, 3)
            normed = (w**2 / (w**2).sum(2, keepdim=True)).sum(-1)  # (B, K, N)
            pi = torch.softmax(normed * att.temp.double(), dim=1)
            mid = z + layer.gamma1 * att(layer.layernorm_before(z))[0]
            vals = []
            for state in (z, mid):
                W = torch.stack([state.double() @ att.qkv.weight.double()[k * p : (k + 1) * p].T for k in range(K)], 1)
                nk = pi.sum(-1)
                second = (pi[..., None] * W**2).sum(2) / nk[..., None]
                vals.append(float((0.5 * (nk / W.shape[2]) * torch.log(1 + second).sum(-1)).sum(-1).mean()))
            out[(i, "tssa")] = tuple(vals)
            z = layer(z)[0]
    return out


def test_tost_ledger_matches_independent_objectives():
    model = TostForImageClassification(TostConfig.from_preset("tost-digits", num_labels=10)).eval()
    with torch.no_grad():
        for layer in model.tost.layer:
            layer.attention.qkv.weight.mul_(20.0)  # objective values of order one
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    report = objective_ledger(model, x)
    _check(_ledger_table(report), _tost_by_equations(model, x))
    assert report.family == "tost" and [s.objective for s in report.steps] == ["Rc_var"] * 4


def test_report_contract_and_model_left_as_found(tmp_path):
    model = _alpha().train()
    x = torch.randn(2, 1, 8, 8)
    report = objective_ledger(model, [x, {"pixel_values": x}])
    assert model.training and report.num_samples == 4
    again = ObjectiveLedgerReport.from_json(report.to_json(tmp_path / "ledger.json"))
    assert again.to_dict() == report.to_dict()
    frame = report.to_pandas()
    assert list(frame["layer"].unique()) == [1, 2, 3, 4] and str(frame["increased"].dtype) == "boolean"
    assert str(frame["before"].dtype) == "float64" and len(frame) == 12
    assert frame["change"].tolist() == pytest.approx((frame["after"] - frame["before"]).tolist())
    assert report.plot().axes


def test_non_white_box_models_are_refused():
    from transformers import ViTConfig, ViTForImageClassification

    vit = ViTForImageClassification(ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=16,
                                              num_hidden_layers=1, num_attention_heads=2, intermediate_size=16))  # fmt: skip
    with pytest.raises(ValueError, match="no white-box blocks"):
        objective_ledger(vit, torch.randn(1, 1, 8, 8))


def test_cli_writes_the_ledger(tmp_path, capsys):
    model = _alpha(scale=10.0)
    model.save_pretrained(tmp_path / "model")
    from hf_tdiag.models.crate_alpha import CrateAlphaImageProcessor

    CrateAlphaImageProcessor.for_config(model.config).save_pretrained(tmp_path / "model")
    rc = cli_main(["objective-ledger", str(tmp_path / "model"), "--dataset", "digits", "--max-samples", "8",
                   "--output-dir", str(tmp_path / "out")])  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    assert "INCREASES" in text and "steps increase their objective" in text
    data = json.loads((tmp_path / "out" / "objective_ledger.json").read_text())
    assert data["family"] == "crate-alpha" and data["num_samples"] == 8 and len(data["steps"]) == 12
    assert (tmp_path / "out" / "objective_ledger.png").stat().st_size > 0 and (
        tmp_path / "out" / "objective_ledger.csv"
    ).is_file()


def test_evaluate_module_reports_the_diagnostics_numbers():
    import evaluate

    model = _alpha(scale=10.0)
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    out = evaluate.load(hf_tdiag.metric_path("objective_ledger")).compute(model=model, pixel_values=x)
    report = objective_ledger(model, x)
    assert out["num_increasing_steps"] == report.summary()["num_increasing_steps"]
    for s in report.steps:
        assert out[f"{s.step}_layer_{s.layer}_change"] == pytest.approx(s.change)
        assert out[f"{s.step}_layer_{s.layer}_increased"] == int(s.increased)
