"""hf_tdiag.batching, the behaviours its mutation run found untested: a dict-like batch that is not a Mapping, the
accelerator branch of iter_batches (batch size, a DataLoader prepared once), and encoded_batches' tokenizer call
(the caller's tokenizer, truncation to max_length, right padding whatever the tokenizer's own side, the default
error name and a caller's hint). Every expected value is written out by hand from a nine-word vocabulary."""

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

from hf_tdiag.batching import encoded_batches, iter_batches
from hf_tdiag.loading import LoadedModel

WORDS = ["[UNK]", "</s>", "[PAD]", "the", "cat", "sat", "on", "a", "mat"]


class DictLike:
    """keys/values/items/__getitem__ without being a collections.abc.Mapping (and without __iter__)."""

    def __init__(self, data):
        self._data = dict(data)

    def keys(self):
        return self._data.keys()

    def values(self):
        return self._data.values()

    def items(self):
        return self._data.items()

    def __getitem__(self, key):
        return self._data[key]


def test_a_dict_like_batch_that_is_not_a_mapping_is_cut_into_chunks():
    x = torch.arange(10).reshape(5, 2)
    chunks = iter_batches(DictLike({"input_ids": x}), 2)
    assert [c["input_ids"].tolist() for c in chunks] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9]]]


def test_an_accelerator_gets_batches_of_batch_size_and_a_dataloader_is_prepared_once():
    from accelerate import Accelerator
    from accelerate.data_loader import DataLoaderShard

    acc = Accelerator(cpu=True)
    x = torch.arange(5.0).reshape(5, 1)
    loader = iter_batches(x, 2, accelerator=acc)
    assert isinstance(loader, DataLoaderShard)  # the tensor is read through a sharding loader, not cut locally
    assert [b.flatten().tolist() for b in loader] == [[0.0, 1.0], [2.0, 3.0], [4.0]]
    plain = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=3)
    prepared = iter_batches(plain, 2, accelerator=acc)
    assert isinstance(prepared, DataLoaderShard)  # a plain DataLoader is prepared for the accelerator
    assert iter_batches(prepared, 2, accelerator=acc) is prepared  # an already prepared one is left as given


def _tokenizer(order=WORDS, side="right") -> PreTrainedTokenizerFast:
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(order)}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>", pad_token="[PAD]",
                                   padding_side=side)  # fmt: skip


def _model(tokenizer, positions: int) -> LoadedModel:
    cfg = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, vocab_size=9,
                     max_position_embeddings=positions)  # fmt: skip
    return LoadedModel(BertModel(cfg).eval(), tokenizer, "tiny-bert", "text")


def test_texts_are_cut_to_max_length_default_128_and_padded_on_the_right_even_for_a_left_padding_tokenizer():
    loaded = _model(_tokenizer(side="left"), positions=512)
    (batch,) = list(encoded_batches(loaded, ["the cat " * 100, "a mat"], 2))
    assert batch["input_ids"].shape == (2, 128)  # 200 tokens cut to the default max_length
    assert batch["input_ids"][0].tolist() == [3, 4] * 64
    assert batch["input_ids"][1].tolist() == [7, 8] + [2] * 126  # "a mat", then [PAD] on the right
    assert batch["attention_mask"][1].tolist() == [1, 1] + [0] * 126


def test_a_text_longer_than_the_model_fits_once_cut_to_a_shorter_max_length():
    loaded = _model(_tokenizer(), positions=16)
    (batch,) = list(encoded_batches(loaded, ["the cat " * 10], 2, max_length=8))  # 20 tokens, cut to 8 <= 16
    assert batch["input_ids"].tolist() == [[3, 4, 3, 4, 3, 4, 3, 4]]


def test_the_callers_tokenizer_encodes_the_texts_not_the_models():
    reversed_words = list(reversed(WORDS))  # "the" -> 5, "cat" -> 4, "mat" -> 0 ... "[PAD]" -> 6
    loaded = _model(_tokenizer(), positions=16)
    (batch,) = list(encoded_batches(loaded, ["the cat", "mat"], 2, tokenizer=_tokenizer(reversed_words)))
    assert batch["input_ids"].tolist() == [[5, 4], [0, 6]]


def test_too_long_texts_are_named_inputs_by_default_and_a_callers_hint_is_shown():
    loaded = _model(_tokenizer(), positions=16)
    with pytest.raises(
        ValueError,
        match=r"^inputs: text 2 \(.*\): 40 tokens, .* 16 token positions .*; pass --max-length 16, or shorter texts$",
    ):
        encoded_batches(loaded, ["a mat", "the cat " * 20], 2, max_length=64)
    with pytest.raises(ValueError, match=r"^inputs: text 1 .*\); keep texts under 16 tokens$"):
        encoded_batches(loaded, ["the cat " * 20], 2, max_length=64, hint="keep texts under {limit} tokens")
