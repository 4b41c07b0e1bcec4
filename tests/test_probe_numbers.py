"""The probes' less-travelled paths, each against an independent computation: the architecture flags, list queries of
the attention-SVM diagnostic, a one-head BERT, checkpoint key resolution, α's value/output gain written out per head,
the multimodal text config and the config checks of the decoder layout, padded / float inputs of the concept
probes, the supervised comparison's agreement table, the Schatten report's JSON round trip and the SRR error that
names a block."""

import json
import types

import numpy as np
import pytest
import torch
from decoder_models import build
from scipy.optimize import linear_sum_assignment
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    CLIPVisionConfig,
    LlamaConfig,
    LlamaForCausalLM,
    LlavaConfig,
    LlavaForConditionalGeneration,
    ViTConfig,
    ViTForImageClassification,
)

from hf_tdiag.diagnostics.attention_svm import attention_svm_diagnostic
from hf_tdiag.diagnostics.concept_fidelity import compare_concepts
from hf_tdiag.diagnostics.concept_fidelity.constants import alpha_constants
from hf_tdiag.diagnostics.schatten import SchattenReport, schatten_bounds
from hf_tdiag.diagnostics.srr import batch_srr_values, layer_srr
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
from hf_tdiag.probes.attention_heads import head_weights
from hf_tdiag.probes.block_matrices import encoder_weights
from hf_tdiag.probes.checkpoint import open_checkpoint
from hf_tdiag.probes.concept_decoder import decoder_block_forward
from hf_tdiag.probes.concept_model import concept_model_parts, layer_activations, text_encoding
from hf_tdiag.probes.concept_text import encode_texts
from hf_tdiag.probes.describe import describe


def _bert(heads=2, layers=2, hidden=16, cls=BertModel, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=40,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=24,
        max_position_embeddings=32,
        **kw,
    )
    return cls(cfg).eval()


def _ids(B=3, N=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 40, (B, N), generator=g)


# --------------------------------------------------------------------------- architecture


def test_pre_norm_flag_names_where_the_norm_sits():
    crate = CrateForImageClassification(
        CrateConfig(
            image_size=8, patch_size=4, num_channels=1, hidden_size=8, num_hidden_layers=2, num_attention_heads=2
        )
    )
    assert describe(crate).pre_norm is True  # CRATE normalises each block's input (LN before MSSA and ISTA)
    assert describe(_bert()).pre_norm is False  # BERT normalises after the residual sum
    assert describe(build("gpt2")).pre_norm is True


# --------------------------------------------------------------------------- attention-SVM queries


def test_list_queries_are_exactly_the_positions_asked_for():
    model = _bert()
    ids = _ids(B=3, N=7)
    mask = torch.ones_like(ids)
    mask[2, 4:] = 0  # position 5 of sequence 2 is padding: not a query
    diag = attention_svm_diagnostic(
        model, {"input_ids": ids, "attention_mask": mask}, 1, 0, queries=[1, 5], max_queries=None
    )
    got = sorted(map(tuple, diag.query_index.tolist()))
    assert got == [(0, 1), (0, 5), (1, 1), (1, 5), (2, 1)]


def test_decoder_head_index_errors_name_the_argument():
    model = build("gpt2")  # 2 blocks of 4 heads
    assert head_weights(model, 1, 3).W_Q.shape[0] == 8
    with pytest.raises(ValueError, match=r"^layer: expected .*got 2"):
        head_weights(model, 2, 0)
    with pytest.raises(ValueError, match=r"^head: expected .*got 4"):
        head_weights(model, 0, 4)
    with pytest.raises(ValueError, match=r"^layer: expected .*got -1"):
        head_weights(model, -1, 0)
    with pytest.raises(ValueError, match=r"^head: expected .*got -1"):
        head_weights(model, 0, -1)
    bert = _bert()  # 2 blocks of 2 heads
    assert head_weights(bert, 1, 1).head_dim == 8 and head_weights(model, 0, 0).head_dim == 8
    for layer, head, name, got in ((2, 0, "layer", 2), (-1, 0, "layer", -1), (0, 2, "head", 2), (0, -1, "head", -1)):
        with pytest.raises(ValueError, match=rf"^{name}: expected .*got {got}"):
            head_weights(bert, layer, head)
    with pytest.raises(TypeError, match="config"):
        head_weights(torch.nn.Linear(2, 2), 0, 0)  # a module, but not a Transformers model
    assert (describe(model).family, describe(build("llama")).family, describe(bert).decoder) == ("gpt2", "llama", None)


@pytest.mark.parametrize("unscaled, by_layer", [(False, False), (True, False), (False, True)])
def test_gpt2_head_scale_follows_its_config_and_the_models_own_attention(unscaled, by_layer):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=2,
        n_head=4,
        n_embd=32,
        n_positions=16,
        vocab_size=64,
        scale_attn_weights=not unscaled,
        scale_attn_by_inverse_layer_idx=by_layer,
        attn_implementation="eager",
    )
    model = GPT2LMHeadModel(cfg).double().eval()
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(ids, output_attentions=True, output_hidden_states=True)
    layer, head = 1, 2
    hw = head_weights(model, layer, head)
    want = (1.0 if unscaled else 8**-0.5) / (layer + 1 if by_layer else 1)
    assert hw.scale == pytest.approx(want, rel=1e-15)
    x = model.transformer.h[layer].ln_1(out.hidden_states[layer])[0]  # the head's input tokens
    q = x @ hw.W_Q.T + (hw.b_Q if hw.b_Q is not None else 0)
    k = x @ hw.W_K.T + (hw.b_K if hw.b_K is not None else 0)
    logits = hw.scale * q @ k.T
    logits = logits.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(torch.softmax(logits, -1), out.attentions[layer][0, head], rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- encoder weights


def test_a_one_head_bert_is_one_head_of_full_width():
    model = _bert(heads=1)
    w = encoder_weights(model)
    assert w.num_heads == 1 and w.head_dim == 16
    q = model.encoder.layer[1].attention.self.query.weight.detach()
    torch.testing.assert_close(w.heads(1, "query")[0], q.to(w.heads(1, "query").dtype), rtol=0, atol=0)


# --------------------------------------------------------------------------- checkpoints


def test_checkpoint_keys_resolve_a_base_models_names_by_their_unique_suffix(tmp_path):
    model = _bert(cls=BertForSequenceClassification, num_labels=3)
    folder = tmp_path / "ckpt"  # not the working directory (conftest runs each test in tmp_path): paths must be joined
    model.save_pretrained(folder)
    ck = open_checkpoint(str(folder))
    assert ck.source == ck.folder == str(folder) and ck.config.model_type == "bert" and ck.config.num_labels == 3
    assert {p.device.type for p in ck.meta_model.parameters()} == {"meta"}  # built, never loaded
    name = "encoder.layer.1.attention.self.value.weight"  # the base model's name; stored as bert.<name>
    assert ck.key(name) == "bert." + name
    assert ck.key("bert." + name) == "bert." + name
    with ck.tensors([name]) as get:
        torch.testing.assert_close(get(name), model.bert.encoder.layer[1].attention.self.value.weight.detach())
    with pytest.raises(ValueError, match="no tensor") as err:
        ck.key("encoder.layer.9.attention.self.value.weight")
    keys = sorted(ck.weight_map)  # the message shows the first five keys, as a sample of the naming
    assert str(keys[:5]) in str(err.value) and keys[5] not in str(err.value)
    with pytest.raises(ValueError, match="several"):
        ck.key("weight")  # every linear's weight ends so


# --------------------------------------------------------------------------- concept constants


def test_alpha_of_a_post_norm_block_is_the_per_head_value_output_gain_times_the_input_norm():
    model = _bert(cls=BertForSequenceClassification, heads=4, num_labels=2).double()
    cm = concept_model_parts(model)
    Z = torch.randn(3, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cert, est = alpha_constants(cm, 1, Z, torch.zeros(3, 6))
    att = model.bert.encoder.layer[1].attention  # block 2: the block that follows layer ℓ = 1
    Wv = att.self.value.weight.detach().numpy()
    Wo = att.output.dense.weight.detach().numpy()
    p = 4
    gain = sum(
        np.linalg.norm(Wv[k * p : (k + 1) * p], 2) * np.linalg.norm(Wo[:, k * p : (k + 1) * p], 2) for k in range(4)
    )
    want = [gain / (2 * np.sqrt(p)) * np.linalg.norm(z, 2) for z in Z.numpy()]
    np.testing.assert_allclose(est.numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(cert.numpy(), want, rtol=1e-12)  # radius 0: the certified α is the estimate


# --------------------------------------------------------------------------- concept model inputs


def test_float_inputs_take_the_models_dtype():
    torch.manual_seed(0)
    cfg = ViTConfig(
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        image_size=8,
        patch_size=4,
        num_channels=1,
        num_labels=3,
    )
    model = ViTForImageClassification(cfg).double().eval()
    x = torch.rand(4, 1, 8, 8)  # float32 pixels for a float64 model
    acts = layer_activations(model, x, 1)
    with torch.no_grad():
        want = model(pixel_values=x.double(), output_hidden_states=True).hidden_states[1]
    assert acts.frame.dtype == torch.float64
    torch.testing.assert_close(acts.frame, want, rtol=1e-12, atol=1e-12)


def test_padded_text_encodings_are_refused():
    ids = _ids(B=2, N=5)
    enc = {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])}
    enc["concept_mask"] = torch.tensor([0, 1, 1, 1, 0])
    with pytest.raises(ValueError, match="padded texts"):
        text_encoding(enc)
    enc["attention_mask"] = torch.ones_like(ids)
    assert text_encoding(enc)["input_ids"] is ids


class _ShiftedSpecials:
    """A tokenizer double whose texts get their special tokens at different places (same width)."""

    def __call__(self, texts, add_special_tokens=True, return_special_tokens_mask=False, **kw):
        if isinstance(texts, str):
            return {"input_ids": list(range(3))}
        ids = torch.arange(5 * len(texts)).reshape(len(texts), 5)
        special = torch.tensor([[1, 0, 0, 0, 1], [1, 0, 0, 1, 0]][: len(texts)])
        return {"input_ids": ids, "special_tokens_mask": special}

    def num_special_tokens_to_add(self, pair=False):
        return 2


def test_texts_with_different_special_token_layouts_are_refused():
    with pytest.raises(ValueError, match="same special-token layout"):
        encode_texts(_ShiftedSpecials(), ["abc", "def"])


def test_decoder_blocks_that_return_a_tuple_give_their_hidden_state():
    model = build("llama").double()
    cm = concept_model_parts(model)
    block = model.model.layers[1]
    hidden = torch.randn(2, 5, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = decoder_block_forward(cm, block, hidden)
        own = block.forward
        block.forward = types.MethodType(lambda self, *a, **k: (own(*a, **k), None), block)  # a 4.x-style layer
        try:
            wrapped = decoder_block_forward(cm, block, hidden)
        finally:
            del block.forward
    assert plain.shape == hidden.shape
    torch.testing.assert_close(wrapped, plain, rtol=0, atol=0)


# --------------------------------------------------------------------------- concept comparison


def test_agreement_compares_every_other_fit_with_the_supervised_one():
    model = _bert(cls=BertForSequenceClassification, num_labels=2)
    ids = _ids(B=8, N=6, seed=3)
    enc = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "concept_mask": torch.tensor([0, 1, 1, 1, 1, 0])}
    out = compare_concepts(
        model, enc, 1, 3, gram_weights=(0.0, 1.0), max_iter=20, refine_iter=5, bounds=False, progress=False
    )
    assert set(out["agreement"]) == {"plain", "gram(mu=1)"}  # the supervised fit is the reference, not a row
    assert out["estimators"]["supervised"].supervised_iter == 100  # the documented default
    ref = out["estimators"]["supervised"].components_.double().numpy()
    for label, row in out["agreement"].items():
        W = out["estimators"][label].components_.double().numpy()
        cos = (W / np.linalg.norm(W, axis=1, keepdims=True)) @ (ref / np.linalg.norm(ref, axis=1, keepdims=True)).T
        r, c = linear_sum_assignment(-cos)
        assert row["mean_cosine"] == pytest.approx(cos[r, c].mean(), rel=1e-9, abs=1e-12)
        assert sorted(map(tuple, row["pairs"])) == sorted(zip(r.tolist(), c.tolist()))


# --------------------------------------------------------------------------- decoder layout


def test_a_multimodal_models_text_config_describes_its_language_model():
    tc = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        vocab_size=64,
        hidden_act="gelu",
    )
    vc = CLIPVisionConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=8, patch_size=4
    )
    model = LlavaForConditionalGeneration(LlavaConfig(text_config=tc, vision_config=vc, image_token_index=63))
    assert getattr(model.config, "hidden_size", None) is None  # the sizes live in the text config only
    lay = describe(model).decoder_layout()
    assert (lay.hidden_size, lay.num_heads, lay.num_kv_heads, lay.num_layers) == (32, 4, 2, 2)
    assert lay.activation == "gelu"  # the config's activation, not Llama's usual silu
    assert lay.layers_path == "model.language_model.layers"


def test_decoder_layout_checks_the_config_against_the_weights():
    model = LlamaForCausalLM(
        LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, intermediate_size=48, vocab_size=64)
    )
    assert describe(model).decoder_layout().activation == "silu"
    model.config.hidden_size = 48
    with pytest.raises(ValueError, match="hidden size 48 differs from the block width 32"):
        describe(model)


def test_query_heads_of_each_kv_head_and_the_bad_index():
    lay = describe(build("llama")).decoder_layout()  # 8 query heads, 2 K/V heads
    assert lay.query_heads(0) == [0, 1, 2, 3] and lay.query_heads(1) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="kv_head"):
        lay.query_heads(2)


# --------------------------------------------------------------------------- Schatten report


def test_spectrum_report_json_round_trip_from_text_and_file(tmp_path):
    rep = schatten_bounds(_bert(layers=2), progress=False)
    text = rep.to_json()
    path = tmp_path / "report.json"
    rep.to_json(path)
    for back in (SchattenReport.from_json("\n  " + text), SchattenReport.from_json(path)):
        assert back.to_dict() == json.loads(text)
        assert len(back.matrices) == len(rep.matrices)
        for a, b in zip(back.matrices, rep.matrices):
            assert a.shape == b.shape and isinstance(a.shape, tuple)
            np.testing.assert_array_equal(a.singular_values, b.singular_values)
            np.testing.assert_array_equal(a.contributions, b.contributions)
        np.testing.assert_array_equal(back.alpha, rep.alpha)


# --------------------------------------------------------------------------- SRR


def test_srr_names_the_block_whose_projection_is_not_finite():
    model = _bert(layers=3)
    with torch.no_grad():
        model.encoder.layer[1].attention.self.query.weight[0, 0] = float("nan")  # block 2 (1-based)
    with pytest.raises(ValueError, match=r"blocks \[2\]"):
        layer_srr(model, _ids(), progress=False)


def test_batch_values_without_given_subspaces_equal_the_reports():
    model = _bert(layers=2).double()
    with torch.no_grad():  # float64 weights that float32 cannot hold: precision="float64" must keep them so
        for prm in model.parameters():
            prm.add_(1e-3 * torch.randn_like(prm))
    ids = _ids()
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    report = layer_srr(model, batch, eps=0.5, lam=0.3, precision="float64", progress=False)
    values, emb = batch_srr_values(model, batch, eps=0.5, lam=0.3, precision="float64")
    torch.testing.assert_close(values[:, : report.values.shape[1]], report.values, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(emb, report.embedding_values, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- decoder norms and checkpoint sizes


def test_token_scale_is_what_each_norm_divides_by():
    from hf_tdiag.measures.concepts.alpha import token_scale
    from hf_tdiag.probes.concept_decoder import norm_eps

    Z = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0)) * 3 + 1  # non-zero mean: var ≠ mean square
    ln = torch.nn.LayerNorm(8, eps=1e-3)
    rms = build("llama").model.norm  # LlamaRMSNorm, variance_epsilon = config.rms_norm_eps
    z = Z.double().numpy()
    np.testing.assert_allclose(
        token_scale(Z, norm_eps(ln), centred=True).numpy(), np.sqrt(z.var(-1) + 1e-3), rtol=1e-12
    )
    np.testing.assert_allclose(
        token_scale(Z, norm_eps(rms), centred=False).numpy(),
        np.sqrt((z**2).mean(-1) + rms.variance_epsilon),
        rtol=1e-12,
    )
    # and they are what the modules themselves divide by: LN(z)·s = z − z̄ (unit weight, zero bias)
    with torch.no_grad():
        np.testing.assert_allclose(
            (ln(Z).double() * token_scale(Z, ln.eps)[..., None]).numpy(), z - z.mean(-1, keepdims=True), atol=1e-4
        )


def test_checkpoint_nbytes_are_the_stored_tensor_sizes(tmp_path):
    model = _bert(cls=BertModel)
    model.encoder.layer[0].attention.self.query.to(torch.bfloat16)
    model.save_pretrained(tmp_path / "ckpt")
    ck = open_checkpoint(str(tmp_path / "ckpt"))
    for name, dtype_bytes in (
        ("encoder.layer.0.attention.self.query.weight", 2),  # bf16
        ("encoder.layer.1.attention.self.query.weight", 4),  # f32
        ("encoder.layer.1.output.dense.bias", 4),
    ):
        numel = model.get_parameter(name).numel()
        assert ck.nbytes(name) == numel * dtype_bytes


def test_checkpoint_index_without_a_weight_map_is_refused(tmp_path):
    from hf_tdiag.probes.checkpoint import INDEX

    _bert().save_pretrained(tmp_path)
    (tmp_path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": {}}))
    with pytest.raises(ValueError, match="has no weight_map"):
        open_checkpoint(str(tmp_path))
    with pytest.raises((TypeError, ValueError), match="^model_or_path: "):
        open_checkpoint(str(tmp_path / "missing"))
    (tmp_path / INDEX).unlink()
    (tmp_path / "model.safetensors").unlink()  # a config and no weights
    with pytest.raises(ValueError, match=rf"^model_or_path: streaming .*{tmp_path.name}.* has neither"):
        open_checkpoint(str(tmp_path))
    (tmp_path / "config.json").unlink()
    (tmp_path / "other").mkdir()
    with pytest.raises((TypeError, ValueError), match="^model_or_path: "):
        open_checkpoint(str(tmp_path / "other"))  # a folder without config.json


def test_open_checkpoint_runs_a_repos_own_code_only_on_opt_in(tmp_path, monkeypatch):
    from test_loading import write_custom_code_repo

    marker = tmp_path / "marker.txt"
    monkeypatch.setenv("CUSTOM_CODE_MARKER", str(marker))
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    folder = write_custom_code_repo(tmp_path / "custom")
    with pytest.raises(ValueError, match="^model_or_path: .*needs its own Python code"):
        open_checkpoint(folder)
    assert not marker.exists()  # nothing from the folder ran
    ck = open_checkpoint(folder, trust_remote_code=True)
    # the repo's own class (its module may already be imported by an earlier test, so no marker is promised here)
    assert type(ck.meta_model).__name__ == "TinyCustomModel" and ck.key("proj.weight") == "proj.weight"
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="^model_or_path: "):
        open_checkpoint(str(tmp_path / "broken"))


# --------------------------------------------------------------------------- text concepts: labels, head, encoding


def test_pseudo_labels_are_seeded_kmeans_with_ten_starts():
    from sklearn.cluster import KMeans

    from hf_tdiag.probes.concept_text import pseudo_labels

    g = torch.Generator().manual_seed(0)
    F = torch.cat([torch.randn(4, 3, generator=g) + c for c in (-4.0, 0.0, 4.0)])  # (12, 3)
    for k in (2, 3, 12):  # up to one cluster per text
        got = pseudo_labels(F, k)
        want = KMeans(k, n_init=10, random_state=0).fit_predict(F.double().numpy())
        assert got.dtype == torch.long and got.tolist() == want.tolist()
    for bad in (1, 13):
        with pytest.raises(ValueError, match="n_clusters"):
            pseudo_labels(F, bad)
    assert sorted(set(pseudo_labels(F).tolist())) == [0, 1, 2, 3]  # four clusters by default


def _penalized_logistic_gradient(X, labels, head, l2=1e-3):
    """Norms of ∇_W, ∇_b of mean cross-entropy + l2·‖W‖²_F at the head's (W, b), written out here in float64."""
    W = head.weight.detach().double().requires_grad_(True)
    b = head.bias.detach().double().requires_grad_(True)
    y = torch.tensor([head.classes.index(lab) for lab in labels])
    loss = torch.nn.functional.cross_entropy(X.double() @ W.T + b, y) + l2 * W.square().sum()
    return tuple(float(t.norm()) for t in torch.autograd.grad(loss, (W, b)))


def test_linear_head_is_the_penalized_logistic_optimum():
    from hf_tdiag.probes.concept_text import fit_linear_head

    g = torch.Generator().manual_seed(1)
    F = torch.randn(30, 4, generator=g)
    labels = [("b", "a", "c")[i % 3] for i in range(30)]
    head = fit_linear_head(F, labels)  # the default penalty l2 = 1e-3
    assert head.classes == ["a", "b", "c"] and head.weight.dtype == F.dtype
    assert max(_penalized_logistic_gradient(F, labels, head)) < 1e-6  # float32 weights: the optimum to ~1e-7
    head64 = fit_linear_head(F.double(), labels)  # float64 features: the optimum to L-BFGS's tolerance
    assert head64.weight.dtype == torch.float64 and max(_penalized_logistic_gradient(F, labels, head64)) < 1e-7
    # badly scaled features (0.1 … 10): L-BFGS needs far more than its default 20 iterations to get there
    G = torch.randn(60, 12, generator=g, dtype=torch.float64) * torch.logspace(-1, 1, 12, dtype=torch.float64)
    lab60 = [("b", "a", "c")[i % 3] for i in range(60)]
    assert max(_penalized_logistic_gradient(G, lab60, fit_linear_head(G, lab60))) < 1e-4  # 20 iterations: ~1e-2
    # integer labels are ordered as strings, the documented order of head.classes
    assert fit_linear_head(F, [(10, 2, 3)[i % 3] for i in range(30)], max_iter=5).classes == [10, 2, 3]
    assert fit_linear_head(F, torch.tensor([i % 2 for i in range(30)]), max_iter=5).classes == [0, 1]


def test_encode_texts_cuts_every_text_to_the_shortest_and_takes_one_text(tmp_path):
    from decoder_models import char_tokenizer

    tok = char_tokenizer()
    enc = encode_texts(tok, ["abcdef", "abc", "abcd"])
    assert enc["n_tokens"] == 3 and enc["input_ids"].shape == (3, 4)  # <s> + 3 characters
    assert enc["concept_mask"].tolist() == [0, 1, 1, 1]
    one = encode_texts(tok, ["a"])  # a single text of a single token
    assert one["n_tokens"] == 1 and one["concept_mask"].tolist() == [0, 1]
    for bad in ("abc", [], ["abc", 3], ("abc", None)):
        with pytest.raises(TypeError, match="^texts: "):
            encode_texts(tok, bad)
    with pytest.raises((TypeError, ValueError), match="^max_tokens: "):
        encode_texts(tok, ["abc"], max_tokens=0)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_rotary_head_probabilities_are_the_models_own(family):
    """Qwen2 has query and key biases (the key bias matters once rotated); the llama head gets a non-default
    ``scaling``, which the diagnostic must read from the attention module."""
    from hf_tdiag.diagnostics.attention_svm import _log_probs

    model = build(family).double().eval()
    model.set_attn_implementation("eager")
    layer, head = 1, 3
    attn = model.model.layers[layer].self_attn
    if family == "llama":
        attn.scaling = 0.21
    ids = torch.randint(2, 64, (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(ids, output_attentions=True, output_hidden_states=True)
        hw = head_weights(model, layer, head)
        X = model.model.layers[layer].input_layernorm(out.hidden_states[layer])
        probs = _log_probs(hw, X, torch.ones(1, 7, dtype=torch.bool)).exp()
    assert hw.scale == pytest.approx(attn.scaling, rel=1e-15) and hw.head_dim == attn.head_dim
    assert (hw.b_K is not None) == (family == "qwen2")
    # rotary cos/sin are float32 tables in transformers: the two computations agree to float32 rounding
    torch.testing.assert_close(probs[0], out.attentions[layer][0, head], rtol=1e-5, atol=1e-7)
