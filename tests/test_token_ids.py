"""Token ids outside the model's vocabulary are refused by every diagnostic that reads texts, in one line naming the
id and the vocabulary, before the embedding lookup fails with an index error (a device-side assert on a GPU)."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertModel

import hf_tdiag
from hf_tdiag._model_limits import check_batch_ids, vocabulary_size
from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextModel

VOCAB = 50


def _bert():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16)  # fmt: skip
    return BertModel(config).eval()


def _crate_text():
    torch.manual_seed(0)
    config = CrateTextConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, ista_dictionary_size=16,
                             vocab_size=VOCAB, max_position_embeddings=16)  # fmt: skip
    return CrateTextModel(config).eval()


def _batch(bad: int):
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]])
    ids[0, 2] = bad
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


RUNS = {
    "srr": lambda m, b: hf_tdiag.layer_srr(m, b, progress=False),
    # one concept mask for every text: the tokens after the first
    "concept_fidelity": lambda m, b: hf_tdiag.concept_fidelity(
        m, {**b, "concept_mask": torch.arange(4) > 0}, 1, 2, labels=[0, 1, 0, 1], progress=False
    ),
    "token_snr": lambda m, b: hf_tdiag.token_snr(m, b, [0, 0, 1, 1]),
    "attention_svm": lambda m, b: hf_tdiag.attention_svm_diagnostic(m, b, 1, 0),
    "objective_ledger": lambda m, b: hf_tdiag.objective_ledger(m, b),
}


@pytest.mark.parametrize("name", sorted(RUNS))
@pytest.mark.parametrize("bad", [VOCAB, -1])
def test_an_id_outside_the_vocabulary_is_named(name, bad):
    model = _crate_text() if name == "objective_ledger" else _bert()
    with pytest.raises(ValueError, match=rf"input_ids: the id {bad} is outside the vocabulary of {VOCAB} tokens"):
        RUNS[name](model, _batch(bad))
    RUNS[name](model, _batch(VOCAB - 1))  # the last id of the vocabulary is measured


def test_the_vocabulary_is_the_input_embeddings_rows():
    model = _bert()
    assert vocabulary_size(model) == VOCAB
    model.resize_token_embeddings(VOCAB + 6)  # rows added: their ids are valid
    assert vocabulary_size(model) == VOCAB + 6
    check_batch_ids(model, _batch(VOCAB + 5))
    no_embedding = torch.nn.Linear(2, 2)
    assert vocabulary_size(no_embedding) is None
    no_embedding.config = BertConfig(vocab_size=7)
    assert vocabulary_size(no_embedding) == 7
    check_batch_ids(no_embedding, {"pixel_values": torch.zeros(1, 3, 4, 4)})  # no ids: nothing to check
    check_batch_ids(no_embedding, {"input_ids": torch.tensor([[0, 6]])})
    with pytest.raises(ValueError, match="the id 7 is outside the vocabulary of 7 tokens"):
        check_batch_ids(no_embedding, {"input_ids": torch.tensor([[0, 7]])})
