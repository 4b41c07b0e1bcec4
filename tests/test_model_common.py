"""What transformers checks of its own models (tests/test_modeling_common.py, generation and configuration tests),
checked here of every head class of every white-box family (tests/model_cases.py), written for this project.

Default run (tiny configs): save/load round trip (safetensors), ``device_map="auto"`` with CPU and disk offload,
the count and shapes of ``hidden_states`` and ``attentions``, gradient checkpointing, every parameter receiving a
gradient in the training forward, eager = sdpa, initialisation only through ``_init_weights``, deterministic eval,
``resize_token_embeddings`` and tied weights, generation (greedy, sampling, beam search, left padding, static cache),
config round trip and validation. Slow run: ``torch.compile(fullgraph=True)`` and ``torch.export`` of every class,
compiled static-cache generation, and flex attention (its CPU kernel compiles for tens of seconds)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from model_cases import BY_NAME, CASES, FAMILY_HEADS, V, _assert_same, _run, compared
from transformers import CompileConfig

NAMES = [case.name for case in CASES]


# ------------------------------------------------------------------------------------------------- save and load
@pytest.mark.parametrize("name", NAMES)
def test_save_and_load_round_trip(tmp_path, name):
    case = BY_NAME[name]
    model = case.build()
    model.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert "model.safetensors" in files and not {f for f in files if f.endswith(".bin")}  # transformers 5: always
    loaded, info = case.cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert loaded.state_dict().keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    inputs = case.inputs()
    _assert_same(case, _run(loaded.eval(), inputs), _run(model, inputs), inputs, atol=1e-6)


@pytest.mark.parametrize("name", FAMILY_HEADS)
def test_device_map_auto_with_disk_offload_equals_the_model_in_memory(tmp_path, name):
    case = BY_NAME[name]
    model = case.build()
    model.save_pretrained(tmp_path / "model")
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    offloaded = case.cls.from_pretrained(
        tmp_path / "model", device_map="auto", max_memory={"cpu": size // 3}, offload_folder=tmp_path / "offload"
    ).eval()
    placed = set(offloaded.hf_device_map.values())
    assert "disk" in placed and placed & {"cpu", 0, "cuda:0"} or placed == {"disk"}, offloaded.hf_device_map
    inputs = case.inputs()
    _assert_same(case, _run(offloaded, inputs), _run(model, inputs), inputs)


# ------------------------------------------------------------------------------------------------- recorded outputs
@pytest.mark.parametrize("name", NAMES)
def test_hidden_states_and_attentions_count_and_shapes(name):
    case = BY_NAME[name]
    model = case.build()
    inputs = case.inputs()
    plain = _run(model, inputs)
    assert getattr(plain, "hidden_states", None) is None and getattr(plain, "attentions", None) is None
    out = _run(model, {**inputs, "output_hidden_states": True, "output_attentions": True})
    n_hidden, hidden_shape, n_att, att_shape = case.expected_states()
    assert len(out.hidden_states) == n_hidden and len(out.attentions) == n_att
    assert all(tuple(h.shape) == hidden_shape for h in out.hidden_states)
    assert all(tuple(a.shape) == att_shape for a in out.attentions)
    for a in out.attentions:  # probabilities: every row of an attended query sums to one
        rows = a.sum(-1)
        if case.text:
            mask = inputs["attention_mask"].reshape(-1, a.shape[-1]).bool()
            rows = rows.permute(0, 2, 1)[mask]
        torch.testing.assert_close(rows, torch.ones_like(rows))
    recorded = compared(case, out, inputs)
    for key, value in compared(case, plain, inputs).items():  # asking for states does not change the outputs
        torch.testing.assert_close(recorded[key], value, rtol=1e-5, atol=1e-5, msg=key)
    with torch.no_grad():
        as_tuple = model(**inputs, return_dict=False)
    assert isinstance(as_tuple, tuple)
    first = next(v for v in plain.values() if isinstance(v, torch.Tensor))
    torch.testing.assert_close(as_tuple[0], first)


# ------------------------------------------------------------------------------------------------- training
def _loss(case, model, inputs):
    out = model(**inputs)
    if getattr(out, "loss", None) is not None:
        return out.loss
    return sum(t.float().pow(2).mean() for t in compared(case, out, inputs).values())  # a bare model's outputs


def _grads(case, model, inputs):
    model.zero_grad(set_to_none=True)
    _loss(case, model, inputs).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}  # (CRATE-MAE's fixed positions)


@pytest.mark.parametrize("name", NAMES)
def test_every_parameter_gets_a_gradient_and_checkpointing_gives_the_same_gradients(name):
    case = BY_NAME[name]
    model = case.build().train()
    inputs = case.training_inputs()
    grads = _grads(case, model, inputs)
    missing = [n for n, g in grads.items() if g is None]
    assert missing == [], f"no gradient (DDP needs find_unused_parameters): {missing}"
    assert model.supports_gradient_checkpointing
    model.activation_checkpointing_enable()  # transformers 5's name of gradient_checkpointing_enable
    assert model.is_activation_checkpointing
    checkpointed = _grads(case, model, inputs)
    for key, value in grads.items():
        torch.testing.assert_close(checkpointed[key], value, rtol=1e-5, atol=1e-6, msg=key)


# ------------------------------------------------------------------------------------------------- attention paths
@pytest.mark.parametrize("name", NAMES)
def test_eager_equals_sdpa(name):
    case = BY_NAME[name]
    model = case.build()
    inputs = case.inputs()
    model.set_attn_implementation("eager")
    eager = _run(model, inputs)
    model.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == "sdpa"
    _assert_same(case, _run(model, inputs), eager, inputs)


# ------------------------------------------------------------------------------------------------- initialisation
# tensors whose initialisation is the authors' and does not scale with initializer_range (so a zero-init config
# leaves them as they are): the ISTA dictionaries (Kaiming-uniform), CRATE-MAE's Xavier-uniform linear maps and
# patch projection and its fixed sine-cosine positions, ToST's unit temperatures and the BatchNorm statistics
_AUTHORS_INIT = {
    "crate": r"ista\.weight$",
    "crate-alpha": r"sparse_coding\.D1?$",
    "crate-mae": r"(ista\.weight|dictionary\.weight|qkv\.weight|out_proj\.weight|decoder_pred\.weight|classifier\."
    r"weight|projection\.weight|position_embeddings)$",
    "tost": r"(running_var|num_batches_tracked|\.temp)$",
    "crate_text": r"ista\.weight$",
    "aot": r"(?!)",  # nothing: every AoT tensor scales with initializer_range
    "aot_text": r"(?!)",
}


def _zero_init(case):
    """The config with every std/range/scale field at 1e-10 (transformers' _config_zero_init)."""
    config = case.config()
    for key in list(config.to_dict()):
        if any(s in key for s in ("_range", "_std", "initializer_factor", "layer_scale")):
            setattr(config, key, 1e-10)
    return config


@pytest.mark.parametrize("name", NAMES)
def test_initialisation_is_only_through_init_weights(name):
    case = BY_NAME[name]
    torch.manual_seed(0)
    model = case.cls(_zero_init(case))
    exempt = re.compile(_AUTHORS_INIT[case.family])
    # a norm's scale starts at 1, everything else at 0 (transformers' own check accepts either for any tensor)
    ones = {f"{name}.weight" for name, m in model.named_modules() if "Norm" in type(m).__name__}
    checked = 0
    for key, tensor in model.state_dict().items():
        if exempt.search(key) or not tensor.is_floating_point():
            continue
        mean = round(float(tensor.double().mean()) * 1e9) / 1e9
        assert mean == (1.0 if key in ones else 0.0), f"{key}: mean {mean} with a zero-init config"
        checked += 1
    assert checked > 5 and any(key in ones for key in model.state_dict())
    # every float tensor is written by _init_weights: NaN everywhere, then initialize_weights again
    model = case.build()
    with torch.no_grad():
        for tensor in model.state_dict(keep_vars=True).values():
            if tensor.is_floating_point():
                tensor.fill_(math.nan)
    for obj in [*model.modules(), *model.parameters(), *model.buffers()]:
        if hasattr(obj, "_is_hf_initialized"):
            del obj._is_hf_initialized
    model.initialize_weights()
    untouched = [k for k, t in model.state_dict().items() if t.is_floating_point() and bool(t.isnan().any())]
    assert untouched == []


# ------------------------------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("name", NAMES)
def test_eval_forward_is_deterministic_and_skips_dropout(name):
    case = BY_NAME[name]
    fields = case.config().to_dict()
    dropouts = {k: 0.3 for k in fields if k.endswith("dropout_prob") or k == "classifier_dropout"}
    model = case.build(**dropouts)
    inputs = case.inputs()
    first, second = _run(model, inputs), _run(model, inputs)
    _assert_same(case, first, second, inputs, atol=0)
    if dropouts:  # the same weights without dropout: eval mode drops nothing
        plain = case.build()
        plain.load_state_dict(model.state_dict())
        _assert_same(case, _run(plain.eval(), inputs), first, inputs, atol=0)
        model.train()
        torch.manual_seed(5)
        trained = compared(case, model(**inputs), inputs)
        assert any(not torch.equal(trained[k], v) for k, v in compared(case, first, inputs).items())


# ------------------------------------------------------------------------------------------------- text embeddings
TEXT = [case.name for case in CASES if case.text]


@pytest.mark.parametrize("name", TEXT)
def test_resize_token_embeddings_keeps_rows_and_ties(tmp_path, name):
    case = BY_NAME[name]
    model = case.build()
    inputs = case.inputs()
    before = _run(model, inputs)
    old = model.get_input_embeddings().weight.detach().clone()
    model.resize_token_embeddings(V + 5)
    assert model.config.vocab_size == V + 5 and model.get_input_embeddings().weight.shape == (V + 5, 16)
    torch.testing.assert_close(model.get_input_embeddings().weight[:V], old)
    output_embeddings = model.get_output_embeddings()
    if output_embeddings is not None:  # the LM heads: tied to the input embeddings, before and after a reload
        assert output_embeddings.weight is model.get_input_embeddings().weight
        assert output_embeddings.out_features == V + 5
        model.save_pretrained(tmp_path)
        reloaded = case.cls.from_pretrained(tmp_path)
        assert reloaded.get_output_embeddings().weight is reloaded.get_input_embeddings().weight
    after = _run(model, inputs)
    for key, value in compared(case, before, inputs).items():  # the old vocabulary's outputs are unchanged
        got = compared(case, after, inputs)[key]
        if got.shape != value.shape:
            got = got[..., :V]
        torch.testing.assert_close(got, value, rtol=1e-5, atol=1e-6, msg=key)


# ------------------------------------------------------------------------------------------------- generation
def _lm():
    """The causal LM with every weight random (std 0.5; LayerNorm gains about 1): next-token distributions sharp
    enough that greedy, sampled and beam continuations differ (the 0.02-std initialisation gives near-uniform ones)."""
    model = BY_NAME["text-causal-lm"].build()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            gain = "norm" in name and name.endswith("weight")
            param.copy_((1 if gain else 0) + (0.3 if gain else 0.5) * torch.randn(param.shape, generator=g))
    return model


PROMPT = torch.tensor([[5, 9, 2, 7], [0, 0, 11, 3]])
PROMPT_MASK = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])


def _greedy_by_hand(model, ids, steps):
    """Full forwards, no cache, argmax of the last position (one unpadded row)."""
    for _ in range(steps):
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
    return ids


def test_greedy_generation_with_left_padding_equals_decoding_by_hand():
    model = _lm()
    out = model.generate(PROMPT, attention_mask=PROMPT_MASK, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 9)
    torch.testing.assert_close(out[:1], _greedy_by_hand(model, PROMPT[:1], 5))
    torch.testing.assert_close(out[1:, 2:], _greedy_by_hand(model, PROMPT[1:, 2:], 5))  # padding changes nothing
    assert len(set(out[0, 4:].tolist())) > 1  # not one token repeated: the test can tell orders apart


def test_sampling_is_reproducible_with_a_seed_and_the_same_with_and_without_cache():
    model = _lm()
    outs = []
    for use_cache in (True, True, False):
        torch.manual_seed(3)
        outs.append(model.generate(PROMPT, attention_mask=PROMPT_MASK, max_new_tokens=6, do_sample=True, top_k=10,
                                   temperature=1.5, use_cache=use_cache, pad_token_id=0))  # fmt: skip
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    torch.manual_seed(4)
    other = model.generate(PROMPT, attention_mask=PROMPT_MASK, max_new_tokens=6, do_sample=True, top_k=10,
                           temperature=1.5, pad_token_id=0)  # fmt: skip
    assert not torch.equal(other, outs[0])


def test_beam_search_scores_are_the_sequences_log_probabilities():
    model = _lm()
    kwargs = dict(max_new_tokens=4, num_beams=3, do_sample=False, pad_token_id=0, length_penalty=1.0,
                  return_dict_in_generate=True, output_scores=True)  # fmt: skip
    ids = PROMPT[:1]
    out = model.generate(ids, **kwargs)
    again = model.generate(ids, **kwargs, use_cache=False)
    assert torch.equal(out.sequences, again.sequences)
    sequence = out.sequences[:1]
    with torch.no_grad():
        logp = model(input_ids=sequence, use_cache=False).logits.log_softmax(-1)
    new = sequence[0, 4:]
    total = sum(float(logp[0, 3 + i, token]) for i, token in enumerate(new.tolist()))
    # length_penalty 1: the sum over the generated tokens divided by their number (transformers 5)
    assert float(out.sequences_scores[0]) == pytest.approx(total / len(new), rel=1e-4, abs=1e-5)


def test_static_cache_generation_equals_dynamic():
    model = _lm()
    dynamic = model.generate(PROMPT, attention_mask=PROMPT_MASK, max_new_tokens=5, do_sample=False, pad_token_id=0)
    static = model.generate(PROMPT, attention_mask=PROMPT_MASK, max_new_tokens=5, do_sample=False, pad_token_id=0,
                            cache_implementation="static")  # fmt: skip
    assert torch.equal(static, dynamic)


def test_an_encoder_cannot_take_a_cache():
    model = BY_NAME["text-encoder-model"].build()
    with pytest.raises(ValueError, match="is_decoder=True"):
        model(input_ids=torch.ones(1, 3, dtype=torch.long), use_cache=True)


# ------------------------------------------------------------------------------------------------- configuration
_BAD = {
    "crate": {"variant": "crate-x"},
    "crate-alpha": {"image_size": 9},
    "crate-mae": {"mask_ratio": 1.5},
    "tost": {"num_attention_heads": 3},
    "crate_text": {"ista_step_size": 0.0},
    "aot": {"step_size": 0.0},
    "aot_text": {"attention": "mlp"},
}


@pytest.mark.parametrize("name", NAMES)
def test_config_round_trip_and_validation(tmp_path, name):
    case = BY_NAME[name]
    config = case.config()
    again = type(config).from_dict(config.to_dict())
    assert again.to_dict() == config.to_dict()
    config.save_pretrained(tmp_path)
    loaded = type(config).from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == config.model_type
    assert json.loads(config.to_json_string())["hidden_size"] == config.hidden_size
    with pytest.raises(ValueError, match=next(iter(_BAD[case.family]))):
        case.config(**_BAD[case.family])


# ------------------------------------------------------------------------------------------------- slow: compiled
def _eager_outputs(case):
    model = case.build()
    inputs = case.inputs()
    return model, inputs, _run(model, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_torch_compile_fullgraph_equals_eager(name):
    case = BY_NAME[name]
    assert case.cls._can_compile_fullgraph
    model, inputs, expected = _eager_outputs(case)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    _assert_same(case, _run(compiled, inputs), expected, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_torch_export_equals_eager(name):
    case = BY_NAME[name]
    model, inputs, expected = _eager_outputs(case)
    with torch.no_grad():
        program = torch.export.export(model, (), inputs)
    _assert_same(case, _run(program.module(), inputs), expected, inputs)


@pytest.mark.slow
def test_compiled_static_cache_generation_equals_eager_greedy():
    model = _lm()
    expected = model.generate(PROMPT, attention_mask=PROMPT_MASK, max_new_tokens=5, do_sample=False, pad_token_id=0)
    compile_config = CompileConfig(fullgraph=True, mode="default")
    compile_config._compile_all_devices = True  # transformers compiles on accelerators only unless told
    torch._dynamo.reset()
    out = model.generate(PROMPT, attention_mask=PROMPT_MASK, max_new_tokens=5, do_sample=False, pad_token_id=0,
                         cache_implementation="static", compile_config=compile_config)  # fmt: skip
    assert torch.equal(out, expected)


def _flex_compiles_here() -> str | None:
    """None when this torch build compiles a CPU flex-attention kernel with a padding mask, else why not."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q = torch.randn(1, 1, 8, 4)
    try:
        block = create_block_mask(lambda b, h, i, j: j < 6, 1, 1, 8, 8, device="cpu")
        torch.compile(flex_attention)(q, q, q, block_mask=block)
    except Exception as err:  # noqa: BLE001  (e.g. inductor's C++ compiler failing on this machine)
        return f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_eager_equals_flex_attention(name):
    why = _flex_compiles_here()
    if why is not None:
        pytest.skip(f"this machine does not compile CPU flex attention: {why}")
    case = BY_NAME[name]
    model, inputs, expected = _eager_outputs(case)
    if not case.cls._supports_flex_attn:  # ToST: TSSA is not softmax attention, and its class attention has one query
        with pytest.raises(ValueError, match="(?i)flex"):
            model.set_attn_implementation("flex_attention")
        return
    model.set_attn_implementation("flex_attention")
    _assert_same(case, _run(model, inputs), expected, inputs)
