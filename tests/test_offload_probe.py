"""hf_tdiag.probes.offload on a small module dispatched with Accelerate: a block-level hook with disk offload
(dispatch_model) and leaf hooks with CPU offload (cpu_offload). Values against the module's own state dict."""

import pytest
import torch
from torch import nn

from hf_tdiag.probes import offload
from hf_tdiag.probes.token_states import model_device


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 2))).eval()


@pytest.fixture
def dispatched(tmp_path):
    """Block ``1`` (LayerNorm + Linear) offloaded to disk by one hook on the block (``place_submodules``, as
    Accelerate's ``preload_module_classes`` attaches it); block ``0`` in memory."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module
    from accelerate.utils import OffloadedWeightsLoader, offload_state_dict

    model = _model()
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    expected = model(torch.ones(2, 3))
    offload_state_dict(str(tmp_path), model[1].state_dict())
    store = OffloadedWeightsLoader(save_folder=str(tmp_path))
    hook = AlignDevicesHook(execution_device="cpu", offload=True, weights_map=store, place_submodules=True)
    add_hook_to_module(model[1], hook)  # the block's tensors go to meta
    return model, reference, expected


def test_a_block_offloaded_to_disk_is_read_tensor_by_tensor(dispatched):
    model, reference, expected = dispatched
    assert model[1][0].weight.device.type == "meta" and offload.is_offloaded(model)
    index = offload.offload_index(model)
    assert sorted(index) == ["1.0.bias", "1.0.weight", "1.1.bias", "1.1.weight"]
    assert {e.owner for e in index.values()} == {"1"}
    for name in ("0.weight", "1.0.weight", "1.1.bias"):
        torch.testing.assert_close(offload.read_tensor(model, name), reference[name], rtol=0, atol=0)
    assert model[1][1].bias.device.type == "meta"  # reading left the module as it was
    assert offload.execution_device(model) == torch.device("cpu") and model_device(model).type == "cpu"


def test_readable_and_runnable_fill_only_the_asked_modules_and_restore_meta(dispatched):
    model, reference, expected = dispatched
    norm, linear = model[1]
    with offload.readable(model, norm):
        torch.testing.assert_close(norm.weight, reference["1.0.weight"], rtol=0, atol=0)
        assert linear.weight.device.type == "meta"  # the block's other module untouched
    assert norm.weight.device.type == "meta" and norm.bias.device.type == "meta"
    with offload.runnable(model, norm):  # the hook sits on the block above: a direct call needs the weights
        torch.testing.assert_close(norm(torch.ones(1, 4)), nn.functional.layer_norm(torch.ones(1, 4), (4,)))
    assert norm.weight.device.type == "meta"
    torch.testing.assert_close(model(torch.ones(2, 3)), expected)  # the hooks still stream the block


def test_runnable_leaves_modules_with_their_own_hooks_to_them():
    from accelerate import cpu_offload

    model = _model()
    expected = model[1][0](torch.ones(1, 4))
    model = cpu_offload(model, execution_device=torch.device("cpu"))
    norm = model[1][0]
    with offload.runnable(model, norm):
        assert norm.weight.device.type == "meta"  # its own hook fills it when called
        torch.testing.assert_close(norm(torch.ones(1, 4)), expected)
    with offload.readable(model, norm):
        assert norm.weight.device.type == "cpu"


def test_plain_copy_has_no_hooks_and_real_weights(dispatched):
    model, reference, expected = dispatched
    block = offload.plain_copy(model, model[1])
    assert all("_hf_hook" not in vars(m) and "forward" not in vars(m) for m in block.modules())
    torch.testing.assert_close(block.state_dict()["1.weight"], reference["1.1.weight"], rtol=0, atol=0)
    assert "_hf_hook" in vars(model[1]) and model[1][1].weight.device.type == "meta"  # the original as found
    torch.testing.assert_close(model(torch.ones(2, 3)), expected)
    block64 = block.to(torch.float64)
    assert block64(torch.ones(1, 4, dtype=torch.float64)).dtype == torch.float64


def test_a_model_in_memory_passes_through():
    model = _model()
    weight = model[1][0].weight
    assert not offload.is_offloaded(model) and offload.offload_index(model) == {}
    with offload.readable(model, model[1]), offload.runnable(model, model[1]):
        assert model[1][0].weight is weight
    assert offload.read_tensor(model, "1.0.weight").data_ptr() == weight.data_ptr()  # no copy
    copied = offload.plain_copy(model, model)
    assert copied is not model and torch.equal(copied[0].weight, model[0].weight)
    assert offload.execution_device(model) is None


def test_releasing_memory_trims_after_each_offloaded_block_and_removes_its_hooks(dispatched, monkeypatch):
    import hf_tdiag._memory

    model, _, expected = dispatched
    calls = []
    monkeypatch.setattr(hf_tdiag._memory, "release_free_memory", lambda: calls.append(1))
    with offload.releasing_memory(model, [model[0], model[1]]):
        torch.testing.assert_close(model(torch.ones(2, 3)), expected)
    assert len(calls) == 2  # once per block's forward pass
    model(torch.ones(2, 3))
    assert len(calls) == 2 and not model[1]._forward_hooks
    with offload.releasing_memory(_model(), []):  # a model in memory: nothing registered
        pass
