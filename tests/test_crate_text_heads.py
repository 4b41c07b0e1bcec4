"""Text CRATE's task heads against their definitions written from the base model's last hidden state: sequence
classification (first token for encoders, last attended one for decoders), token classification, extractive QA,
multiple choice (the pooled first token), which heads carry a pooler, ``classifier_dropout`` over the hidden
dropout, a caller's ``use_cache`` accepted by heads that return no cache, and packed sequences (``position_ids``
restarting at 0, no mask) attending within their own sequence only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_cases import BY_NAME

V = 29


def _hidden(model, ids, mask):
    with torch.no_grad():
        kwargs = {"use_cache": False} if model.config.is_decoder else {}
        return model.crate(input_ids=ids, attention_mask=mask, **kwargs).last_hidden_state


def _ids(seed=1, shape=(2, 6)):
    return torch.randint(1, V, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ["text-sequence-classification", "text-decoder-sequence-classification"])
def test_sequence_classification_reads_one_token_through_the_head(name):
    model = BY_NAME[name].build()
    ids = _ids()
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    h = _hidden(model, ids, mask)
    token = h[torch.arange(2), torch.tensor([5, 3])] if model.config.is_decoder else h[:, 0]
    head = model.classifier
    expected = F.linear(torch.tanh(F.linear(token, head.dense.weight, head.dense.bias)), head.out_proj.weight,
                        head.out_proj.bias)  # fmt: skip
    labels = torch.tensor([0, 2])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=True)  # a Trainer may pass it
    assert out.logits.shape == (2, 3)
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.loss, F.cross_entropy(expected, labels), rtol=1e-5, atol=1e-6)
    assert model.crate.pooler is None


def test_token_classification_and_question_answering_map_every_token():
    ids, mask = _ids(2), torch.ones(2, 6, dtype=torch.long)
    token_model = BY_NAME["text-token-classification"].build()
    h = _hidden(token_model, ids, mask)
    with torch.no_grad():
        logits = token_model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(logits, F.linear(h, token_model.classifier.weight, token_model.classifier.bias))
    qa = BY_NAME["text-question-answering"].build()
    h = _hidden(qa, ids, mask)
    with torch.no_grad():
        out = qa(input_ids=ids, attention_mask=mask, start_positions=torch.tensor([0, 1]),
                 end_positions=torch.tensor([2, 3]))  # fmt: skip
    spans = F.linear(h, qa.qa_outputs.weight, qa.qa_outputs.bias)
    torch.testing.assert_close(out.start_logits, spans[..., 0])
    torch.testing.assert_close(out.end_logits, spans[..., 1])
    expected_loss = (F.cross_entropy(spans[..., 0], torch.tensor([0, 1])) +
                     F.cross_entropy(spans[..., 1], torch.tensor([2, 3]))) / 2  # fmt: skip
    torch.testing.assert_close(out.loss, expected_loss)
    assert token_model.crate.pooler is None and qa.crate.pooler is None


def test_multiple_choice_scores_each_choices_pooled_first_token():
    model = BY_NAME["text-multiple-choice"].build()
    ids = _ids(3, (2, 3, 6))
    mask = torch.ones_like(ids)
    h = _hidden(model, ids.view(6, 6), mask.view(6, 6))
    pooled = torch.tanh(F.linear(h[:, 0], model.crate.pooler.dense.weight, model.crate.pooler.dense.bias))
    expected = F.linear(pooled, model.classifier.weight, model.classifier.bias).view(2, 3)
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.loss, F.cross_entropy(expected, labels), rtol=1e-5, atol=1e-6)


def test_only_multiple_choice_and_the_bare_model_carry_a_pooler():
    for name in ("text-masked-lm", "text-causal-lm", "text-sequence-classification", "text-token-classification",
                 "text-question-answering"):  # fmt: skip
        model = BY_NAME[name].build()
        assert model.crate.pooler is None and not any(k.startswith("crate.pooler") for k in model.state_dict()), name
    assert BY_NAME["text-multiple-choice"].build().crate.pooler is not None
    assert BY_NAME["text-encoder-model"].build().pooler is not None


@pytest.mark.parametrize("name", ["text-sequence-classification", "text-token-classification", "text-multiple-choice"])
def test_classifier_dropout_overrides_the_hidden_dropout(name):
    case = BY_NAME[name]
    own = case.build(classifier_dropout=0.3, hidden_dropout_prob=0.1)
    inherited = case.build(hidden_dropout_prob=0.1)
    dropout = (lambda m: m.classifier.dropout) if name == "text-sequence-classification" else (lambda m: m.dropout)
    assert dropout(own).p == 0.3 and dropout(inherited).p == 0.1
    ids = _ids(4, (2, 3, 6) if case.choices else (2, 6))
    own.train()
    torch.manual_seed(0)
    with torch.no_grad():
        first, second = own(input_ids=ids).logits, own(input_ids=ids).logits
    assert not torch.equal(first, second)  # the head's dropout acts in training


def test_packed_sequences_attend_within_their_own_sequence():
    model = BY_NAME["text-causal-lm"].build()
    ids = torch.tensor([[3, 5, 7, 4, 6, 8]])
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]]), use_cache=False).logits
        first = model(input_ids=ids[:, :3], use_cache=False).logits
        second = model(input_ids=ids[:, 3:], use_cache=False).logits
        joined = model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(packed, torch.cat([first, second], 1), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(joined[:, 3:], second, atol=1e-4)  # unpacked, the second sequence sees the first
