"""Small decoder LLMs of four families built from configs and saved with ``save_pretrained`` in several safetensors
shards (a small ``max_shard_size``), shared by the decoder tests. Import the fixtures into a test module."""

import json
import os

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
)

SHARD = "16KB"
VOCAB = 64


def configs():
    common = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return {
        "gpt2": GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=64, **common),
        # GQA: 8 query heads, 2 key/value heads; untied embeddings
        "llama": LlamaConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=8,
            num_key_value_heads=2,
            intermediate_size=96,
            max_position_embeddings=64,
            tie_word_embeddings=False,
            **common,
        ),
        "mistral": MistralConfig(
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
            max_position_embeddings=64,
            sliding_window=16,
            tie_word_embeddings=False,
            **common,
        ),
        # q/k/v biases, one K/V head for all four query heads, tied embeddings
        "qwen2": Qwen2Config(
            num_hidden_layers=3,
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=1,
            intermediate_size=40,
            max_position_embeddings=64,
            tie_word_embeddings=True,
            **common,
        ),
    }


def build(family: str, seed: int = 0) -> torch.nn.Module:
    """A CausalLM of ``family`` with random weights; biases made non-zero so they are exercised."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(configs()[family])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif p.ndim == 2 and "emb" not in name and "wte" not in name and "wpe" not in name:
                p.normal_(0, 0.3)  # larger than the 0.02 init: spectra well away from the rank threshold
    return model.eval()


def save_sharded(model, path) -> str:
    model.save_pretrained(path, max_shard_size=SHARD)
    index = os.path.join(path, "model.safetensors.index.json")
    assert os.path.isfile(index), "expected a sharded checkpoint"
    with open(index) as fh:
        assert len(set(json.load(fh)["weight_map"].values())) >= 3
    return str(path)


@pytest.fixture(scope="session")
def decoder_dirs(tmp_path_factory):
    """family -> folder of a sharded checkpoint (written once per session under pytest's tmp path)."""
    out = {}
    for family in configs():
        out[family] = save_sharded(build(family), tmp_path_factory.mktemp(f"dec_{family}"))
    return out


@pytest.fixture(scope="session")
def decoder_models(decoder_dirs):
    """family -> the CausalLM loaded back from its sharded folder (float32, eval mode, eager attention)."""
    return {
        f: AutoModelForCausalLM.from_pretrained(p, attn_implementation="eager", dtype=torch.float32).eval()
        for f, p in decoder_dirs.items()
    }


def char_tokenizer(bos: bool = True):
    """An offline character-level tokenizer for the test vocabulary (64 ids): ``<s>`` = 0 (prepended when ``bos``, as
    Llama's tokenizer does), ``</s>`` = 1 (also the pad token), ``<unk>`` = 2, then lowercase letters, digits and
    punctuation."""
    import string

    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = string.ascii_lowercase + string.digits + " .,!?'-"
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )


TEXTS = [
    "the cat sat on the warm mat today",
    "a dog ran fast across the green park",
    "red sun sets slowly over the hill",
    "cold rain falls on the old roof",
    "we eat fresh bread and hot soup",
    "the home team won the cup again",
    "my phone needs a new battery now",
    "snow covers the quiet mountain road",
]
