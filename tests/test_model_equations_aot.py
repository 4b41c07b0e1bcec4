"""AoT's forward against an independent float64 forward written from the block equation
``Z^{l+1} = Z^l + eta * Attn(LN(Z^l))`` with loops over heads and patches (no module of the model is called): the
vision model (MSSA with a learned or the subspace output ``U``, MHSA, CLS or mean pooling) and the causal language
model (MHSA and MSSA, each position attending to itself and the past only)."""

from __future__ import annotations

import math

import pytest
import torch

from hf_tdiag.models.aot import AotConfig, AotForCausalLM, AotForImageClassification, AotTextConfig


def _ln(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def _softmax_rows(s):
    e = torch.exp(s - s.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def _attention(sd, prefix, x, config, causal):
    """``Attn(x)`` for one sequence ``x`` (N, d): heads one by one, then the output matrix."""
    K, p = config.num_attention_heads, config.head_dim
    n = x.shape[0]
    blocked = torch.triu(torch.ones(n, n, dtype=torch.bool), 1) if causal else torch.zeros(n, n, dtype=torch.bool)
    heads = []
    for k in range(K):
        rows = slice(k * p, (k + 1) * p)
        if config.attention == "mssa":
            U_k = sd[f"{prefix}.qkv.weight"][rows].T  # (d, p)
            q = kk = v = x @ U_k
        else:
            q, kk, v = (
                x @ sd[f"{prefix}.{name}.weight"][rows].T + sd.get(f"{prefix}.{name}.bias", torch.zeros(K * p))[rows]
                for name in ("q_proj", "k_proj", "v_proj")
            )
        scores = (q @ kk.T / math.sqrt(p)).masked_fill(blocked, -math.inf)
        heads.append(_softmax_rows(scores) @ v)
    if config.attention == "mssa" and config.mssa_output == "subspace":  # sum_k U_k (head_k)
        return sum(h @ sd[f"{prefix}.qkv.weight"][k * p : (k + 1) * p] for k, h in enumerate(heads))
    return torch.cat(heads, -1) @ sd[f"{prefix}.out_proj.weight"].T + sd[f"{prefix}.out_proj.bias"]


def _blocks(sd, prefix, z, config, causal):
    states = [z]
    for layer in range(config.num_hidden_layers):
        at = f"{prefix}.layer.{layer}"
        normed = _ln(z, sd[f"{at}.layernorm_before.weight"], sd[f"{at}.layernorm_before.bias"], config.layer_norm_eps)
        z = z + config.step_size * _attention(sd, f"{at}.attention", normed, config, causal)
        states.append(z)
    return states


def _vision_reference(model, pixels):
    config, sd = model.config, {k: v.double() for k, v in model.state_dict().items()}
    eps, (ph, pw) = config.layer_norm_eps, (config.patch_size, config.patch_size)
    logits, all_states = [], []
    for image in pixels.double():
        c, h, w = image.shape
        patches = []
        for i in range(h // ph):
            for j in range(w // pw):
                block = image[:, i * ph : (i + 1) * ph, j * pw : (j + 1) * pw]  # (c, ph, pw) -> (ph, pw, c) flat
                patches.append(block.permute(1, 2, 0).reshape(-1))
        x = torch.stack(patches)
        e = "aot.embeddings.patch_embeddings"
        x = _ln(x, sd[f"{e}.norm_in.weight"], sd[f"{e}.norm_in.bias"], eps)
        x = _ln(x @ sd[f"{e}.projection.weight"].T + sd[f"{e}.projection.bias"], sd[f"{e}.norm_out.weight"],
                sd[f"{e}.norm_out.bias"], eps)  # fmt: skip
        z = torch.cat([sd["aot.embeddings.cls_token"][0], x]) + sd["aot.embeddings.position_embeddings"][0]
        states = _blocks(sd, "aot", z, config, causal=False)
        pooled = states[-1][0] if config.pooling == "cls" else states[-1].mean(0)
        pooled = _ln(pooled, sd["classifier_norm.weight"], sd["classifier_norm.bias"], eps)
        logits.append(pooled @ sd["classifier.weight"].T + sd["classifier.bias"])
        all_states.append(torch.stack(states))
    return torch.stack(logits), torch.stack(all_states, 1)


def _randomised(model, seed=0):
    """Every weight random (std 0.3, LayerNorm gains about 1): the 0.02-std initialisation makes each update tiny."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            gain = "norm" in name and name.endswith("weight")
            param.copy_((1.0 if gain else 0.0) + 0.3 * torch.randn(param.shape, generator=g))
    return model.eval()


VISION = {
    "mssa-learned": {},
    "mssa-subspace-step": dict(mssa_output="subspace", step_size=0.5),
    "mhsa-bias-mean": dict(attention="mhsa", attention_bias=True, pooling="mean"),
    "rectangular": dict(image_size=(8, 12)),  # a 2x3 patch grid: height and width are not interchangeable
}


@pytest.mark.parametrize("name", VISION)
def test_vision_forward_equals_the_block_equations(name):
    fields = {"image_size": 8, **VISION[name]}
    config = AotConfig(patch_size=4, num_channels=2, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
                       num_labels=4, **fields)  # fmt: skip
    torch.manual_seed(0)
    model = _randomised(AotForImageClassification(config))
    height, width = (fields["image_size"],) * 2 if isinstance(fields["image_size"], int) else fields["image_size"]
    pixels = torch.randn(2, 2, height, width, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(pixels, output_hidden_states=True)
    logits, states = _vision_reference(model, pixels)
    torch.testing.assert_close(out.logits.double(), logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.stack(out.hidden_states).double(), states, rtol=1e-5, atol=1e-5)
    # the blocks moved the tokens: a reference without the attention updates would not pass
    assert float((states[-1] - states[0]).abs().max()) > 0.1


@pytest.mark.parametrize("attention", ["mhsa", "mssa"])
def test_causal_lm_logits_equal_the_block_equations_and_ignore_the_future(attention):
    config = AotTextConfig(vocab_size=23, max_position_embeddings=12, hidden_size=12, num_hidden_layers=2,
                           num_attention_heads=3, attention=attention, step_size=0.7)  # fmt: skip
    torch.manual_seed(0)
    model = _randomised(AotForCausalLM(config))
    ids = torch.randint(0, 23, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False, output_hidden_states=True)
    sd = {k: v.double() for k, v in model.state_dict().items()}
    embed = sd["aot.embeddings.word_embeddings.weight"]
    for row in range(2):
        z = embed[ids[row]] + sd["aot.embeddings.position_embeddings.weight"][:7]
        states = _blocks(sd, "aot", z, config, causal=True)
        final = _ln(states[-1], sd["aot.final_layernorm.weight"], sd["aot.final_layernorm.bias"], 1e-5)
        torch.testing.assert_close(out.logits[row].double(), final @ embed.T, rtol=1e-5, atol=1e-5)  # tied head
        for got, want in zip(out.hidden_states, states):
            torch.testing.assert_close(got[row].double(), want, rtol=1e-5, atol=1e-5)
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 23
    with torch.no_grad():
        again = model(input_ids=changed, use_cache=False).logits
    torch.testing.assert_close(again[:, :5], out.logits[:, :5])  # positions before the change see no future token
    assert not torch.allclose(again[:, 5:], out.logits[:, 5:])


def test_the_subspace_output_is_the_sum_of_projections_onto_each_subspace():
    """With ``mssa_output="subspace"`` the attention update of one head lies in the span of its ``U_k``: with one head
    per coordinate block (``U`` a permutation of I), each head's update touches its own coordinates only."""
    config = AotConfig(image_size=4, patch_size=2, num_channels=1, hidden_size=6, num_hidden_layers=1,
                       num_attention_heads=2, mssa_output="subspace", num_labels=2)  # fmt: skip
    model = AotForImageClassification(config).eval()
    attention = model.aot.layer[0].attention
    with torch.no_grad():
        attention.qkv.weight.copy_(torch.eye(6)[[0, 1, 2, 3, 4, 5]])
        attention.qkv.weight[:3] *= 0  # head 1's subspace (coordinates 0..2) silenced: U_1 = 0
    x = torch.randn(1, 5, 6)
    with torch.no_grad():
        update, _ = attention(x)
    assert float(update[..., :3].abs().max()) == 0.0 and float(update[..., 3:].abs().max()) > 0
    bases = attention.subspace_bases()
    assert bases.shape == (2, 6, 3)
    torch.testing.assert_close(bases[1], torch.eye(6)[:, 3:])
