"""Text that is on every machine without a download: CPython's documentation topics (``pydoc_data.topics``, about
465 k characters of English with code examples, shipped with every CPython), as a language-modelling corpus split by
topic, a byte-level BPE tokenizer trained on it with the ``tokenizers`` library, fixed-length token blocks, and a
labelled task built from it (which topic a paragraph comes from).

Used by ``recipes/train_crate_lm.py`` (pre-training and fine-tuning the text CRATE models and their baselines) and
by the Space's default text model (:mod:`hf_tdiag.gradio_app.default_text_model`).
"""

from __future__ import annotations

import torch

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<mask>"]

__all__ = ["SPECIALS", "corpus", "token_blocks", "topic_paragraphs", "train_tokenizer"]


def corpus(val_every: int, max_train_topics: int | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """``(train, val)`` topic name -> text from ``pydoc_data.topics``; every ``val_every``-th sorted topic is val
    (the first ``max_train_topics`` of the others train, all by default)."""
    from pydoc_data.topics import topics

    if val_every < 2:
        raise ValueError(f"val_every: expected an integer >= 2 (every n-th topic is held out), got {val_every}")
    names = sorted(topics)
    val = {n: topics[n] for i, n in enumerate(names) if i % val_every == val_every - 1}
    train = [n for n in names if n not in val][:max_train_topics]
    return {n: topics[n] for n in train}, val


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE trained on ``texts`` with ``tokenizers``, wrapped as a ``PreTrainedTokenizerFast`` with the
    special tokens :data:`SPECIALS` (pad, unk, bos, eos, mask)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        mask_token="<mask>",
    )


def token_blocks(tokenizer, texts: list[str], block_size: int) -> torch.Tensor:
    """``(n, block_size)`` token ids: the texts joined by ``</s>`` and cut into consecutive blocks."""
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id])
    n = len(ids) // block_size
    if n == 0:
        raise ValueError(f"the corpus has {len(ids)} tokens, fewer than one block of {block_size}")
    return torch.tensor(ids[: n * block_size]).view(n, block_size)


def topic_paragraphs(tokenizer, texts: dict[str, str], n_topics: int, block_size: int, seed: int):
    """``(topics, [(ids, mask, labels) of the train split, of the held-out split])``: the paragraphs (>= 80
    characters) of the ``n_topics`` longest topics, labelled by topic, padded/cut to ``block_size`` tokens, shuffled
    with ``seed`` and split 80/20."""
    chosen = sorted(texts, key=lambda n: (-len(texts[n]), n))[:n_topics]
    paragraphs = [(p.strip(), k) for k, n in enumerate(chosen) for p in texts[n].split("\n\n") if len(p.strip()) >= 80]
    enc = tokenizer([p for p, _ in paragraphs], truncation=True, max_length=block_size, padding="max_length",
                    return_tensors="pt")  # fmt: skip
    labels = torch.tensor([k for _, k in paragraphs])
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(order))
    split = (order[:cut], order[cut:])
    return chosen, [(enc.input_ids[s], enc.attention_mask[s], labels[s]) for s in split]
