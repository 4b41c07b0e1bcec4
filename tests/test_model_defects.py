"""The three defects of issue 43, each a test that failed before its fix: text CRATE exports (its position check read
the position values, a data-dependent guard), CRATE-MAE pre-training returns its attention maps, and CRATE-MAE's
classifier holds no parameter its forward leaves without a gradient (the pre-trained mask token), while still loading
a pre-training checkpoint and an older classifier checkpoint that holds one."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_tdiag.models.crate_mae import CrateMAEConfig, CrateMAEForImageClassification, CrateMAEForPreTraining
from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM, CrateTextForMaskedLM

V = 29


def _text(causal: bool):
    preset = "crate-lm-12l" if causal else "crate-bert-base"
    extra = {} if causal else {"ista_dictionary_size": 16}
    config = CrateTextConfig.from_preset(
        preset, vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=12,
        pad_token_id=0, **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    return (CrateTextForCausalLM if causal else CrateTextForMaskedLM)(config).eval()


@pytest.mark.parametrize("causal", [True, False])
def test_text_crate_exports_and_the_program_equals_eager(causal):
    model = _text(causal)
    ids = torch.randint(1, V, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]]) if causal else torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    inputs = {"input_ids": ids, "attention_mask": mask, **({"use_cache": False} if causal else {})}
    with torch.no_grad():
        expected = model(**inputs).logits
        program = torch.export.export(model, (), inputs)
        got = program.module()(**inputs).logits
    kept = mask.bool()
    torch.testing.assert_close(got[kept], expected[kept], rtol=1e-5, atol=1e-5)
    assert type(model)._can_compile_fullgraph


def test_an_over_long_input_is_still_refused_eager_cached_and_exported():
    model = _text(causal=True)
    too_long = torch.ones(1, 13, dtype=torch.long)
    with pytest.raises(ValueError, match="13 tokens is longer than the 12 positions of max_position_embeddings=12"):
        model(input_ids=too_long)
    with pytest.raises(ValueError, match="max_position_embeddings=12"):
        torch.export.export(model, (), {"input_ids": too_long, "use_cache": False})
    with torch.no_grad():
        cache = model(input_ids=torch.ones(1, 10, dtype=torch.long), use_cache=True).cache
    with pytest.raises(ValueError, match=r"max_position_embeddings=12 \(position row 12\)"):
        model(input_ids=torch.ones(1, 3, dtype=torch.long), cache=cache)  # positions 10, 11, 12: past the table
    with pytest.raises(ValueError, match=r"max_position_embeddings=12 \(position row 12\)"):
        model(input_ids=torch.ones(1, 3, dtype=torch.long), position_ids=torch.tensor([[0, 5, 12]]))
    with torch.no_grad():  # the last row is still usable
        model(input_ids=torch.ones(1, 3, dtype=torch.long), position_ids=torch.tensor([[0, 5, 11]]))


def _mae_config(**kw) -> CrateMAEConfig:
    fields = dict(image_size=8, patch_size=2, num_channels=1, hidden_size=16, num_hidden_layers=2,
                  num_attention_heads=2, decoder_num_hidden_layers=1, decoder_num_attention_heads=2, num_labels=3)  # fmt: skip
    return CrateMAEConfig(**{**fields, **kw})


def test_crate_mae_pretraining_returns_each_encoder_blocks_attention():
    torch.manual_seed(0)
    model = CrateMAEForPreTraining(_mae_config()).eval()
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    noise = torch.rand(2, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(x, noise=noise, output_attentions=True, output_hidden_states=True)
        plain = model(x, noise=noise)
    assert plain.attentions is None and out.attentions is not None and len(out.attentions) == 2
    for layer, z, probs in zip(model.crate_mae.encoder, out.hidden_states, out.attentions):
        assert probs.shape == (2, 2, 17, 17)  # (B, K, 1 + N, 1 + N)
        w = layer.attention.qkv(layer.layernorm_before(z)).view(2, 17, 2, 8).transpose(1, 2)
        torch.testing.assert_close(probs, torch.softmax(w @ w.transpose(-1, -2) / 8**0.5, -1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.logits, plain.logits)  # the maps are recorded, the forward unchanged


def test_crate_mae_classifier_trains_every_parameter_and_loads_pretrained_weights(tmp_path):
    torch.manual_seed(0)
    pre = CrateMAEForPreTraining(_mae_config())
    pre.save_pretrained(tmp_path / "pretrained")
    classifier, info = CrateMAEForImageClassification.from_pretrained(tmp_path / "pretrained", output_loading_info=True)
    assert info["missing_keys"] == {"classifier.weight", "classifier.bias"}
    assert not any("mask_token" in key for key in info["unexpected_keys"])  # dropped on purpose, not reported
    for name, value in pre.crate_mae.state_dict().items():
        if name != "embeddings.mask_token":
            assert torch.equal(classifier.crate_mae.state_dict()[name], value), name
    classifier.train()
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    classifier(x, labels=torch.tensor([0, 1, 2, 0])).loss.backward()
    no_grad = [n for n, p in classifier.named_parameters() if p.requires_grad and p.grad is None]
    assert no_grad == []  # DDP without find_unused_parameters
    # the pre-trained model keeps its mask token, and it is what masking uses
    assert pre.crate_mae.embeddings.mask_token is not None
    with pytest.raises(ValueError, match="no mask token"):
        classifier.crate_mae(x, apply_mask=True)
    # a classifier saved before the fix holds a mask token: it still loads, to the same logits
    classifier.eval().save_pretrained(tmp_path / "classifier")
    weights = load_file(tmp_path / "classifier" / "model.safetensors")
    weights["crate_mae.embeddings.mask_token"] = torch.zeros(1, 1, 16)
    save_file(weights, tmp_path / "classifier" / "model.safetensors", metadata={"format": "pt"})
    old = CrateMAEForImageClassification.from_pretrained(tmp_path / "classifier").eval()
    with torch.no_grad():
        torch.testing.assert_close(old(x).logits, classifier(x).logits, rtol=0, atol=1e-6)
    # and a plain torch load of the pre-trained encoder's state dict (as recipes/train_whitebox_digits.py does)
    fresh = CrateMAEForImageClassification(_mae_config())
    fresh.crate_mae.load_state_dict(pre.crate_mae.state_dict())
    assert torch.equal(fresh.crate_mae.embeddings.cls_token, pre.crate_mae.embeddings.cls_token)
