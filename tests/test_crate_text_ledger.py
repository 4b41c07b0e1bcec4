"""The objective ledger on text CRATE models (diagnostics/objective_ledger_text.py): each step's objective against a
computation written here from the equations on each sample's real tokens (padding excluded), for the square
one-step block and CRATE-LM's overcomplete two-step block, causal and masked; the flag against ISTA's monotonicity
(η‖D‖₂² ≤ 1 never increases the LASSO objective)."""

import pytest
import torch
import torch.nn.functional as F

from hf_tdiag.diagnostics.objective_ledger import objective_ledger
from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM, CrateTextForMaskedLM

EPS = 0.1
D_MODEL, HEADS = 16, 2


def _model(causal: bool, block: str, dictionary_norm: float | None = None):
    preset = "crate-lm-12l" if causal else "crate-bert-base"
    config = CrateTextConfig.from_preset(
        preset, block=block, vocab_size=40, hidden_size=D_MODEL, num_hidden_layers=2, num_attention_heads=HEADS,
        max_position_embeddings=16, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = (CrateTextForCausalLM if causal else CrateTextForMaskedLM)(config).eval()
    if dictionary_norm is not None:
        with torch.no_grad():
            for layer in model.crate.layer:
                W = layer.ista.weight
                W.mul_(dictionary_norm / torch.linalg.matrix_norm(W, ord=2))
    return model


def _batch():
    ids = torch.randint(1, 40, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, -4:] = 0  # right padding (ids left as they are: the ledger must not read them)
    mask[2, -1] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _rc(Z, W):
    """Σ_k ½ logdet(I_p + p/(Nε²) A_kᵀA_k), A_k = Z W_kᵀ with W_k rows k·p … (k+1)·p − 1 of the qkv weight."""
    N, p = Z.shape[0], W.shape[0] // HEADS
    total = 0.0
    for k in range(HEADS):
        A = Z.double() @ W[k * p : (k + 1) * p].double().T
        total += 0.5 * float(torch.logdet(torch.eye(p, dtype=torch.float64) + p / (N * EPS**2) * A.T @ A))
    return total


def _lasso(x, D, a, lam=0.1):
    """Mean over tokens of ½‖x_n − D a_n‖² + λ‖a_n‖₁, token by token (D: d × m)."""
    vals = [0.5 * float(((x[n] - D @ a[n]) ** 2).sum()) + lam * float(a[n].abs().sum()) for n in range(x.shape[0])]
    return sum(vals) / len(vals)


def _expected(model, batch):
    """{(layer, step): (before, after)} from the model's own states Z^{ℓ−1}, Z^{ℓ−½}, Z^ℓ and the equations."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        out = model.crate(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_mid_hidden_states=True)
    eta = lam = 0.1
    table = {}
    for i, layer in enumerate(model.crate.layer):
        W = layer.attention.qkv.weight.detach()
        ln = layer.layernorm_after
        dictionary = layer.ista.weight.detach().double()
        sums: dict[str, list[float]] = {}
        for b in range(ids.shape[0]):
            keep = mask[b].bool()
            z_in, z_mid, z_out = (out.hidden_states[i][b, keep], out.mid_hidden_states[i][b, keep],
                                  out.hidden_states[i + 1][b, keep])  # fmt: skip
            x = F.layer_norm(z_mid, (D_MODEL,), ln.weight, ln.bias, ln.eps).detach().double()
            vals = {"mssa": (_rc(z_in, W), _rc(z_mid, W))}
            if dictionary.shape[0] == dictionary.shape[1]:  # square: D = weight, one step from a = x
                D = dictionary
                code = torch.stack([torch.relu(t + eta * D.T @ (t - D @ t) - eta * lam) for t in x])
                assert torch.allclose(code, z_out.double(), atol=1e-5)  # the block output is that code
                vals["ista"] = (_lasso(x, D, x), _lasso(x, D, code))
            else:  # overcomplete: weight = Dᵀ (m, d), two steps from zero, output D z1
                D = dictionary.T
                z0 = torch.stack([torch.relu(eta * D.T @ t - eta * lam) for t in x])
                z1 = torch.stack([torch.relu(a + eta * D.T @ (t - D @ a) - eta * lam) for a, t in zip(z0, x)])
                assert torch.allclose(z1 @ D.T, z_out.double(), atol=1e-5)  # the block output decodes z1
                vals["ista_1"] = (_lasso(x, D, 0 * z0), _lasso(x, D, z0))
                vals["ista_2"] = (_lasso(x, D, z0), _lasso(x, D, z1))
            for step, pair in vals.items():
                acc = sums.setdefault(step, [0.0, 0.0])
                acc[0] += pair[0] / ids.shape[0]
                acc[1] += pair[1] / ids.shape[0]
        table.update({(i + 1, step): tuple(v) for step, v in sums.items()})
    return table


@pytest.mark.parametrize("causal,block", [(True, "crate-lm"), (False, "crate"), (True, "crate")])
def test_text_ledger_matches_the_equations_on_real_tokens(causal, block):
    model = _model(causal, block)
    batch = _batch()
    report = objective_ledger(model, batch, eps=EPS)
    got = {(s.layer, s.step): (s.before, s.after) for s in report.steps}
    expected = _expected(model, batch)
    assert set(got) == set(expected)
    for key, (before, after) in expected.items():
        assert got[key][0] == pytest.approx(before, rel=1e-5), key
        assert got[key][1] == pytest.approx(after, rel=1e-5), key
    assert report.family == "crate_text" and report.num_samples == 3 and report.num_layers == 2
    # padding is excluded: filling the padded positions with other ids changes nothing
    other = dict(batch, input_ids=batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 7))
    again = objective_ledger(model, [other], eps=EPS)
    assert [s.before for s in again.steps] == pytest.approx([s.before for s in report.steps], rel=1e-6)


def test_text_ledger_flag_follows_ista_monotonicity():
    """η‖D‖₂² = 0.9: no ISTA step increases the LASSO objective; η‖D‖₂² = 10: the steps overshoot and are flagged."""
    batch = _batch()
    safe = objective_ledger(_model(True, "crate-lm", dictionary_norm=3.0), batch)
    assert all(s.change < 0 and not s.increased for s in safe.steps if s.step.startswith("ista"))
    wild = objective_ledger(_model(True, "crate-lm", dictionary_norm=10.0), batch)
    assert {layer for layer, step in wild.increasing_steps() if step == "ista_2"} == {1, 2}


def test_text_ledger_inputs_are_checked_and_the_model_left_as_found():
    model = _model(True, "crate-lm").train()
    ids = _batch()["input_ids"]
    report = objective_ledger(model, ids)  # bare ids: every token is real
    assert model.training and report.num_samples == 3
    with pytest.raises(ValueError, match="tokenizer: no tokenizer found .*; pass tokenizer="):
        objective_ledger(model, ["some text"])  # strings are encoded by the model's tokenizer: here there is none
    with pytest.raises(ValueError, match="input_ids"):
        objective_ledger(model, {"pixel_values": torch.zeros(1, 1, 8, 8)})


@pytest.mark.slow
def test_ledger_cli_on_texts(tmp_path, capsys):
    """``hf-tdiag objective-ledger MODEL --texts FILE``: the written ledger is objective_ledger's on the tokenized lines."""
    import json
    from pydoc_data.topics import topics

    from hf_tdiag.cli import main as cli_main
    from hf_tdiag.text_corpus import train_tokenizer

    tokenizer = train_tokenizer([topics["for"], topics["if"]], 300)
    model = _model(True, "crate-lm")
    model.config.pad_token_id = tokenizer.pad_token_id
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(tmp_path / "clm")
    tokenizer.save_pretrained(tmp_path / "clm")
    lines = ["The for statement iterates over a sequence.", "An if statement runs one suite."]
    (tmp_path / "texts.txt").write_text("\n".join(lines) + "\n")
    rc = cli_main(["objective-ledger", str(tmp_path / "clm"), "--texts", str(tmp_path / "texts.txt"), "--max-length", "16",
                   "--output-dir", str(tmp_path / "out")])  # fmt: skip
    assert rc == 0 and "(2 texts)" in capsys.readouterr().out
    written = json.loads((tmp_path / "out" / "objective_ledger.json").read_text())
    batch = tokenizer(lines, padding=True, truncation=True, max_length=16, return_tensors="pt")
    expected = objective_ledger(model.eval(), dict(batch))
    assert [(s["layer"], s["step"]) for s in written["steps"]] == [(s.layer, s.step) for s in expected.steps]
    assert [s["after"] for s in written["steps"]] == pytest.approx([s.after for s in expected.steps], rel=1e-5)
