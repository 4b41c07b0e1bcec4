"""transformers' attention-interface contract for every family: a function registered with ``AttentionInterface``
(and its mask with ``AttentionMaskInterface``) is called with the family's attention module first, the module it may
read (its training flag, ``is_causal``), and the model then gives what sdpa gives."""

from __future__ import annotations

import pytest
from model_cases import BY_NAME, FAMILY_HEADS, _assert_same, _run

_ATTENTION_MODULES = {"crate": "CrateMSSA", "crate-alpha": "CrateAlphaMSSA", "crate-mae": "CrateMAEMSSA",
                      "tost": "TostClassAttention", "crate_text": "CrateTextMSSA", "aot": "AotAttention",
                      "aot_text": "AotAttention"}  # fmt: skip


@pytest.mark.parametrize("name", FAMILY_HEADS)
def test_a_registered_attention_function_gets_the_attention_module(name):
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    seen = []

    def recording(module, query, key, value, attention_mask, **kwargs):
        seen.append(type(module).__name__)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("hf_tdiag_test_recording", recording)
    AttentionMaskInterface.register("hf_tdiag_test_recording", sdpa_mask)  # the masks it reads: sdpa's
    case = BY_NAME[name]
    model = case.build()
    inputs = case.inputs()
    model.set_attn_implementation("sdpa")
    expected = _run(model, inputs)
    model.set_attn_implementation("hf_tdiag_test_recording")
    _assert_same(case, _run(model, inputs), expected, inputs)
    assert seen and set(seen) == {_ATTENTION_MODULES[case.family]}
