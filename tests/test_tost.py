"""ToST: TSSA against its equations and the gradient of the variational compression objective, the causal form
against prefixes, the whole model against a functional forward written from the authors' layout, save/reload."""

import math
import os

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForImageClassification

import hf_tdiag  # noqa: F401
from hf_tdiag.models.tost import TostConfig, TostForImageClassification, token_statistics_attention


def _tssa_by_loops(w, tau):
    """TSSA per head k, coordinate i and token n, written out from the equations (float64)."""
    B, K, N, p = w.shape
    out = torch.zeros_like(w)
    pi = torch.zeros(B, K, N, dtype=w.dtype)
    for b in range(B):
        score = torch.zeros(K, N, dtype=w.dtype)
        for k in range(K):
            for n in range(N):
                score[k, n] = tau[k] * sum(w[b, k, n, i] ** 2 / (w[b, k, :, i] ** 2).sum() for i in range(p))
        for n in range(N):
            pi[b, :, n] = torch.exp(score[:, n]) / torch.exp(score[:, n]).sum()
        for k in range(K):
            s = (pi[b, k, :, None] * w[b, k] ** 2).sum(0) / pi[b, k].sum()
            out[b, k] = -pi[b, k, :, None] * w[b, k] / (1 + s)
    return out, pi


def _variational_rc(w, pi):
    """R_c^var = ½ Σ_k (n_k/N) Σ_i log(1 + Σ_n Π_k(n) w_ki(n)² / n_k), n_k = Σ_n Π_k(n)."""
    nk = pi.sum(-1)
    second = (pi.unsqueeze(-1) * w**2).sum(-2) / nk.unsqueeze(-1)
    return 0.5 * ((nk / w.shape[-2]) * torch.log1p(second).sum(-1)).sum(-1)


def test_tssa_matches_its_equations_and_is_minus_n_times_the_objective_gradient():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2, 3, 7, 4, generator=g, dtype=torch.float64)
    tau = 0.5 + torch.rand(3, 1, generator=g, dtype=torch.float64)
    out, pi = token_statistics_attention(w, tau)
    ref_out, ref_pi = _tssa_by_loops(w, tau[:, 0])
    torch.testing.assert_close(pi, ref_pi, rtol=1e-7, atol=1e-7)
    torch.testing.assert_close(out, ref_out, rtol=1e-7, atol=1e-7)
    assert torch.allclose(pi.sum(1), torch.ones(2, 7, dtype=torch.float64))  # a membership over the heads
    wg = w.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(_variational_rc(wg, pi.detach()).sum(), wg)
    torch.testing.assert_close(out, -w.shape[-2] * grad, rtol=1e-6, atol=1e-9)


def test_causal_tssa_uses_only_each_prefix():
    """Token t's membership is the full TSSA membership of the prefix 0..t at t; its second moment averages
    w(n)² over n <= t with those memberships."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(1, 2, 6, 3, generator=g, dtype=torch.float64)
    tau = torch.ones(2, 1, dtype=torch.float64)
    causal, pi_causal = token_statistics_attention(w, tau, causal=True)
    pi_prefix = torch.stack([token_statistics_attention(w[:, :, : t + 1], tau)[1][:, :, t] for t in range(6)], -1)
    torch.testing.assert_close(pi_causal, pi_prefix, rtol=1e-9, atol=1e-12)
    for t in range(6):
        weights = pi_prefix[:, :, : t + 1, None]
        second = (weights * w[:, :, : t + 1] ** 2).sum(2) / weights.sum(2)
        expected = -pi_prefix[:, :, t, None] * w[:, :, t] / (1 + second)
        torch.testing.assert_close(causal[:, :, t], expected, rtol=1e-7, atol=1e-10)
    # changing a later token leaves every earlier output unchanged
    w2 = w.clone()
    w2[:, :, 4:] += 1.0
    torch.testing.assert_close(token_statistics_attention(w2, tau, causal=True)[0][:, :, :4], causal[:, :, :4])


def _randomized(config):
    torch.manual_seed(0)
    model = TostForImageClassification(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "gamma" in name or name.endswith("temp"):
                param.uniform_(0.5, 1.5)
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.3)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.3)
    return model


def _fourier(sd, B, H, W, hidden=32):
    y = torch.arange(1, H + 1, dtype=torch.float64)[:, None].expand(H, W) / (H + 1e-6) * 2 * math.pi
    x = torch.arange(1, W + 1, dtype=torch.float64)[None, :].expand(H, W) / (W + 1e-6) * 2 * math.pi
    feats = []
    for grid in (y, x):
        for j in range(hidden):
            freq = 10000.0 ** (2 * (j // 2) / hidden)
            feats.append(torch.sin(grid / freq) if j % 2 == 0 else torch.cos(grid / freq))
    pos = torch.stack(feats, 0).reshape(2 * hidden, H * W)  # (64, HW), channel order y then x
    wgt, bias = sd["tost.position_encoding.token_projection.weight"], sd["tost.position_encoding.token_projection.bias"]
    return (wgt[:, :, 0, 0] @ pos + bias[:, None]).T.expand(B, -1, -1)


def _functional_forward(sd, img, cfg):
    """The authors' forward (tost_vision/tost.py, tokens_norm=True, eval BatchNorm) in functional ops, float64."""
    sd = {k: v.double() for k, v in sd.items()}
    x = img.double()
    ln = lambda t, p: F.layer_norm(t, t.shape[-1:], sd[p + ".weight"], sd[p + ".bias"], 1e-6)  # noqa: E731
    stages = int(math.log2(cfg.patch_size))
    for i in range(stages):
        p = f"tost.patch_embeddings.proj.{2 * i}"
        x = F.conv2d(x, sd[p + ".0.weight"], stride=2, padding=1)
        mean, var = sd[p + ".1.running_mean"], sd[p + ".1.running_var"]
        x = (x - mean[:, None, None]) / torch.sqrt(var[:, None, None] + 1e-5) * sd[p + ".1.weight"][:, None, None]
        x = x + sd[p + ".1.bias"][:, None, None]
        x = F.gelu(x) if i < stages - 1 else x
    B, d, H, W = x.shape
    z = x.flatten(2).transpose(1, 2) + _fourier(sd, B, H, W)
    K, p_ = cfg.num_attention_heads, d // cfg.num_attention_heads
    for layer in range(cfg.num_hidden_layers):
        pre = f"tost.layer.{layer}"
        w = F.linear(
            ln(z, pre + ".layernorm_before"), sd[pre + ".attention.qkv.weight"], sd[pre + ".attention.qkv.bias"]
        )
        w = w.reshape(B, -1, K, p_).permute(0, 2, 1, 3)
        heads, _ = _tssa_by_loops(w, sd[pre + ".attention.temp"][:, 0])
        attn = F.linear(heads.permute(0, 2, 1, 3).reshape(B, -1, d), sd[pre + ".attention.out_proj.weight"],
                        sd[pre + ".attention.out_proj.bias"])  # fmt: skip
        z = z + sd[pre + ".gamma1"] * attn
        h = F.gelu(F.linear(ln(z, pre + ".layernorm_after"), sd[pre + ".mlp.fc1.weight"], sd[pre + ".mlp.fc1.bias"]))
        z = z + sd[pre + ".gamma2"] * F.linear(h, sd[pre + ".mlp.fc2.weight"], sd[pre + ".mlp.fc2.bias"])
    z = torch.cat([sd["tost.cls_token"].expand(B, -1, -1), z], 1)
    for c in range(cfg.num_class_attention_layers):
        pre = f"tost.class_attention.{c}"
        normed = ln(z, pre + ".norm1")
        qkv = F.linear(normed, sd[pre + ".attn.qkv.weight"], sd[pre + ".attn.qkv.bias"])
        q, k, v = qkv.reshape(B, -1, 3, K, p_).permute(2, 0, 3, 1, 4)
        a = torch.softmax((q[:, :, :1] * k).sum(-1) * p_**-0.5, -1)
        cls = (a.unsqueeze(2) @ v).transpose(1, 2).reshape(B, 1, d)
        cls = F.linear(cls, sd[pre + ".attn.proj.weight"], sd[pre + ".attn.proj.bias"])
        z = ln(z + sd[pre + ".gamma1"] * torch.cat([cls, normed[:, 1:]], 1), pre + ".norm2")  # ClassAttention's x
        m = F.gelu(F.linear(z[:, :1], sd[pre + ".mlp.fc1.weight"], sd[pre + ".mlp.fc1.bias"]))
        m = sd[pre + ".gamma2"] * F.linear(m, sd[pre + ".mlp.fc2.weight"], sd[pre + ".mlp.fc2.bias"])
        z = z + torch.cat([m, z[:, 1:]], 1)
    return F.linear(ln(z, "tost.layernorm")[:, 0], sd["classifier.weight"], sd["classifier.bias"])


def _small(**kw):
    fields = dict(image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2,
                  num_attention_heads=2, num_class_attention_layers=2, num_labels=5)  # fmt: skip
    return TostConfig(**{**fields, **kw})


def test_model_matches_a_functional_forward_of_the_authors_layout():
    cfg = _small()
    model = _randomized(cfg)
    img = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    reference = _functional_forward(model.state_dict(), img, cfg)
    with torch.no_grad():
        ours = model(img).logits
        exact = model.double()(img.double()).logits
    model.float()
    torch.testing.assert_close(exact, reference, rtol=1e-9, atol=1e-9)  # the same function
    torch.testing.assert_close(ours.double(), reference, rtol=1e-4, atol=1e-4)  # float32 round-off
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        torch.testing.assert_close(model(img).logits, ours, rtol=1e-5, atol=1e-5)


def test_presets_and_validation():
    small = TostConfig.from_preset("tost-small-12-p16")
    assert (small.hidden_size, small.num_hidden_layers, small.num_attention_heads, small.head_dim) == (384, 12, 8, 48)
    assert TostConfig.from_preset("tost-large-24-p8").layer_scale_init_value == 1e-5 and small.qkv_bias
    with pytest.raises(ValueError, match="power of two"):
        _small(patch_size=3, image_size=9)
    with pytest.raises(ValueError, match="multiple of num_attention_heads"):
        _small(num_attention_heads=3)


def test_save_reload_identical_logits(tmp_path):
    model = _randomized(TostConfig.from_preset("tost-digits", num_labels=10))
    model.save_pretrained(tmp_path / "saved")
    assert {"model.safetensors", "modeling_tost.py", "configuration_tost.py"} <= set(os.listdir(tmp_path / "saved"))
    reloaded = AutoModelForImageClassification.from_pretrained(tmp_path / "saved").eval()
    assert isinstance(reloaded, TostForImageClassification)
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        expected = model(x).logits
        assert torch.equal(reloaded(x).logits, expected)


def test_class_attention_maps_come_from_the_eager_path_and_match_sdpa():
    """Attention maps asked of an sdpa model: the class attention runs on the eager path, its CLS query's softmax
    over every token written out here; the eager model's logits are the sdpa model's."""
    model = _randomized(_small())
    model.set_attn_implementation("sdpa")
    img = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        out = model(img, output_attentions=True)
        block = model.tost.class_attention[0]
        tokens = model.tost.embed(img)
        for layer in model.tost.layer:
            tokens = layer(tokens)[0]
        z = torch.cat([model.tost.cls_token.expand(2, -1, -1), tokens], 1)
        q, k, _ = block.attn.qkv(block.norm1(z)).reshape(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
        expected = torch.softmax(q[:, :, :1] @ k.transpose(-1, -2) / 8**0.5, -1)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 2, 1, 5)
    torch.testing.assert_close(out.attentions[0], expected, rtol=1e-5, atol=1e-6)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        torch.testing.assert_close(model(img).logits, out.logits, rtol=1e-5, atol=1e-5)


def test_eval_ignores_the_attention_dropout():
    dropped = _randomized(_small(attention_probs_dropout_prob=0.5, hidden_dropout_prob=0.5))
    plain = _randomized(_small())
    plain.load_state_dict(dropped.state_dict())
    img = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(dropped(img).logits, plain.eval()(img).logits, rtol=0, atol=0)
