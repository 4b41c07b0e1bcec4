"""SRR, concept fidelity and attention-SVM on decoders dispatched with Accelerate (device_map with disk offload,
cpu_offload) under hf_tdiag.integrations.big_model.readable_weights: the numbers of the model in memory."""

import copy
import os
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_tdiag
from hf_tdiag.integrations.big_model import offloaded_modules, readable_weights

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decoder_models import build, char_tokenizer, save_sharded  # noqa: E402

pytestmark = pytest.mark.slow

TEXTS = ["hello world abc", "the cat sat on", "a b c d e f g"]
IDS = torch.randint(2, 64, (3, 9), generator=torch.Generator().manual_seed(1))


def _diagnostics(model) -> dict:
    srr = hf_tdiag.layer_srr(model, {"input_ids": IDS}, progress=False)
    svm = hf_tdiag.attention_svm_diagnostic(model, {"input_ids": IDS}, 2, 1, max_queries=None)
    cf = hf_tdiag.concept_fidelity(model, TEXTS, 1, 3, tokenizer=char_tokenizer(), max_tokens=8, power_iters=5)
    return {
        **{f"srr/{term}": srr.per_layer(term) for term in ("srr", "R", "Rc", "sparsity")},
        **{f"svm/{k}": v for k, v in svm.summary().items() if isinstance(v, float) and k != "svm"},
        **{f"concepts/{k}": v for k, v in cf.summary().items()},
    }


def _disk_offloaded(path, offload):
    blocks = {f"transformer.h.{i}": "disk" for i in range(2)}  # both blocks on disk, the rest in memory
    device_map = {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.drop": "cpu", **blocks}
    device_map.update({"transformer.ln_f": "cpu", "lm_head": "cpu"})
    return AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", device_map=device_map, offload_folder=str(offload)
    ).eval()


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    save_sharded(build("gpt2"), str(path))
    return str(path)


@pytest.fixture(scope="module")
def in_memory(gpt2):
    model = AutoModelForCausalLM.from_pretrained(gpt2, attn_implementation="eager").eval()
    return model, _diagnostics(model)


def _assert_same(got: dict, expected: dict):
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-6, atol=1e-9, err_msg=key)


def test_disk_offloaded_decoder_gives_the_in_memory_numbers(gpt2, in_memory, tmp_path):
    in_memory, expected = in_memory
    model = _disk_offloaded(gpt2, tmp_path / "offload")
    weight = "transformer.h.0.attn.c_attn.weight"
    assert len(offloaded_modules(model)) > 0 and dict(model.named_parameters())[weight].device.type == "meta"
    with readable_weights(model):
        got = _diagnostics(model)
    _assert_same(got, expected)
    # as found afterwards: weights back on meta, the hooks' own methods, the same logits as in memory
    assert dict(model.named_parameters())[weight].device.type == "meta"
    assert all("_offload_weights" not in vars(hook) for _, hook in offloaded_modules(model))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=IDS).logits, in_memory(input_ids=IDS).logits)


def test_cpu_offloaded_decoder_gives_the_in_memory_numbers(in_memory):
    from accelerate import cpu_offload

    in_memory, expected = in_memory
    model = cpu_offload(copy.deepcopy(in_memory), execution_device=torch.device("cpu"))
    assert all(p.device.type == "meta" for p in model.parameters())  # every weight offloaded
    with readable_weights(model):
        got = _diagnostics(model)
    _assert_same(got, expected)


def test_a_model_in_memory_passes_through_unchanged(gpt2):
    model = AutoModelForCausalLM.from_pretrained(gpt2).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with readable_weights(model) as same:
        assert same is model and offloaded_modules(model) == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        with readable_weights("gpt2"):
            pass
