"""CRATE blocks against hand-written references of the formulas (column form, as in the paper)."""

import pytest
import torch
import torch.nn.functional as F

import hf_tdiag  # noqa: F401
from hf_tdiag import CrateConfig, CrateForImageClassification, CrateModel

VARIANTS = ["crate", "crate-c", "crate-n", "crate-t", "crate-fix", "crate-identity"]


def _tiny(variant="crate", **kw):
    fields = dict(
        image_size=8,
        patch_size=2,
        num_channels=3,
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=3,
        variant=variant,
        num_labels=5,
    )
    fields.update(kw)
    return CrateConfig(**fields)


def _randomize(model, seed=0):
    """Give every parameter (LayerNorm affine included) and the fixed buffer non-trivial random values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            tensor.copy_(0.3 * torch.randn(tensor.shape, generator=g, dtype=tensor.dtype))
            if "norm" in name and name.endswith("weight"):
                tensor.add_(1.0)
    return model


def _layernorm_columns(z, weight, bias, eps):
    """LayerNorm of each column (token) of Z (d x N)."""
    mu = z.mean(0, keepdim=True)
    var = ((z - mu) ** 2).mean(0, keepdim=True)
    return (z - mu) / torch.sqrt(var + eps) * weight[:, None] + bias[:, None]


def _reference_block(layer, Z, cfg):
    """Z (d x N): Z_half = Z + M [SSA_1; ...; SSA_K] (+b), Z_plus = ReLU(y + eta D^T (y - D y) - eta lambda), y = LN2(Z_half)."""
    d, K, p = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    ln1, ln2 = layer.layernorm_before, layer.layernorm_after
    X = _layernorm_columns(Z, ln1.weight, ln1.bias, ln1.eps)
    Wqkv = layer.attention.qkv.weight  # (K p, d)
    U_list = [Wqkv[k * p : (k + 1) * p].T for k in range(K)]  # each d x p
    heads = []
    for U_k in U_list:
        A = U_k.T @ X  # p x N
        logits = (A.T @ A) / p**0.5  # N x N, symmetric
        P = torch.softmax(logits, dim=0)  # column j: distribution over source tokens i
        heads.append(A @ P)  # p x N
    H = torch.cat(heads, 0)  # Kp x N
    U = torch.cat(U_list, 1)  # d x Kp
    bias = torch.zeros(d, dtype=Z.dtype)
    if cfg.variant == "crate":
        M, bias = layer.attention.out_proj.weight, layer.attention.out_proj.bias
    elif cfg.variant == "crate-c":
        M = U
    elif cfg.variant == "crate-n":
        M = -U
    elif cfg.variant == "crate-t":
        M = U.T
    elif cfg.variant == "crate-fix":
        M = layer.attention.fixed_output
    else:
        M = torch.eye(d, dtype=Z.dtype)
    Z_half = Z + M @ H + bias[:, None]
    Y = _layernorm_columns(Z_half, ln2.weight, ln2.bias, ln2.eps)
    D = layer.ista.weight
    eta, lam = cfg.ista_step_size, cfg.ista_lambda
    Z_plus = torch.relu(Y + eta * D.T @ (Y - D @ Y) - eta * lam)
    return Z_half, Z_plus


@pytest.mark.parametrize("variant", VARIANTS)
def test_block_matches_formula(variant):
    cfg = _tiny(variant, ista_step_size=0.3, ista_lambda=0.05)
    model = _randomize(CrateModel(cfg)).double().eval()
    layer = model.encoder.layer[0]
    tokens = torch.randn(2, 7, cfg.hidden_size, dtype=torch.float64)
    out, mid = layer(tokens)
    for b in range(2):
        Z_half, Z_plus = _reference_block(layer, tokens[b].T, cfg)
        torch.testing.assert_close(mid[b], Z_half.T)
        torch.testing.assert_close(out[b], Z_plus.T)


@pytest.mark.parametrize("variant", VARIANTS)
def test_output_matrix_semantics(variant):
    cfg = _tiny(variant)
    attn = _randomize(CrateModel(cfg)).encoder.layer[0].attention
    Wqkv = attn.qkv.weight.detach()
    U = torch.cat([Wqkv[k * cfg.head_dim : (k + 1) * cfg.head_dim].T for k in range(cfg.num_attention_heads)], 1)
    expected = {
        "crate": lambda: attn.out_proj.weight,
        "crate-c": lambda: U,
        "crate-n": lambda: -U,
        "crate-t": lambda: U.T,
        "crate-fix": lambda: attn.fixed_output,
        "crate-identity": lambda: torch.eye(cfg.hidden_size),
    }[variant]()
    M = attn.output_matrix()
    assert M.shape == (cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim)
    torch.testing.assert_close(M.detach(), expected.detach())
    has_out = any(n.startswith("out_proj") for n, _ in attn.named_parameters())
    assert has_out == (variant == "crate")


def test_crate_fix_matrix_is_saved_buffer_and_not_trained():
    cfg = _tiny("crate-fix")
    model = CrateForImageClassification(cfg)
    attn = model.crate.encoder.layer[0].attention
    assert "crate.encoder.layer.0.attention.fixed_output" in model.state_dict()
    assert all("fixed_output" not in n for n, _ in model.named_parameters())
    assert attn.fixed_output.abs().sum() > 0  # initialized to a random matrix, not left at zero
    out = model(torch.randn(2, 3, 8, 8), labels=torch.tensor([0, 1]))
    out.loss.backward()
    assert attn.fixed_output.grad is None
    assert attn.qkv.weight.grad is not None


def test_crate_c_update_lies_in_span_of_U():
    """crate-c: Z_half - Z = U [SSA_1; ...; SSA_K] lies in the column span of U = [U_1 ... U_K] (rank <= Kp < d)."""
    cfg = _tiny("crate-c", head_dim=4)  # K p = 12 < d = 24
    layer = _randomize(CrateModel(cfg)).encoder.layer[0].double()
    tokens = torch.randn(1, 30, cfg.hidden_size, dtype=torch.float64)
    _, mid = layer(tokens)
    delta = (mid - tokens)[0].T  # d x N
    U = layer.attention.qkv.weight.detach().T  # d x Kp
    proj = U @ torch.linalg.lstsq(U, delta).solution
    torch.testing.assert_close(proj, delta)
    assert torch.linalg.matrix_rank(delta) == 12


@pytest.mark.parametrize("variant", ["crate", "crate-t"])
def test_sdpa_and_eager_agree(variant):
    cfg = _tiny(variant)
    model = _randomize(CrateForImageClassification(cfg)).eval()
    assert model.config._attn_implementation == "sdpa"
    x = torch.randn(3, 3, 8, 8)
    sdpa = model(x, output_hidden_states=True, output_mid_hidden_states=True)
    assert sdpa.attentions is None
    model.set_attn_implementation("eager")
    eager = model(x, output_hidden_states=True, output_mid_hidden_states=True, output_attentions=True)
    torch.testing.assert_close(sdpa.logits, eager.logits, rtol=1e-5, atol=1e-5)
    for a, b in zip(sdpa.hidden_states + sdpa.mid_hidden_states, eager.hidden_states + eager.mid_hidden_states):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # the returned map is the softmax of the scaled Gram of U_k^T LN1(Z)
    layer = model.crate.encoder.layer[1]
    w = layer.attention.qkv(layer.layernorm_before(eager.hidden_states[1]))
    w = w.view(3, -1, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
    ref = torch.softmax(w @ w.transpose(-1, -2) / cfg.head_dim**0.5, dim=-1)
    torch.testing.assert_close(eager.attentions[1], ref)


def _flex_attention_runs_here() -> bool:
    try:
        from torch.nn.attention.flex_attention import flex_attention

        q = torch.randn(1, 1, 4, 4)
        flex_attention(q, q, q)
        return True
    except Exception:  # this torch build has no CPU flex attention
        return False


@pytest.mark.parametrize(
    "impl", ["sdpa", pytest.param("flex_attention", marks=pytest.mark.slow)]
)  # flex: compiles, ~30 s
@pytest.mark.parametrize("variant", ["crate", "crate-t", "crate-n"])
def test_attention_implementations_agree(variant, impl):
    """sdpa and (where this torch runs it on CPU) flex_attention give eager's outputs, float32, 1e-5."""
    if impl == "flex_attention" and not _flex_attention_runs_here():
        pytest.skip("this torch build has no CPU flex attention")
    cfg = _tiny(variant)
    torch.manual_seed(0)
    base = _randomize(CrateForImageClassification(cfg)).eval()
    x = torch.randn(3, 3, 8, 8)
    outputs = {}
    for name in ("eager", impl):
        base.set_attn_implementation(name)
        assert base.config._attn_implementation == name
        with torch.no_grad():
            outputs[name] = base(x, output_hidden_states=True, output_mid_hidden_states=True)
    ref, out = outputs["eager"], outputs[impl]
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)
    for a, b in zip(out.hidden_states + out.mid_hidden_states, ref.hidden_states + ref.mid_hidden_states):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_recorded_states_are_block_inputs_and_outputs():
    """hidden_states = (Z^0, Z^1, ..., Z^L) and mid_hidden_states = (Z^{1/2}, ...), recorded by forward hooks."""
    cfg = _tiny()
    model = _randomize(CrateModel(cfg)).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        out = model(x, output_hidden_states=True, output_mid_hidden_states=True)
        z = model.embeddings(x)
        assert len(out.hidden_states) == cfg.num_hidden_layers + 1
        assert len(out.mid_hidden_states) == cfg.num_hidden_layers
        torch.testing.assert_close(out.hidden_states[0], z)
        for i, layer in enumerate(model.encoder.layer):
            z_next, mid = layer(z)
            torch.testing.assert_close(out.mid_hidden_states[i], mid)
            torch.testing.assert_close(out.hidden_states[i + 1], z_next)
            z = z_next
        torch.testing.assert_close(out.last_hidden_state, z)
        as_tuple = model(x, output_hidden_states=True, return_dict=False)
    torch.testing.assert_close(as_tuple[0], out.last_hidden_state)


def test_output_attentions_on_sdpa_model_uses_eager_math():
    cfg = _tiny()
    model = _randomize(CrateForImageClassification(cfg)).eval()
    x = torch.randn(2, 3, 8, 8)
    plain = model(x)
    with_maps = model(x, output_attentions=True)
    assert len(with_maps.attentions) == cfg.num_hidden_layers
    torch.testing.assert_close(plain.logits, with_maps.logits, rtol=1e-5, atol=1e-5)


def test_mean_pooling_and_cls_pooling():
    x = torch.randn(2, 3, 8, 8)
    for pooling in ("cls", "mean"):
        model = _randomize(CrateModel(_tiny(pooling=pooling))).eval()
        out = model(x)
        expected = out.last_hidden_state[:, 0] if pooling == "cls" else out.last_hidden_state.mean(1)
        torch.testing.assert_close(out.pooler_output, expected)


def test_patch_embedding_is_channel_last_flattening():
    cfg = _tiny(num_hidden_layers=1)
    model = _randomize(CrateModel(cfg)).double()
    pe = model.embeddings.patch_embeddings
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    rows = []
    for i in range(4):
        for j in range(4):
            patch = x[0, :, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2]  # c, p1, p2
            rows.append(patch.permute(1, 2, 0).reshape(-1))  # (p1 p2 c)
    flat = torch.stack(rows)[None]
    ref = F.layer_norm(flat, (12,), pe.norm_in.weight, pe.norm_in.bias, pe.norm_in.eps)
    ref = F.layer_norm(pe.projection(ref), (24,), pe.norm_out.weight, pe.norm_out.bias, pe.norm_out.eps)
    torch.testing.assert_close(pe(x), ref)
    emb = model.embeddings(x)
    torch.testing.assert_close(
        emb[:, 0], (model.embeddings.cls_token + model.embeddings.position_embeddings[:, :1])[:, 0]
    )
    torch.testing.assert_close(emb[:, 1:], ref + model.embeddings.position_embeddings[:, 1:])


def test_interpolate_pos_encoding():
    cfg = _tiny()
    model = _randomize(CrateForImageClassification(cfg)).eval()
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(model(x).logits, model(x, interpolate_pos_encoding=True).logits)
    big = torch.randn(2, 3, 12, 16)
    with pytest.raises(ValueError, match="interpolate_pos_encoding"):
        model(big)
    out = model(big, interpolate_pos_encoding=True, output_hidden_states=True)
    assert out.hidden_states[0].shape == (2, 1 + 6 * 8, cfg.hidden_size)
    # independent check: bicubic resize of the 4x4 grid to 6x8
    emb = model.crate.embeddings
    grid = emb.position_embeddings[:, 1:].reshape(1, 4, 4, -1).permute(0, 3, 1, 2)
    resized = (
        F.interpolate(grid, size=(6, 8), mode="bicubic", align_corners=False).permute(0, 2, 3, 1).reshape(1, 48, -1)
    )
    torch.testing.assert_close(emb.interpolate_pos_encoding(12, 16)[:, 1:], resized)
    torch.testing.assert_close(emb.interpolate_pos_encoding(12, 16)[:, :1], emb.position_embeddings[:, :1])
    # a constant field stays constant under bicubic interpolation (weights sum to one)
    with torch.no_grad():
        emb.position_embeddings.copy_(torch.full_like(emb.position_embeddings, 0.7))
    torch.testing.assert_close(emb.interpolate_pos_encoding(12, 16), torch.full((1, 49, cfg.hidden_size), 0.7))


def test_gradient_checkpointing_gives_same_gradients():
    cfg = _tiny()
    model = _randomize(CrateForImageClassification(cfg)).train()
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    model(x, labels=y).loss.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.activation_checkpointing_enable()
    assert all(layer.gradient_checkpointing for layer in model.crate.encoder.layer)
    model(x, labels=y, output_mid_hidden_states=True).loss.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], msg=n)


def test_dtype_handling():
    cfg = _tiny()
    from transformers import AutoModelForImageClassification

    model = AutoModelForImageClassification.from_config(cfg, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    out = model(torch.randn(2, 3, 8, 8))  # float32 pixels are cast to the weights' dtype
    assert out.logits.dtype == torch.bfloat16
    m64 = CrateForImageClassification(cfg).double()
    assert m64(torch.randn(1, 3, 8, 8)).logits.dtype == torch.float64


def test_init_weights():
    cfg = _tiny(num_hidden_layers=3, hidden_size=48, num_attention_heads=4, initializer_range=0.02)
    model = CrateForImageClassification(cfg)
    D = model.crate.encoder.layer[0].ista.weight
    bound = (6.0 / cfg.hidden_size) ** 0.5  # kaiming_uniform, fan_in, gain sqrt(2)
    assert D.abs().max() <= bound and D.abs().max() > 0.8 * bound
    assert model.crate.embeddings.position_embeddings.std().item() == pytest.approx(0.02, rel=0.25)
    assert model.crate.encoder.layer[0].attention.qkv.weight.std().item() == pytest.approx(0.02, rel=0.25)
    ln = model.crate.encoder.layer[0].layernorm_before
    assert torch.equal(ln.weight, torch.ones_like(ln.weight)) and torch.equal(ln.bias, torch.zeros_like(ln.bias))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(variant="crate-t", head_dim=4), "num_attention_heads \\* head_dim == hidden_size"),
        (dict(variant="crate-identity", head_dim=16), "num_attention_heads \\* head_dim == hidden_size"),
        (dict(variant="crate-x"), "variant must be one of"),
        (dict(pooling="max"), "pooling must be one of"),
        (dict(image_size=10, patch_size=4), "divisible by patch_size"),
        (dict(hidden_size=0), "hidden_size must be a positive int"),
        (dict(num_attention_heads=-1), "num_attention_heads must be a positive int"),
        (dict(hidden_dropout_prob=1.5), "hidden_dropout_prob must be in"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _tiny(**kwargs)


def test_tied_variant_with_matching_width_is_fine_and_presets():
    assert _tiny("crate-t").head_dim * 3 == 24
    cfg = CrateConfig.from_preset("crate-small", variant="crate-c", num_labels=7)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim) == (576, 12, 12, 48)
    assert cfg.num_labels == 7 and cfg.image_size == 224 and cfg.patch_size == 16
    assert CrateConfig.from_preset("crate-large").num_hidden_layers == 24
    with pytest.raises(ValueError, match="unknown preset"):
        CrateConfig.from_preset("crate-huge")


def test_bad_inputs_raise():
    model = CrateForImageClassification(_tiny()).eval()
    with pytest.raises(ValueError, match="channels"):
        model(torch.randn(1, 1, 8, 8))
    with pytest.raises(ValueError, match="divisible by patch_size"):
        model(torch.randn(1, 3, 9, 9), interpolate_pos_encoding=True)
    with pytest.raises(ValueError, match="pixel_values"):
        model(torch.randn(3, 8, 8))
    with pytest.raises(TypeError, match="pixel_values"):
        model([[0.0]])


@pytest.mark.parametrize("variant", ["crate", "crate-c", "crate-fix"])
def test_block_gradients_match_reference(variant):
    """The fused ISTA / SDPA path backpropagates like the plain formula."""
    cfg = _tiny(variant, ista_step_size=0.25, ista_lambda=0.2)
    layer = _randomize(CrateModel(cfg)).double().encoder.layer[0].train()
    tokens = torch.randn(2, 6, cfg.hidden_size, dtype=torch.float64, requires_grad=True)
    g_out, g_mid = (
        torch.randn(2, 6, cfg.hidden_size, dtype=torch.float64),
        torch.randn(2, 6, cfg.hidden_size, dtype=torch.float64),
    )
    params = [tokens, layer.ista.weight, layer.attention.qkv.weight, layer.layernorm_after.weight]
    out, mid = layer(tokens)
    grads = torch.autograd.grad((out * g_out).sum() + (mid * g_mid).sum(), params)
    ref_loss = 0
    for b in range(2):
        Z_half, Z_plus = _reference_block(layer, tokens[b].T, cfg)
        ref_loss = ref_loss + (Z_plus.T * g_out[b]).sum() + (Z_half.T * g_mid[b]).sum()
    ref_grads = torch.autograd.grad(ref_loss, params)
    for name, a, b in zip(["tokens", "D", "qkv", "ln2"], grads, ref_grads):
        torch.testing.assert_close(a, b, msg=name)


def test_autocast_bf16_close_to_fp32():
    cfg = _tiny()
    model = _randomize(CrateForImageClassification(cfg)).eval()
    x = torch.randn(2, 3, 8, 8)
    ref = model(x).logits
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(x).logits
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), ref, rtol=0.05, atol=0.05)
