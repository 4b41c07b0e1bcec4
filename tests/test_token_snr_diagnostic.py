"""hf_tdiag.token_snr on real models: every layer's class SNRs against an independent NumPy computation from the
hidden states (split, centring, SVD subspaces, projections written out), padding left out, batching, the report
contract, the command line, the evaluate module and the refusals."""

import json

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel, ViTConfig, ViTForImageClassification

import hf_tdiag
from hf_tdiag.cli import main as cli_main
from hf_tdiag.diagnostics.token_snr import fit_split, token_snr
from hf_tdiag.diagnostics.token_snr_report import TokenSNRReport


def _vit(seed=0):
    torch.manual_seed(seed)
    config = ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=16, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=32)  # fmt: skip
    return ViTForImageClassification(config).eval()


def _reference(hidden, labels, rank, center, first):
    """Per layer, per class: SNR by NumPy. Fit on the 2nd, 4th, … input of each class (fit_fraction 0.5), subspace =
    top-rank left singular vectors of the fitting tokens (less each position's fitting mean when centring)."""
    labels = np.asarray(labels)
    fit = np.zeros(len(labels), dtype=bool)
    for k in np.unique(labels):
        fit[np.flatnonzero(labels == k)[1::2]] = True
    out = []
    for state in hidden:
        Z = state.double().numpy()[:, :1] if first else state.double().numpy()
        mean = Z[fit].mean(0) if center else np.zeros(Z.shape[1:])
        Z = Z - mean
        row = []
        for k in np.unique(labels):
            A = Z[fit & (labels == k)].reshape(-1, Z.shape[-1])
            U = np.linalg.svd(A.T, full_matrices=False)[0][:, :rank]
            B = Z[~fit & (labels == k)].reshape(-1, Z.shape[-1])
            P = B @ U @ U.T
            signal, noise = np.linalg.norm(P), np.linalg.norm(B - P)
            row.append(np.inf if noise**2 <= 1e-12 * (signal**2 + noise**2) else signal / noise)  # round-off: none
        out.append(row)
    return out


@pytest.mark.parametrize("center,tokens", [(True, "all"), (False, "all"), (False, "first")])
def test_class_snr_equals_an_independent_computation(center, tokens):
    model = _vit()
    x = torch.randn(24, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    labels = [0, 1, 2] * 8
    report = token_snr(model, x, labels, rank=3, center=center, tokens=tokens, batch_size=7)
    with torch.no_grad():
        hidden = model(pixel_values=x, output_hidden_states=True).hidden_states
    expected = _reference(hidden, labels, 3, center, tokens == "first")
    assert report.num_layers == 2 and [layer.layer for layer in report.layers] == [0, 1, 2]
    got = [layer.class_snr for layer in report.layers]
    assert np.allclose(got, expected, rtol=1e-6)
    assert report.snr() == pytest.approx([float(np.mean(row)) for row in expected], rel=1e-6)
    assert (report.num_fit, report.num_measured, report.rank, report.num_classes) == (12, 12, 3, 3)


def test_fit_split_spreads_each_class_evenly():
    labels = torch.tensor([0, 0, 1, 0, 1, 1, 0, 1])
    assert fit_split(labels, 2, 0.5).tolist() == [False, True, False, False, True, False, True, True]
    assert fit_split(labels, 2, 0.25).tolist() == [False, False, False, False, False, False, True, True]
    with pytest.raises(ValueError, match="class 0 has 4 input"):
        fit_split(labels, 2, 0.2)
    with pytest.raises(ValueError, match="labels: class 7 has 1 input"):  # the user's label, not its index
        token_snr(_vit(), torch.randn(5, 1, 8, 8), [3, 3, 7, 3, 3])


def test_padding_tokens_are_left_out():
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=16)).eval()  # fmt: skip
    ids = torch.randint(1, 50, (12, 5), generator=torch.Generator().manual_seed(2))
    labels = [0, 1] * 6
    plain = token_snr(bert, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, labels, rank=2)
    padded_ids = torch.cat([ids, torch.zeros(12, 3, dtype=ids.dtype)], 1)
    mask = torch.cat([torch.ones_like(ids), torch.zeros(12, 3, dtype=ids.dtype)], 1)
    padded = token_snr(bert, {"input_ids": padded_ids, "attention_mask": mask}, labels, rank=2)
    assert np.allclose([layer.class_snr for layer in padded.layers], [layer.class_snr for layer in plain.layers],
                       rtol=1e-5)  # fmt: skip
    # the padding counted (no mask, uncentred: centring would remove most of the identical padding tokens)
    unmasked = token_snr(bert, {"input_ids": padded_ids}, labels, rank=2, center=False)
    masked = token_snr(bert, {"input_ids": padded_ids, "attention_mask": mask}, labels, rank=2, center=False)
    assert not np.allclose(unmasked.snr(), masked.snr(), rtol=1e-2)


def test_batches_of_different_lengths_equal_one_padded_batch():
    """Texts come in batches padded to their own longest: the per-position sums grow to the longest batch."""
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=16)).eval()  # fmt: skip
    ids = torch.randint(1, 50, (8, 6), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[:4, 3:] = 0  # the first four texts have 3 tokens
    labels = [0, 1] * 4
    whole = token_snr(bert, {"input_ids": ids, "attention_mask": mask}, labels, rank=2)
    short = {"input_ids": ids[:4, :3], "attention_mask": mask[:4, :3]}  # padded to their own longest: 3
    long = {"input_ids": ids[4:], "attention_mask": mask[4:]}
    # short first (the sums grow to 6 positions), then long first (a shorter batch added to longer sums); the fitting
    # inputs are the same either way: within each class the 2nd and 4th of rows (0, 2, 4, 6) and of (4, 6, 0, 2)
    for parts in ([short, long], [long, short]):
        split = token_snr(bert, parts, labels, rank=2)
        assert np.allclose([layer.class_snr for layer in split.layers], [layer.class_snr for layer in whole.layers],
                           rtol=1e-5)  # fmt: skip


def test_report_contract_and_model_left_as_found(tmp_path):
    model = _vit().train()
    x = torch.randn(12, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    report = token_snr(model, [x[:5], {"pixel_values": x[5:]}], [0, 1, 2, 3] * 3, tokens="first")
    assert model.training and report.rank == 16 // 4 and report.tokens == "first"
    # the CLS token is one constant at layer 0: centred, nothing is left to fit or measure (nan)
    assert np.isnan(report.layers[0].class_snr).all() and report.layers[0].signal == [0.0] * 4
    again = TokenSNRReport.from_json(report.to_json(tmp_path / "snr.json"))
    assert again.to_dict() == report.to_dict() and np.isnan(again.layers[0].snr)
    raw = token_snr(model, x, [0, 1, 2, 3] * 3, tokens="first", center=False)  # uncentred: all of it is signal
    assert np.isinf(raw.layers[0].class_snr).all() and np.isinf(TokenSNRReport.from_json(raw.to_json()).snr()[0])
    frame = report.to_pandas()
    assert frame.columns.tolist() == ["layer", "snr", "snr_min", "snr_max", "signal_fraction"]
    assert frame["layer"].tolist() == [0, 1, 2] and str(frame["snr"].dtype) == "float64"
    summary = report.summary()
    assert summary["snr_last_over_first_block"] == pytest.approx(report.snr()[2] / report.snr()[1])
    assert report.plot().axes
    bad = json.loads(report.to_json())
    bad["layers"][1]["class_snr"][0] = "high"
    with pytest.raises(ValueError, match=r"'layers\[1\].class_snr\[0\]': expected a number, 'inf' or 'nan'"):
        TokenSNRReport.from_dict(bad)


def test_bad_inputs_are_refused():
    model = _vit()
    x = torch.randn(8, 1, 8, 8)
    with pytest.raises(ValueError, match="labels: got 9 labels for 8 inputs"):
        token_snr(model, x, [0, 1, 2] * 3)
    with pytest.raises(ValueError, match="labels: got 6 labels for more inputs"):
        token_snr(model, x, [0, 1] * 3)
    with pytest.raises(ValueError, match="at least 2 classes"):
        token_snr(model, x, [4] * 8)
    with pytest.raises(ValueError, match="integer class labels"):
        token_snr(model, x, [0.0, 1.0] * 4)
    with pytest.raises(TypeError, match="labels: expected one integer class label per input"):
        token_snr(model, x, "01010101")
    with pytest.raises(ValueError, match="rank: expected at most the tokens' dimension 16, got 17"):
        token_snr(model, x, [0, 1] * 4, rank=17)
    with pytest.raises(ValueError, match="fit_fraction: expected a finite number in \\(0, 1\\)"):
        token_snr(model, x, [0, 1] * 4, fit_fraction=0.0)

    class NoStates(torch.nn.Module):
        main_input_name = "pixel_values"

        def forward(self, pixel_values, output_hidden_states=False):
            return {"logits": pixel_values.flatten(1)}

    with pytest.raises(ValueError, match="NoStates returns no hidden_states"):
        token_snr(NoStates(), x, [0, 1] * 4)


def test_cli_and_evaluate_module_report_the_diagnostics_numbers(tmp_path, capsys):
    import evaluate
    from PIL import Image

    from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification, CrateImageProcessor

    torch.manual_seed(0)
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).eval()
    model.save_pretrained(tmp_path / "model")
    processor = CrateImageProcessor.for_config(model.config)
    processor.save_pretrained(tmp_path / "model")
    images = tmp_path / "images"
    g = np.random.default_rng(0)
    for cls in ("a", "b"):
        (images / cls).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(g.integers(0, 255, (8, 8), dtype=np.uint8)).save(images / cls / f"{i}.png")
    rc = cli_main(["token-snr", str(tmp_path / "model"), "--images", str(images), "--rank", "2", "--no-center",
                   "--output-dir", str(tmp_path / "out")])  # fmt: skip
    assert rc == 0
    assert "token SNR" in capsys.readouterr().out
    written = TokenSNRReport.from_json(tmp_path / "out" / "token_snr.json")
    assert (written.num_classes, written.rank, written.center, written.num_fit) == (2, 2, False, 6)
    assert (tmp_path / "out" / "token_snr.png").stat().st_size > 0 and (tmp_path / "out" / "token_snr.csv").is_file()

    from hf_tdiag.inputs import load_images

    found = load_images(str(images))
    pixels = processor(found.images, return_tensors="pt")["pixel_values"]
    direct = token_snr(model, pixels, found.labels, rank=2, center=False)
    assert written.snr() == pytest.approx(direct.snr(), rel=1e-6)
    out = evaluate.load(hf_tdiag.metric_path("token_snr")).compute(
        model=model, pixel_values=pixels, labels=found.labels, rank=2, center=False
    )
    assert [out[f"snr_layer_{i}"] for i in range(5)] == pytest.approx(direct.snr(), rel=1e-9)
    assert out["fraction_increasing"] == direct.summary()["fraction_increasing"]
    with pytest.raises(ValueError, match="labels: required"):
        evaluate.load(hf_tdiag.metric_path("token_snr")).compute(model=model, pixel_values=pixels)
