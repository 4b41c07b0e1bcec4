"""AoT beyond the common model tests: remote code without hf_tdiag (slow run: vision with its processor, language model
with generation), the language model's generation (greedy with left padding against decoding by hand, the static cache,
the cache against full forwards), the presets (aot-digits matched to crate-digits in parameters) and the config's
one-line refusals."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image

from hf_tdiag.models.aot import (
    AotConfig,
    AotForCausalLM,
    AotForImageClassification,
    AotImageProcessor,
    AotTextConfig,
)
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification

_REMOTE = textwrap.dedent(
    """
    import sys
    sys.modules["hf_tdiag"] = None  # any `import hf_tdiag` now fails
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForCausalLM, AutoModelForImageClassification
    vision = AutoModelForImageClassification.from_pretrained("vision", trust_remote_code=True).eval()
    processor = AutoImageProcessor.from_pretrained("vision", trust_remote_code=True)
    lm = AutoModelForCausalLM.from_pretrained("text", trust_remote_code=True).eval()
    for model in (vision, lm):
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    pixels = processor(Image.fromarray(torch.load("image.pt").numpy(), mode="L"), return_tensors="pt").pixel_values
    ids = torch.load("ids.pt")
    with torch.no_grad():
        out = {"logits": vision(pixels).logits, "lm": lm(input_ids=ids, use_cache=False).logits}
    out["generated"] = lm.generate(ids[:1], max_new_tokens=4, do_sample=False)
    torch.save(out, "out.pt")
    """
)


def _lm(attention="mhsa", seed=0) -> AotForCausalLM:
    """A tiny causal AoT with every weight random (std 0.5): next-token choices that differ between positions."""
    config = AotTextConfig(vocab_size=29, max_position_embeddings=16, hidden_size=16, num_hidden_layers=2,
                           num_attention_heads=2, attention=attention, pad_token_id=0)  # fmt: skip
    torch.manual_seed(seed)
    model = AotForCausalLM(config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            gain = "norm" in name and name.endswith("weight")
            param.copy_((1 if gain else 0) + (0.3 if gain else 0.5) * torch.randn(param.shape, generator=g))
    return model


@pytest.mark.slow  # a fresh interpreter importing transformers: 10-20 s on 2 shared cores
def test_remote_code_without_hf_tdiag_gives_identical_outputs(tmp_path):
    vision = AotForImageClassification(AotConfig.from_preset("aot-digits", num_hidden_layers=2, num_labels=3)).eval()
    processor = AotImageProcessor.for_config(vision.config)
    lm = _lm()
    work = tmp_path / "isolated"
    vision.save_pretrained(tmp_path / "vision")
    processor.save_pretrained(tmp_path / "vision")
    lm.save_pretrained(tmp_path / "text")
    for name in ("vision", "text"):
        shutil.copytree(tmp_path / name, work / name)
    assert (work / "text" / "modeling_aot.py").is_file()  # the block, imported by modeling_aot_text.py, goes along
    image = (np.random.default_rng(0).random((8, 8)) * 255).astype(np.uint8)
    ids = torch.tensor([[5, 9, 2, 7, 3], [1, 4, 4, 8, 2]])
    torch.save(torch.from_numpy(image), work / "image.pt")
    torch.save(ids, work / "ids.pt")
    (work / "run.py").write_text(_REMOTE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    proc = subprocess.run([sys.executable, "-I", "run.py"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = torch.load(work / "out.pt", weights_only=True)
    pixels = processor(Image.fromarray(image, mode="L"), return_tensors="pt").pixel_values
    with torch.no_grad():
        torch.testing.assert_close(result["logits"], vision(pixels).logits, rtol=0, atol=1e-6)
        torch.testing.assert_close(result["lm"], lm(input_ids=ids, use_cache=False).logits, rtol=0, atol=1e-6)
    assert torch.equal(result["generated"], lm.generate(ids[:1], max_new_tokens=4, do_sample=False))


PROMPT = torch.tensor([[5, 9, 2, 7], [0, 0, 11, 3]])
PROMPT_MASK = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])


def _greedy_by_hand(model, ids, steps):
    for _ in range(steps):
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
    return ids


@pytest.mark.parametrize("attention", ["mhsa", "mssa"])
def test_greedy_generation_with_left_padding_and_static_cache_equals_decoding_by_hand(attention):
    model = _lm(attention)
    out = model.generate(PROMPT, attention_mask=PROMPT_MASK, max_new_tokens=5, do_sample=False, pad_token_id=0)
    torch.testing.assert_close(out[:1], _greedy_by_hand(model, PROMPT[:1], 5))
    torch.testing.assert_close(out[1:, 2:], _greedy_by_hand(model, PROMPT[1:, 2:], 5))  # padding changes nothing
    assert len(set(out[0, 4:].tolist())) > 1  # not one token repeated: the test can tell orders apart
    static = model.generate(PROMPT, attention_mask=PROMPT_MASK, max_new_tokens=5, do_sample=False, pad_token_id=0,
                            cache_implementation="static")  # fmt: skip
    assert torch.equal(static, out)


def test_incremental_cache_forward_equals_the_full_forward():
    model = _lm("mssa")
    ids = torch.tensor([[3, 8, 1, 6, 2, 9]])
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        first = model(input_ids=ids[:, :4], use_cache=True)
        rest = model(input_ids=ids[:, 4:], past_key_values=first.past_key_values, use_cache=True).logits
    torch.testing.assert_close(torch.cat([first.logits, rest], 1), full, rtol=1e-5, atol=1e-5)


def test_aot_digits_matches_crate_digits_in_parameters_and_shares_its_input():
    aot = AotForImageClassification(AotConfig.from_preset("aot-digits", num_labels=10))
    crate = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10))
    n_aot, n_crate = (sum(p.numel() for p in m.parameters()) for m in (aot, crate))
    assert abs(n_aot - n_crate) / n_crate < 0.01, (n_aot, n_crate)
    a, c = aot.config, crate.config
    assert (a.image_size, a.patch_size, a.hidden_size, a.num_attention_heads) == (
        c.image_size, c.patch_size, c.hidden_size, c.num_attention_heads)  # fmt: skip
    # 6 blocks of LayerNorm + U (64x64) + W_O (64x64 + bias): 6 * (128 + 4096 + 4160)
    blocks = sum(p.numel() for n, p in aot.named_parameters() if ".layer." in n)
    assert blocks == 6 * (128 + 4096 + 4160)


@pytest.mark.parametrize(
    ("cls", "fields", "message"),
    [
        (AotConfig, dict(attention="mlp"), r"AotConfig: attention must be one of \['mssa', 'mhsa'\], got 'mlp'"),
        (AotConfig, dict(mssa_output="W"), r"AotConfig: mssa_output must be one of"),
        (AotConfig, dict(step_size=-1.0), r"AotConfig: step_size must be in \(0.0, inf\), got -1.0"),
        (AotConfig, dict(image_size=10, patch_size=4), r"AotConfig: image_size \(10, 10\) must be divisible"),
        (AotConfig, dict(pooling="max"), r"AotConfig: pooling must be one of"),
        (AotTextConfig, dict(is_decoder=False), r"AotTextConfig: the AoT language model is causal"),
        (AotTextConfig, dict(vocab_size=0), r"AotTextConfig: vocab_size must be a positive int, got 0"),
        (AotTextConfig, dict(hidden_dropout_prob=1.0), r"AotTextConfig: hidden_dropout_prob must be in \[0.0, 1.0\)"),
    ],
)
def test_config_refuses_bad_fields_in_one_line_naming_them(cls, fields, message):
    with pytest.raises(ValueError, match=message) as info:
        cls(**fields)
    assert "\n" not in str(info.value)


def test_from_preset_refuses_unknown_presets_and_keywords():
    with pytest.raises(ValueError, match=r"unknown preset 'aot-huge'; available: \['aot-digits'"):
        AotConfig.from_preset("aot-huge")
    with pytest.raises(TypeError, match=r"AotTextConfig.from_preset: unknown keyword\(s\) \['ista_lambda'\]"):
        AotTextConfig.from_preset("aot-text-tiny", ista_lambda=0.1)
    config = AotTextConfig.from_preset("aot-mssa-gpt2", num_hidden_layers=2)
    assert (config.attention, config.head_dim, config.num_hidden_layers) == ("mssa", 64, 2)
