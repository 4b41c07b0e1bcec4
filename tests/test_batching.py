"""hf_tdiag.batching: the one way inputs become batches (tensors, dict batches, DataLoaders, raw images and texts)."""

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

from hf_tdiag.batching import concat, encoded_batches, iter_batches, rows, split
from hf_tdiag.loading import LoadedModel, load_model


def test_split_then_concat_gives_the_batch_back_and_keeps_non_tensor_values():
    x = torch.arange(7 * 3).reshape(7, 3)
    parts = split(x, 3)
    assert [p.shape[0] for p in parts] == [3, 3, 1] and torch.equal(concat(parts), x)
    batch = {"input_ids": x, "attention_mask": torch.ones(7, 3), "return_loss": True}
    chunks = split(batch, 2)
    assert [rows(c) for c in chunks] == [2, 2, 2, 1] and all(c["return_loss"] is True for c in chunks)
    assert torch.equal(concat(chunks)["input_ids"], x) and "return_loss" not in concat(chunks)


def test_iter_batches_cuts_tensors_and_dicts_and_passes_iterables_through():
    x = torch.randn(5, 2)
    assert [b.shape[0] for b in iter_batches(x, 2)] == [2, 2, 1]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4)
    assert iter_batches(loader, 2) is loader  # a DataLoader keeps its own batches without an accelerator
    given = [x[:1], x[1:]]
    assert iter_batches(given, 2) is given
    with pytest.raises(ValueError, match="expected a batched tensor, got a scalar"):
        iter_batches(torch.tensor(1.0), 2)
    with pytest.raises(ValueError, match="needs at least one tensor with a batch dimension"):
        iter_batches({"flag": True}, 2)
    with pytest.raises(TypeError, match="inputs: expected model inputs .* got str"):
        iter_batches("pixels", 2)


def test_iter_batches_shards_a_tensor_across_processes_with_an_accelerator():
    from accelerate import Accelerator

    x = torch.arange(10.0).reshape(10, 1)
    batches = list(iter_batches(x, 4, accelerator=Accelerator(cpu=True)))
    assert torch.equal(torch.cat(batches), x)  # one process: every sample once, in order


def _word_tokenizer(pad: bool) -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", "[PAD]", "the", "cat", "sat", "on", "a", "mat"])}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>",
                                   pad_token="[PAD]" if pad else None)  # fmt: skip


def _text_model(tokenizer) -> LoadedModel:
    cfg = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, vocab_size=9,
                     max_position_embeddings=16)  # fmt: skip
    return LoadedModel(BertModel(cfg).eval(), tokenizer, "tiny-bert", "text")


def test_texts_are_padded_on_the_right_in_chunks_and_a_missing_pad_token_is_the_eos():
    loaded = _text_model(_word_tokenizer(pad=False))
    texts = ["the cat sat", "a mat", "the cat sat on a mat"]
    batches = list(encoded_batches(loaded, texts, 2))
    assert len(batches) == 2 and loaded.processor.pad_token == "</s>"
    first = batches[0]
    assert first["input_ids"].tolist() == [[3, 4, 5], [7, 8, 1]]  # right padding with the eos id
    assert first["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    user = _word_tokenizer(pad=False)
    with pytest.raises(ValueError):  # a tokenizer the caller passes is used as given, never changed
        list(encoded_batches(_text_model(None), texts, 2, tokenizer=user))
    assert user.pad_token is None


def test_texts_longer_than_the_model_are_refused_before_any_batch_and_images_need_an_image_model():
    loaded = _text_model(_word_tokenizer(pad=True))
    with pytest.raises(ValueError, match=r"--texts 'x.txt'.*pass --max-length 16"):
        encoded_batches(loaded, ["the cat " * 20], 2, max_length=64, name="--texts 'x.txt'")
    with pytest.raises(ValueError, match="texts: 'tiny-bert' is an image model"):
        encoded_batches(LoadedModel(loaded.model, None, "tiny-bert", "image"), ["the cat"], 2)


def test_images_become_the_processors_pixel_values_chunk_by_chunk(tmp_path):
    from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor
    from hf_tdiag.inputs import digits_images

    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10))
    model.save_pretrained(tmp_path)
    CrateImageProcessor.for_config(model.config).save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    images = digits_images(limit=5).images
    batches = list(encoded_batches(loaded, images, 2))
    whole = CrateImageProcessor.for_config(model.config)(images=images, return_tensors="pt")["pixel_values"]
    assert [b.shape[0] for b in batches] == [2, 2, 1] and torch.equal(concat(batches), whole)


def test_token_ids_outside_the_vocabulary_or_empty_are_refused_naming_the_input():
    import hf_tdiag

    model = _text_model(None).model
    with pytest.raises(ValueError, match="inputs: input_ids: the id 40 is outside the vocabulary of 9 tokens"):
        hf_tdiag.layer_srr(model, {"input_ids": torch.tensor([[1, 2, 40]])}, progress=False)
    with pytest.raises(ValueError, match=r"inputs: input_ids: no tokens \(shape \(1, 0\)\)"):
        hf_tdiag.layer_srr(model, {"input_ids": torch.zeros(1, 0, dtype=torch.long)}, progress=False)
