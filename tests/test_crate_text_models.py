"""Text CRATE: every head through the Auto classes and safetensors, remote code without hf_tdiag, generation with and
without the KV cache, eager = SDPA, causality and padding, the block identities, and a tokenizer trained here."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

import hf_tdiag  # noqa: F401
from hf_tdiag.models.crate_text import CrateTextConfig

pytestmark = pytest.mark.slow

V = 61
AUTOS = {
    "AutoModel": AutoModel,
    "AutoModelForMaskedLM": AutoModelForMaskedLM,
    "AutoModelForCausalLM": AutoModelForCausalLM,
    "AutoModelForSequenceClassification": AutoModelForSequenceClassification,
    "AutoModelForTokenClassification": AutoModelForTokenClassification,
    "AutoModelForQuestionAnswering": AutoModelForQuestionAnswering,
    "AutoModelForMultipleChoice": AutoModelForMultipleChoice,
}


def _config(causal: bool, **kw):
    preset = "crate-lm-12l" if causal else "crate-bert-base"
    sizes = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=48)
    if not causal:
        sizes["ista_dictionary_size"] = 32
    sizes = {"pad_token_id": 0, **sizes, **kw}
    return CrateTextConfig.from_preset(preset, **sizes)


def _inputs(auto: str, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (2, 3, 7) if auto == "AutoModelForMultipleChoice" else (2, 7)
    ids = torch.randint(1, V, shape, generator=gen)
    mask = torch.ones_like(ids)
    mask[..., 1, -2:] = 0 if auto != "AutoModelForMultipleChoice" else 1
    return ids, mask


def _main_output(out):
    for name in ("logits", "start_logits", "last_hidden_state"):
        if getattr(out, name, None) is not None:
            return getattr(out, name)
    raise AssertionError("no output tensor")


@pytest.mark.parametrize("auto", list(AUTOS))
def test_every_head_saves_and_reloads_through_its_auto_class(tmp_path, auto):
    cfg = _config(causal=auto == "AutoModelForCausalLM", num_labels=2 if auto == "AutoModelForQuestionAnswering" else 3)
    model = AUTOS[auto].from_config(cfg).eval()
    model.save_pretrained(tmp_path)
    files = set(os.listdir(tmp_path))
    assert "model.safetensors" in files and "pytorch_model.bin" not in files
    assert {"modeling_crate_text.py", "configuration_crate_text.py"} <= files
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "crate_text" and auto in saved["auto_map"]
    assert isinstance(AutoConfig.from_pretrained(tmp_path), CrateTextConfig)
    reloaded = AUTOS[auto].from_pretrained(tmp_path).eval()
    assert type(reloaded) is type(model)
    ids, mask = _inputs(auto)
    with torch.no_grad():
        before = _main_output(model(input_ids=ids, attention_mask=mask))
        after = _main_output(reloaded(input_ids=ids, attention_mask=mask))
    for (n1, t1), (n2, t2) in zip(model.state_dict().items(), reloaded.state_dict().items()):
        assert n1 == n2 and torch.equal(t1, t2), n1
    # same weights bit for bit; the loaded tensors sit at other memory alignments, which can change the last bits
    # of a float32 GEMM (seen: 3e-10), so the logits are compared at 1e-6
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)


_REMOTE = textwrap.dedent(
    """
    import sys, json
    sys.modules["hf_tdiag"] = None  # any `import hf_tdiag` now fails
    import torch, transformers
    out = {}
    for auto in json.load(open("autos.json")):
        model = getattr(transformers, auto).from_pretrained(auto, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        data = torch.load(auto + ".pt")
        with torch.no_grad():
            res = model(input_ids=data["ids"], attention_mask=data["mask"])
        out[auto] = next(getattr(res, n) for n in ("logits", "start_logits", "last_hidden_state") if getattr(res, n, None) is not None)
        if auto == "AutoModelForCausalLM":
            out["generated"] = model.generate(data["ids"][:1], max_new_tokens=4, do_sample=False)
    torch.save(out, "out.pt")
    print("OK")
    """
)


def test_remote_code_without_hf_tdiag_gives_identical_outputs(tmp_path):
    work = tmp_path / "isolated"
    work.mkdir()
    expected = {}
    for auto, cls in AUTOS.items():
        cfg = _config(auto == "AutoModelForCausalLM", num_labels=2 if auto == "AutoModelForQuestionAnswering" else 3)
        model = cls.from_config(cfg).eval()
        model.save_pretrained(tmp_path / "saved" / auto)
        shutil.copytree(tmp_path / "saved" / auto, work / auto)
        ids, mask = _inputs(auto, seed=3)
        torch.save({"ids": ids, "mask": mask}, work / f"{auto}.pt")
        with torch.no_grad():
            expected[auto] = _main_output(model(input_ids=ids, attention_mask=mask))
            if auto == "AutoModelForCausalLM":
                expected["generated"] = model.generate(ids[:1], max_new_tokens=4, do_sample=False)
    (work / "autos.json").write_text(json.dumps(list(AUTOS)))
    (work / "run.py").write_text(_REMOTE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    proc = subprocess.run(
        [sys.executable, "-I", "run.py"], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = torch.load(work / "out.pt", weights_only=True)
    for key, value in expected.items():
        if key == "generated":
            assert torch.equal(result[key], value)
        else:
            torch.testing.assert_close(result[key], value, rtol=0, atol=1e-6, msg=key)


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_generate_with_cache_equals_generate_without(strategy):
    model = AutoModelForCausalLM.from_config(_config(True)).eval()
    ids = torch.randint(1, V, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0  # left padding
    kwargs = {"greedy": dict(do_sample=False), "sample": dict(do_sample=True, top_k=20, temperature=0.9),
              "beam": dict(do_sample=False, num_beams=3)}[strategy]  # fmt: skip
    outs = []
    for use_cache in (True, False):
        torch.manual_seed(7)
        outs.append(
            model.generate(ids, attention_mask=mask, max_new_tokens=8, use_cache=use_cache, pad_token_id=0, **kwargs)
        )
    assert outs[0].shape == (2, 14)
    assert torch.equal(outs[0], outs[1])


def test_incremental_cache_forward_equals_the_full_forward():
    model = AutoModelForCausalLM.from_config(_config(True)).eval()
    ids = torch.randint(1, V, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        first = model(input_ids=ids[:, :5], use_cache=True)
        cache = first.cache
        steps = [first.logits]
        for t in range(5, 9):
            step = model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = step.cache
            steps.append(step.logits)
    assert cache.get_seq_length() == 9
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_eager_equals_sdpa_with_padding(tmp_path, causal):
    model = (
        AutoModelForCausalLM.from_config(_config(True)) if causal else AutoModelForMaskedLM.from_config(_config(False))
    )
    model.save_pretrained(tmp_path)
    auto = AutoModelForCausalLM if causal else AutoModelForMaskedLM
    eager = auto.from_pretrained(tmp_path, attn_implementation="eager").eval()
    sdpa = auto.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    ids, mask = _inputs("x", seed=4)
    with torch.no_grad():
        a = eager(input_ids=ids, attention_mask=mask).logits
        b = sdpa(input_ids=ids, attention_mask=mask).logits
        probs = sdpa(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    keep = mask.bool()
    torch.testing.assert_close(a[keep], b[keep], rtol=1e-5, atol=1e-5)
    assert len(probs) == 2 and probs[0].shape == (2, 4, 7, 7)
    torch.testing.assert_close(probs[0].sum(-1), torch.ones(2, 4, 7))
    assert float(probs[0][1, :, :, -2:].abs().max()) == 0.0  # padded keys get no weight
    if causal:
        assert float(probs[0][0].triu(1).abs().max()) == 0.0  # no weight on future tokens


def test_causality_and_padding_are_respected():
    clm = AutoModelForCausalLM.from_config(_config(True)).eval()
    ids = torch.randint(1, V, (1, 8), generator=torch.Generator().manual_seed(5))
    changed = ids.clone()
    changed[0, 5:] = (changed[0, 5:] + 1) % V
    mlm = AutoModelForMaskedLM.from_config(_config(False)).eval()
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 8), torch.zeros(1, 3)], dim=1).long()
    with torch.no_grad():
        torch.testing.assert_close(clm(input_ids=ids).logits[:, :5], clm(input_ids=changed).logits[:, :5])
        assert not torch.allclose(mlm(input_ids=ids).logits[:, :5], mlm(input_ids=changed).logits[:, :5])
        torch.testing.assert_close(
            mlm(input_ids=padded, attention_mask=mask).logits[:, :8], mlm(input_ids=ids).logits, rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("causal", [True, False])
def test_block_states_follow_the_block_equations(causal):
    model = AutoModel.from_config(_config(causal)).eval()
    ids = torch.randint(1, V, (2, 7), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, output_mid_hidden_states=True)
    assert len(out.hidden_states) == 3 and len(out.mid_hidden_states) == 2
    for i, layer in enumerate(model.layer):
        with torch.no_grad():
            ista_out = layer.ista(layer.layernorm_after(out.mid_hidden_states[i]))
        torch.testing.assert_close(out.hidden_states[i + 1], ista_out)
    code = model.layer[0].ista.sparse_code(model.layer[0].layernorm_after(out.mid_hidden_states[0]))
    assert code.shape[-1] == (4 * 32 if causal else 32) and float(code.detach().min()) >= 0.0
    if causal:  # final LayerNorm of CRATE-LM on top of the last block output
        torch.testing.assert_close(out.last_hidden_state, model.final_layernorm(out.hidden_states[-1]))


def test_config_validation_and_head_requirements():
    with pytest.raises(ValueError, match="square dictionary"):
        CrateTextConfig(block="crate", hidden_size=32, num_attention_heads=4, ista_dictionary_size=64)
    with pytest.raises(ValueError, match="block must be one of"):
        CrateTextConfig(block="mlp")
    with pytest.raises(ValueError, match="is_decoder=True"):
        AutoModelForCausalLM.from_config(_config(False))
    with pytest.raises(ValueError, match="is_decoder=False"):
        AutoModelForMaskedLM.from_config(_config(True))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        AutoModel.from_config(_config(True))(input_ids=torch.ones(1, 60, dtype=torch.long))


def test_tokenizer_trained_here_round_trips_with_the_model(tmp_path):
    import pydoc_data.topics

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    texts = list(pydoc_data.topics.topics.values())[:40]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<unk>", "<eos>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")
    cfg = _config(
        True, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    model = AutoModelForCausalLM.from_config(cfg).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    batch = loaded(["The with statement", "Lambdas"], return_tensors="pt", padding=True)
    assert int(batch.input_ids.max()) < cfg.vocab_size
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, reloaded(**batch).logits, rtol=0, atol=1e-6)
