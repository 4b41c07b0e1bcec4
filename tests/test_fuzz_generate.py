"""Text CRATE ``generate`` past the learned positions (issue 45), one table: a prompt plus ``max_new_tokens`` (or
``max_length``) that cannot fit is refused before any token is generated, naming the prompt length, what was asked
and the largest ``max_new_tokens`` that fits; what fits generates exactly as asked (the last generated token is never
fed back, so a sequence may end one past the positions)."""

from __future__ import annotations

import pytest
import torch

from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM

OK = "ok"


def _model(positions: int = 16, offset: int = 0) -> CrateTextForCausalLM:
    torch.manual_seed(0)
    config = CrateTextConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ista_dictionary_size=16,
                             vocab_size=50, max_position_embeddings=positions, position_offset=offset,
                             is_decoder=True)  # fmt: skip
    return CrateTextForCausalLM(config).eval()


def _generate(prompt: int, batch: int = 1, positions: int = 16, offset: int = 0, **kw):
    ids = torch.randint(0, 50, (batch, prompt), generator=torch.Generator().manual_seed(prompt))
    model = _model(positions, offset)
    calls = []
    original = model.forward

    def counted(*args, **kwargs):  # a refusal must come before the first forward pass
        calls.append(1)
        return original(*args, **kwargs)

    model.forward = counted
    try:
        out = model.generate(ids, do_sample=False, eos_token_id=None, pad_token_id=0, **kw)
    except ValueError:
        assert not calls, "refused after generating"
        raise
    return tuple(out.shape)


# (id, call, expected: (OK, shape) or (ValueError, text in the one-line message))
CASES = [
    ("fits exactly: 4 + 13 on 16 positions", lambda: _generate(4, max_new_tokens=13), (OK, (1, 17))),
    ("one token past: 4 + 14", lambda: _generate(4, max_new_tokens=14), (ValueError, "a prompt of 4 tokens with max_new_tokens=14 would run past the model's 16 positions")),
    ("far past: 4 + 1000", lambda: _generate(4, max_new_tokens=1000), (ValueError, "pass max_new_tokens <= 13 or a shorter prompt")),
    ("max_length past", lambda: _generate(4, max_length=30), (ValueError, "max_length=30 (up to 26 new)")),
    ("max_length fits", lambda: _generate(4, max_length=17), (OK, (1, 17))),
    ("prompt fills the positions, 1 new", lambda: _generate(16, max_new_tokens=1), (OK, (1, 17))),
    ("prompt fills the positions, 2 new", lambda: _generate(16, max_new_tokens=2), (ValueError, "pass max_new_tokens <= 1")),
    ("prompt longer than the positions", lambda: _generate(17, max_new_tokens=1), (ValueError, "pass a prompt of at most 16 tokens")),
    ("batch of 3 past", lambda: _generate(5, batch=3, max_new_tokens=20), (ValueError, "a prompt of 5 tokens with max_new_tokens=20")),
    ("position offset 2: 14 positions", lambda: _generate(4, offset=2, max_new_tokens=12), (ValueError, "the model's 14 positions (max_position_embeddings=16); pass max_new_tokens <= 11")),
    ("position offset 2: fits", lambda: _generate(4, offset=2, max_new_tokens=11), (OK, (1, 15))),
    ("default length (the model's positions)", lambda: _generate(4), (OK, (1, 16))),
    ("min_new_tokens past", lambda: _generate(4, max_new_tokens=30, min_new_tokens=30), (ValueError, "max_new_tokens=30")),
    ("beam search past", lambda: _generate(4, max_new_tokens=14, num_beams=2), (ValueError, "max_new_tokens=14")),
]  # fmt: skip


def classify(call, expected) -> str:
    kind, value = expected
    try:
        result = call()
    except AssertionError:  # refused only after generating
        return "unclear"
    except ValueError as exc:
        text = str(exc)
        return "clear" if kind is ValueError and value in text and "\n" not in text else "unclear"
    except Exception:  # noqa: BLE001 - a raw exception is one of the outcomes
        return "raw"
    return ("handled" if result == value else "silent-wrong") if kind == OK else "silent-wrong"


def tally() -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, call, expected in CASES:
        outcome = classify(call, expected)
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


@pytest.mark.parametrize("case, call, expected", CASES, ids=[c[0] for c in CASES])
def test_generate_case(case, call, expected):
    kind, value = expected
    if kind == OK:
        assert call() == value
        return
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert value in message and "\n" not in message, message
