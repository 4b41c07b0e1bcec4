"""SRR, the Schatten proxies, concept fidelity and attention-SVM on models dispatched with Accelerate (device_map with
disk offload, cpu_offload), passed to the diagnostics as they are (no wrapper): the numbers of the model in memory,
the model as found afterwards, and the Schatten path holding one job's weights at a time."""

import copy
import os
import sys
import weakref

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_tdiag
from hf_tdiag.integrations.big_model import readable_weights
from hf_tdiag.probes import offload
from hf_tdiag.probes.offload import offloaded_modules

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decoder_models import build, char_tokenizer, save_sharded  # noqa: E402

pytestmark = pytest.mark.slow

TEXTS = ["hello world abc", "the cat sat on", "a b c d e f g"]
IDS = torch.randint(2, 64, (3, 9), generator=torch.Generator().manual_seed(1))
PIXELS = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(2))


def _schatten(model) -> dict:
    rep = hf_tdiag.schatten_bounds(model, progress=False)
    out = {"schatten/bound": rep.schatten_bound, "schatten/edelman": rep.edelman_bound}
    for key in ("spectral_norm", "frobenius_norm", "norm_2_1", "norm_1_1", "p_opt"):
        out[f"schatten/{key}"] = [getattr(m, key) for m in rep.matrices]
    return out


def _srr(model, inputs) -> dict:
    srr = hf_tdiag.layer_srr(model, inputs, progress=False)
    normed = hf_tdiag.layer_srr(model, inputs, apply_layernorm=True, progress=False)  # each block's own norm, called
    return {
        **{f"srr/{term}": srr.per_layer(term) for term in ("srr", "R", "Rc", "sparsity")},
        "srr/srr_layernorm": normed.per_layer("srr"),
    }


def _svm(model, inputs, layer: int, head: int) -> dict:
    svm = hf_tdiag.attention_svm_diagnostic(model, inputs, layer, head, max_queries=None)
    return {f"svm/{k}": v for k, v in svm.summary().items() if isinstance(v, float) and k != "svm"}


def _decoder_diagnostics(model) -> dict:
    cf = hf_tdiag.concept_fidelity(model, TEXTS, 1, 3, tokenizer=char_tokenizer(), max_tokens=8, power_iters=5)
    return {
        **_srr(model, {"input_ids": IDS}),
        **_svm(model, {"input_ids": IDS}, 2, 1),
        **{f"concepts/{k}": v for k, v in cf.summary().items()},
        **_schatten(model),
    }


def _block_device_map(model, blocks_path: str) -> dict:
    """Every block of ``blocks_path`` on disk, everything else in memory (one device_map entry per block)."""
    device_map = {}

    def visit(module, path):
        if path == blocks_path:
            device_map.update({f"{path}.{name}": "disk" for name, _ in module.named_children()})
            return
        if not blocks_path.startswith(path + ".") and path:
            device_map[path] = "cpu"
            return
        for name, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            device_map[f"{path}.{name}" if path else name] = "cpu"
        for name, child in module.named_children():
            visit(child, f"{path}.{name}" if path else name)

    visit(model, "")
    return device_map


def _disk_offloaded(cls, path, offload_dir, blocks_path, **kwargs):
    meta = cls.from_pretrained(path, **kwargs)
    device_map = _block_device_map(meta, blocks_path)
    return cls.from_pretrained(path, device_map=device_map, offload_folder=str(offload_dir), **kwargs).eval()


def _assert_same(got: dict, expected: dict):
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-6, atol=1e-9, err_msg=key)


def _block_of(path: str, blocks_path: str) -> str:
    """The block (``<blocks_path>.<i>``) a module path lies in."""
    assert path.startswith(blocks_path + "."), path
    return ".".join(path.split(".")[: blocks_path.count(".") + 2])


def _offloaded_blocks(model, blocks_path: str) -> set:
    """The blocks holding every offloaded tensor (Accelerate hooks each of their modules)."""
    return {_block_of(entry.owner, blocks_path) for entry in offload.offload_index(model).values()}


def _hook_state(model, inputs) -> list:
    """What the diagnostics must leave as found: each hook's attributes (after one forward pass of the model, which
    adds the hook's own bookkeeping) and where each parameter rests."""
    with torch.no_grad():
        model(inputs)
    hooks = [sorted(vars(hook)) for _, hook in offloaded_modules(model)]
    return [hooks, [(n, p.device.type) for n, p in model.named_parameters()]]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    save_sharded(build("gpt2"), str(path))
    return str(path)


@pytest.fixture(scope="module")
def in_memory(gpt2):
    model = AutoModelForCausalLM.from_pretrained(gpt2, attn_implementation="eager").eval()
    return model, _decoder_diagnostics(model)


def test_disk_offloaded_decoder_gives_the_in_memory_numbers(gpt2, in_memory, tmp_path):
    in_memory, expected = in_memory
    model = _disk_offloaded(
        AutoModelForCausalLM, gpt2, tmp_path / "offload", "transformer.h", attn_implementation="eager"
    )
    weight = "transformer.h.0.attn.c_attn.weight"
    assert _offloaded_blocks(model, "transformer.h") == {"transformer.h.0", "transformer.h.1"}
    assert dict(model.named_parameters())[weight].device.type == "meta"
    before = _hook_state(model, IDS)
    _assert_same(_decoder_diagnostics(model), expected)
    assert _hook_state(model, IDS) == before  # weights back on meta, the hooks' own attributes
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=IDS).logits, in_memory(input_ids=IDS).logits)


def test_cpu_offloaded_decoder_gives_the_in_memory_numbers(in_memory):
    from accelerate import cpu_offload

    in_memory, expected = in_memory
    model = cpu_offload(copy.deepcopy(in_memory), execution_device=torch.device("cpu"))
    assert all(p.device.type == "meta" for p in model.parameters())  # every weight offloaded, a hook on every module
    before = _hook_state(model, IDS)
    _assert_same(_decoder_diagnostics(model), expected)
    assert _hook_state(model, IDS) == before


def test_disk_offloaded_llama_gives_the_in_memory_numbers(tmp_path):
    """Grouped-query attention, rotary heads, RMSNorm and a gated MLP, each block on disk."""
    path = tmp_path / "llama"
    save_sharded(build("llama"), str(path))
    kwargs = dict(attn_implementation="eager")
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs).eval()
    expected = {**_srr(model, {"input_ids": IDS}), **_svm(model, {"input_ids": IDS}, 1, 3), **_schatten(model)}
    offloaded = _disk_offloaded(AutoModelForCausalLM, str(path), tmp_path / "offload", "model.layers", **kwargs)
    got = {**_srr(offloaded, {"input_ids": IDS}), **_svm(offloaded, {"input_ids": IDS}, 1, 3), **_schatten(offloaded)}
    _assert_same(got, expected)


def _tiny_crate():
    torch.manual_seed(0)
    cfg = hf_tdiag.CrateConfig(
        image_size=8,
        patch_size=4,
        num_channels=1,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_labels=3,
    )
    return hf_tdiag.CrateForImageClassification(cfg).eval()


def _encoder_diagnostics(model) -> dict:
    cf = hf_tdiag.concept_fidelity(model, PIXELS, 1, 3, power_iters=3, progress=False)
    numbers = {k: v for k, v in cf.summary().items() if isinstance(v, float)}
    assert "bound_certified" in numbers  # the certified constants read every suffix block's weights
    return {
        **_srr(model, PIXELS),
        **_svm(model, PIXELS, 1, 0),
        **{f"concepts/{k}": v for k, v in numbers.items()},
        **_schatten(model),
    }


def test_offloaded_crate_encoder_gives_the_in_memory_numbers(tmp_path):
    """An encoder: Schatten re-reads each block from its offload store per job, the certified concept constants read
    each suffix block after its forward pass, the SRR states pass through each block's own LayerNorm."""
    from accelerate import cpu_offload

    model = _tiny_crate()
    expected = _encoder_diagnostics(model)
    model.save_pretrained(tmp_path / "crate")
    disk = _disk_offloaded(
        hf_tdiag.CrateForImageClassification, tmp_path / "crate", tmp_path / "offload", "crate.encoder.layer"
    )
    assert _offloaded_blocks(disk, "crate.encoder.layer") == {"crate.encoder.layer.0", "crate.encoder.layer.1"}
    before = _hook_state(disk, PIXELS)
    _assert_same(_encoder_diagnostics(disk), expected)
    assert _hook_state(disk, PIXELS) == before
    _assert_same(_encoder_diagnostics(cpu_offload(copy.deepcopy(model), torch.device("cpu"))), expected)


def test_schatten_holds_one_job_of_offloaded_weights_at_a_time(gpt2, in_memory, tmp_path, monkeypatch):
    """Every tensor read from the disk offload store is tracked; at no read are tensors of more than one block alive
    (the first job of each block reads only that block's tensors, and the previous job's are freed)."""
    model = _disk_offloaded(AutoModelForCausalLM, gpt2, tmp_path / "offload", "transformer.h")
    live: list[tuple[str, weakref.ref]] = []
    blocks_alive = []
    real_value = offload.OffloadedTensor.value

    def tracked(entry):
        value = real_value(entry)
        live.append((_block_of(entry.owner, "transformer.h"), weakref.ref(value)))
        blocks_alive.append({owner for owner, ref in live if ref() is not None})
        return value

    monkeypatch.setattr(offload.OffloadedTensor, "value", tracked)
    got = _schatten(model)
    _assert_same(got, {k: v for k, v in in_memory[1].items() if k.startswith("schatten/")})
    assert len(live) > 0 and {o for o, _ in live} == {"transformer.h.0", "transformer.h.1"}
    assert max(len(b) for b in blocks_alive) == 1


def test_readable_weights_still_reads_offloaded_weights(gpt2, tmp_path):
    """The context for a caller's own weight reads: weights on the CPU inside, back on meta outside."""
    model = _disk_offloaded(AutoModelForCausalLM, gpt2, tmp_path / "offload", "transformer.h")
    weight = "transformer.h.0.attn.c_attn.weight"
    reference = AutoModelForCausalLM.from_pretrained(gpt2).state_dict()[weight]
    with readable_weights(model):
        torch.testing.assert_close(dict(model.named_parameters())[weight], reference, rtol=0, atol=0)
    assert dict(model.named_parameters())[weight].device.type == "meta"
    assert all("_offload_weights" not in vars(hook) for _, hook in offloaded_modules(model))
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        with readable_weights("gpt2"):
            pass
