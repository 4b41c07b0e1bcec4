"""Text-CRATE converters: state dicts in the layouts of Transformers PR #27759 and of CRATE-LM, built here, against
forwards written from the equations of each code (not from hf_tdiag's modules)."""

import math

import pytest
import torch
import torch.nn.functional as F

from hf_tdiag.models.crate_text.convert_official import convert_crate_lm, convert_pr_crate

pytestmark = pytest.mark.slow

V, D, L, K, T, PAD = 53, 24, 2, 4, 40, 1
ETA, LAM = 0.1, 0.1


def _ln(x, sd, name, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * sd[f"{name}.weight"] + sd[f"{name}.bias"]


def _norm_params(sd, name, gen):
    sd[f"{name}.weight"] = 1 + 0.1 * torch.randn(D, generator=gen)
    sd[f"{name}.bias"] = 0.1 * torch.randn(D, generator=gen)


def _tied_attention(h, u, causal, key_mask=None):
    """Heads softmax(w_k^T w_k / sqrt(p)) w_k with w = U^T h, for every head k; (B, N, K*p)."""
    b, n, _ = h.shape
    p = u.shape[0] // K
    w = torch.einsum("bnd,ed->bne", h, u).reshape(b, n, K, p)
    scores = torch.einsum("bikp,bjkp->bkij", w, w) / math.sqrt(p)
    if causal:
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    if key_mask is not None:
        scores = scores + (1.0 - key_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bkij,bjkp->bikp", probs, w).reshape(b, n, K * p)


# ---------------------------------------------------------------- Transformers PR #27759 (RoBERTa-shaped encoder)


def _pr_state_dict(head, seed=0):
    gen = torch.Generator().manual_seed(seed)
    sd = {
        "crate.embeddings.word_embeddings.weight": torch.randn(V, D, generator=gen),
        "crate.embeddings.position_embeddings.weight": torch.randn(T, D, generator=gen),
        "crate.embeddings.token_type_embeddings.weight": torch.randn(2, D, generator=gen),
    }
    _norm_params(sd, "crate.embeddings.LayerNorm", gen)
    for i in range(L):
        base = f"crate.encoder.layer.{i}"
        _norm_params(sd, f"{base}.attention.self.prenorm", gen)
        _norm_params(sd, f"{base}.output.prenorm", gen)
        sd[f"{base}.attention.self.qkv.weight"] = torch.randn(D, D, generator=gen) / math.sqrt(D)
        sd[f"{base}.attention.output.dense.weight"] = torch.randn(D, D, generator=gen) / math.sqrt(D)
        sd[f"{base}.output.weight"] = torch.randn(D, D, generator=gen) / math.sqrt(D)
    if head == "masked-lm":
        sd["lm_head.dense.weight"] = torch.randn(D, D, generator=gen) / math.sqrt(D)
        sd["lm_head.dense.bias"] = 0.1 * torch.randn(D, generator=gen)
        _norm_params(sd, "lm_head.layer_norm", gen)
        sd["lm_head.decoder.weight"] = sd["crate.embeddings.word_embeddings.weight"]
        sd["lm_head.bias"] = 0.1 * torch.randn(V, generator=gen)
        sd["lm_head.decoder.bias"] = sd["lm_head.bias"]
    elif head == "sequence-classification":
        sd["classifier.dense.weight"] = torch.randn(D, D, generator=gen) / math.sqrt(D)
        sd["classifier.dense.bias"] = 0.1 * torch.randn(D, generator=gen)
        sd["classifier.out_proj.weight"] = torch.randn(3, D, generator=gen)
        sd["classifier.out_proj.bias"] = torch.randn(3, generator=gen)
    elif head == "multiple-choice":
        sd["crate.pooler.dense.weight"] = torch.randn(D, D, generator=gen) / math.sqrt(D)
        sd["crate.pooler.dense.bias"] = 0.1 * torch.randn(D, generator=gen)
        sd["classifier.weight"] = torch.randn(1, D, generator=gen)
        sd["classifier.bias"] = torch.randn(1, generator=gen)
    return sd


def _pr_encoder(sd, ids, key_mask):
    """The PR's forward: RoBERTa positions, embedding LN (1e-12), per block x + dense(MSSA(LN x)), then ISTA(LN x)."""
    not_pad = (ids != PAD).long()
    positions = torch.cumsum(not_pad, dim=1) * not_pad + PAD
    x = (
        sd["crate.embeddings.word_embeddings.weight"][ids]
        + sd["crate.embeddings.position_embeddings.weight"][positions]
    )
    x = x + sd["crate.embeddings.token_type_embeddings.weight"][torch.zeros_like(ids)]
    x = _ln(x, sd, "crate.embeddings.LayerNorm", 1e-12)
    for i in range(L):
        base = f"crate.encoder.layer.{i}"
        h = _ln(x, sd, f"{base}.attention.self.prenorm", 1e-5)
        heads = _tied_attention(h, sd[f"{base}.attention.self.qkv.weight"], causal=False, key_mask=key_mask)
        x = heads @ sd[f"{base}.attention.output.dense.weight"].T + x
        h = _ln(x, sd, f"{base}.output.prenorm", 1e-5)
        dic = sd[f"{base}.output.weight"]  # column form z = ReLU(h + eta D^T (h - D h) - eta lambda)
        hc = h.unsqueeze(-1)
        x = F.relu(hc + ETA * dic.T @ (hc - dic @ hc) - ETA * LAM).squeeze(-1)
    return x


def _ids(batch=2, n=9, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (batch, n), generator=gen)
    mask = torch.ones_like(ids)
    ids[1, -3:] = PAD
    mask[1, -3:] = 0
    return ids, mask


def test_pr_masked_lm_matches_the_pr_equations_with_padding():
    sd = _pr_state_dict("masked-lm")
    model = convert_pr_crate(sd, num_attention_heads=K)
    assert type(model).__name__ == "CrateTextForMaskedLM" and not model.config.is_decoder
    ids, mask = _ids()
    x = _pr_encoder(sd, ids, mask)
    g = F.gelu(x @ sd["lm_head.dense.weight"].T + sd["lm_head.dense.bias"])
    expected = _ln(g, sd, "lm_head.layer_norm", 1e-12) @ sd["lm_head.decoder.weight"].T + sd["lm_head.bias"]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert model.lm_head.decoder.weight.data_ptr() == model.crate.embeddings.word_embeddings.weight.data_ptr()


def test_pr_sequence_classification_and_multiple_choice():
    sd = _pr_state_dict("sequence-classification")
    model = convert_pr_crate(sd, num_attention_heads=K)
    assert model.config.num_labels == 3
    ids, mask = _ids()
    first = _pr_encoder(sd, ids, mask)[:, 0]
    hidden = torch.tanh(first @ sd["classifier.dense.weight"].T + sd["classifier.dense.bias"])
    expected = hidden @ sd["classifier.out_proj.weight"].T + sd["classifier.out_proj.bias"]
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, expected, rtol=1e-5, atol=1e-5)

    sd = _pr_state_dict("multiple-choice", seed=3)
    model = convert_pr_crate(sd, num_attention_heads=K)
    choices = torch.randint(3, V, (2, 3, 7), generator=torch.Generator().manual_seed(4))
    flat = choices.reshape(6, 7)
    pooled = torch.tanh(
        _pr_encoder(sd, flat, torch.ones_like(flat))[:, 0] @ sd["crate.pooler.dense.weight"].T
        + sd["crate.pooler.dense.bias"]
    )
    expected = (pooled @ sd["classifier.weight"].T + sd["classifier.bias"]).view(2, 3)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=choices).logits, expected, rtol=1e-5, atol=1e-5)


def test_pr_converter_errors_name_the_key():
    sd = _pr_state_dict("masked-lm")
    broken = dict(sd)
    del broken["crate.encoder.layer.1.output.weight"]
    with pytest.raises(ValueError, match=r"missing 1 key.*layer\.1\.output\.weight"):
        convert_pr_crate(broken, num_attention_heads=K)
    extra = dict(sd, **{"crate.encoder.layer.0.attention.self.distance_embedding.weight": torch.zeros(3, 6)})
    with pytest.raises(ValueError, match="unexpected 1|1 unexpected"):
        convert_pr_crate(extra, num_attention_heads=K)
    with pytest.raises(ValueError, match="task must be one of"):
        convert_pr_crate(sd, num_attention_heads=K, task="causal-lm")


# ---------------------------------------------------------------- CRATE-LM (nanoGPT layout)


def _crate_lm_state_dict(overcomplete=True, seed=0, prefix="_orig_mod."):
    gen = torch.Generator().manual_seed(seed)
    wte = torch.randn(V, D, generator=gen)
    sd = {"transformer.wte.weight": wte, "transformer.wpe.weight": torch.randn(T, D, generator=gen)}
    atoms = 4 * D if overcomplete else D
    for i in range(L):
        base = f"transformer.h.{i}"
        _norm_params(sd, f"{base}.prenorm_1", gen)
        _norm_params(sd, f"{base}.prenorm_2", gen)
        sd[f"{base}.attn.c_attn.weight"] = torch.randn(D, D, generator=gen) / math.sqrt(D)
        sd[f"{base}.attn.c_proj.weight"] = torch.randn(D, D, generator=gen) / math.sqrt(D)
        sd[f"{base}.attn.c_proj.bias"] = 0.1 * torch.randn(D, generator=gen)
        sd[f"{base}.ista.weight"] = torch.randn(atoms, D, generator=gen) / math.sqrt(D)
        if not overcomplete:
            sd[f"{base}.attn.bias"] = torch.ones(T, T).tril().view(1, 1, T, T)  # crate.py's mask buffer
    if overcomplete:
        _norm_params(sd, "transformer.ln_f", gen)
    sd["lm_head.weight"] = wte
    return {"model": {prefix + k: v for k, v in sd.items()}, "model_args": {"n_head": K, "n_embd": D}}, sd


def _crate_lm_forward(sd, ids, overcomplete):
    """CRATE-LM: x + c_proj(causal MSSA(LN x)); overcomplete ISTA z0 = ReLU(eta D^T x - eta lambda),
    z1 = ReLU(z0 + eta D^T (x - D z0) - eta lambda), x = D z1 (or the square one-step code); ln_f; tied head."""
    x = sd["transformer.wte.weight"][ids] + sd["transformer.wpe.weight"][torch.arange(ids.shape[1])]
    for i in range(L):
        base = f"transformer.h.{i}"
        heads = _tied_attention(_ln(x, sd, f"{base}.prenorm_1", 1e-5), sd[f"{base}.attn.c_attn.weight"], causal=True)
        x = x + heads @ sd[f"{base}.attn.c_proj.weight"].T + sd[f"{base}.attn.c_proj.bias"]
        h = _ln(x, sd, f"{base}.prenorm_2", 1e-5).unsqueeze(-1)
        if overcomplete:
            dic = sd[f"{base}.ista.weight"].T  # D is (d, m)
            z0 = F.relu(ETA * dic.T @ h - ETA * LAM)
            z1 = F.relu(z0 + ETA * dic.T @ (h - dic @ z0) - ETA * LAM)
            x = (dic @ z1).squeeze(-1)
        else:
            dic = sd[f"{base}.ista.weight"]
            x = F.relu(h + ETA * dic.T @ (h - dic @ h) - ETA * LAM).squeeze(-1)
    if overcomplete:
        x = _ln(x, sd, "transformer.ln_f", 1e-5)
    return x @ sd["lm_head.weight"].T


@pytest.mark.parametrize("overcomplete", [True, False])
def test_crate_lm_checkpoint_matches_the_crate_lm_equations(overcomplete):
    checkpoint, sd = _crate_lm_state_dict(overcomplete)
    model = convert_crate_lm(checkpoint)
    cfg = model.config
    assert cfg.block == ("crate-lm" if overcomplete else "crate") and cfg.is_decoder
    assert cfg.ista_dictionary_size == (4 * D if overcomplete else D) and cfg.final_layernorm is overcomplete
    ids = torch.randint(0, V, (2, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(logits, _crate_lm_forward(sd, ids, overcomplete), rtol=1e-5, atol=1e-5)


def test_crate_lm_needs_the_head_count_and_reads_untied_heads():
    checkpoint, sd = _crate_lm_state_dict(True, prefix="")
    with pytest.raises(ValueError, match="num_attention_heads"):
        convert_crate_lm(checkpoint["model"])
    untied = dict(
        checkpoint["model"], **{"lm_head.weight": torch.randn(V, D, generator=torch.Generator().manual_seed(9))}
    )
    model = convert_crate_lm(untied, num_attention_heads=K)
    assert not model.config.tie_word_embeddings
    torch.testing.assert_close(model.lm_head.decoder.weight, untied["lm_head.weight"])
    torch.testing.assert_close(model.crate.embeddings.word_embeddings.weight, sd["transformer.wte.weight"])


def test_convert_official_cli_writes_loadable_text_folders(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    from hf_tdiag.cli import main

    checkpoint, sd = _crate_lm_state_dict(True)
    torch.save(checkpoint, tmp_path / "ckpt.pt")
    assert (
        main(
            [
                "convert-official",
                str(tmp_path / "ckpt.pt"),
                "--preset",
                "crate-lm-12l",
                "--output-dir",
                str(tmp_path / "clm"),
            ]
        )
        == 0
    )
    assert "CrateTextForCausalLM" in capsys.readouterr().out
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(tmp_path / "clm").eval()(input_ids=ids).logits
    torch.testing.assert_close(logits, _crate_lm_forward(sd, ids, True), rtol=1e-5, atol=1e-5)

    pr = _pr_state_dict("masked-lm")
    torch.save(pr, tmp_path / "pr.pt")
    out = str(tmp_path / "mlm")
    assert main(["convert-official", str(tmp_path / "pr.pt"), "--preset", "crate-bert-base", "--output-dir", out]) == 0
    mlm = AutoModelForMaskedLM.from_pretrained(out).eval()
    assert type(mlm).__name__ == "CrateTextForMaskedLM" and mlm.config.num_attention_heads == 12  # the PR's default
    torch.testing.assert_close(mlm.crate.layer[1].ista.weight, pr["crate.encoder.layer.1.output.weight"])
