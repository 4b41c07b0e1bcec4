"""hf_tdiag.diagnostics.entry, the behaviours its mutation run found untested. The diagnostics are wrapped when their
modules are imported, so a test of the real diagnostics cannot see a mutant of the wrapping: here small
implementations are wrapped at test time, and their public signature, docstring, keyword errors, thread policy and
model/inputs arguments (by position and by keyword) are checked against the documented forms, written out."""

from __future__ import annotations

import inspect

import pytest
import torch

from hf_tdiag.diagnostics.entry import INPUTS_SECTION, diagnostic_entry
from hf_tdiag.diagnostics.settings import AttentionSVMSettings, SchattenSettings, SRRSettings

KW = inspect.Parameter.KEYWORD_ONLY
POS = inspect.Parameter.POSITIONAL_OR_KEYWORD


def _weights_only(model, *, settings, progress: bool = True) -> dict:
    """Bounds of a model.

    Examples:
        >>> 1
        1
    """
    return {"model": model, "settings": settings, "progress": progress}


def _section(cls) -> str:
    head = f"Settings (keywords, or ``settings={cls.__name__}(...)``; a keyword given replaces the object's value):"
    return "\n".join([head] + [f"    {f.name} (default ``{f.default!r}``): {f.help}; {f.constraint()}." for f in cls.fields()])  # fmt: skip


def test_the_public_signature_is_the_implementations_with_settings_and_every_field_keyword_only():
    entry = diagnostic_entry(SchattenSettings)(_weights_only)
    want = inspect.Signature(
        [
            inspect.Parameter("model", POS),
            inspect.Parameter("settings", KW, default=None, annotation="SchattenSettings | None"),
            inspect.Parameter("L_phi", KW, default=1.13, annotation=float),
            inspect.Parameter("p_grid_m", KW, default=None, annotation=int | None),
            inspect.Parameter("rank_tol", KW, default=1e-10, annotation=float),
            inspect.Parameter("svd_method", KW, default="auto", annotation=str),
            inspect.Parameter("num_workers", KW, default=None, annotation=int | None),
            inspect.Parameter("streaming", KW, default=False, annotation=bool),
            inspect.Parameter("progress", KW, default=True, annotation="bool"),
        ],
        return_annotation="dict",
    )
    assert inspect.signature(entry) == want
    assert entry.settings_class is SchattenSettings and entry.__name__ == "_weights_only"

    def positional_settings(model, settings):  # the entry takes settings= as a keyword whatever the implementation
        return settings

    params = inspect.signature(diagnostic_entry(SchattenSettings)(positional_settings)).parameters
    assert (params["settings"].kind, params["settings"].default) == (KW, None)


def test_the_docstring_gets_the_settings_section_before_its_examples():
    entry = diagnostic_entry(SchattenSettings)(_weights_only)
    assert entry.__doc__ == f"Bounds of a model.\n\n{_section(SchattenSettings)}\n\nExamples:\n    >>> 1\n    1"

    def two_examples(model, *, settings):
        """Two blocks.

        Examples:
            >>> 1
            1

        Examples:
            >>> 2
            2
        """

    doc = diagnostic_entry(SchattenSettings)(two_examples).__doc__  # before the first one
    assert doc.startswith(f"Two blocks.\n\n{_section(SchattenSettings)}\n\nExamples:\n    >>> 1\n")

    def undocumented(model, *, settings):
        return model

    assert diagnostic_entry(SchattenSettings)(undocumented).__doc__.lstrip() == _section(SchattenSettings)


def _measures_inputs(model, inputs, *, settings):
    """Rates of some inputs."""
    return {"model": model, "inputs": inputs, "settings": settings}


def test_a_diagnostic_of_inputs_takes_trust_remote_code_and_tokenizer_and_documents_its_inputs():
    entry = diagnostic_entry(SRRSettings)(_measures_inputs)
    params = inspect.signature(entry).parameters
    assert [n for n, p in params.items() if p.kind is POS] == ["model", "inputs"]
    assert list(params)[-2:] == ["trust_remote_code", "tokenizer"]
    assert (params["trust_remote_code"].kind, params["trust_remote_code"].default) == (KW, False)
    assert (params["tokenizer"].kind, params["tokenizer"].default) == (KW, None)
    assert entry.__doc__ == f"Rates of some inputs.\n\n{_section(SRRSettings)}\n\n{INPUTS_SECTION}"

    def own_tokenizer(model, inputs, *, settings, tokenizer=None):
        return tokenizer

    params = inspect.signature(diagnostic_entry(SRRSettings)(own_tokenizer)).parameters
    assert [n for n in params if n in ("trust_remote_code", "tokenizer")] == ["tokenizer", "trust_remote_code"]
    assert params["tokenizer"].default is None and params["trust_remote_code"].default is False


def test_an_unknown_keyword_is_refused_naming_the_settings_and_the_other_options():
    entry = diagnostic_entry(SchattenSettings)(_weights_only)
    fields = sorted(SchattenSettings.defaults())
    message = f"_weights_only: unknown keyword(s) ['colour']; settings (SchattenSettings): {fields}; other options: ['progress']"  # fmt: skip
    with pytest.raises(TypeError, match=f"^{__import__('re').escape(message)}$"):
        entry("model", colour="red")

    def open_ended(model, *, settings, **extra):
        return extra

    assert diagnostic_entry(SchattenSettings)(open_ended)("model", colour="red", L_phi=2.0) == {"colour": "red"}
    got = entry("model", settings=SchattenSettings(svd_method="svd"), L_phi=2.0, progress=False)
    assert got["settings"] == SchattenSettings(L_phi=2.0, svd_method="svd") and got["progress"] is False


def test_a_small_diagnostic_runs_on_one_thread():
    def threads(model, inputs, *, settings):
        return torch.get_num_threads()

    before = torch.get_num_threads()
    torch.set_num_threads(2)  # more than one, so that the policy's one thread is seen (mutmut runs at one)
    try:
        assert diagnostic_entry(AttentionSVMSettings)(threads)(torch.nn.Linear(2, 2), torch.zeros(2, 3)) == 1
        assert torch.get_num_threads() == 2  # restored after the call
    finally:
        torch.set_num_threads(before)


def test_a_dataset_by_position_or_keyword_reaches_the_implementation_as_batches():
    from datasets import Dataset

    entry = diagnostic_entry(SRRSettings)(_measures_inputs)
    model = torch.nn.Linear(2, 2).train()
    data = Dataset.from_dict({"pixel_values": [[[0.0, 1.0]], [[2.0, 3.0]], [[4.0, 5.0]]], "label": [0, 1, 0]})
    for got in (
        entry(model, data, batch_size=2),
        entry(model, inputs=data, batch_size=2),
        entry(model=model, inputs=data, batch_size=2),
    ):
        assert got["model"] is model and model.training  # a model object: kept as given, its mode restored
        batches = list(got["inputs"])
        assert [b["pixel_values"].tolist() for b in batches] == [[[[0.0, 1.0]], [[2.0, 3.0]]], [[[4.0, 5.0]]]]
        assert all(set(b) == {"pixel_values"} for b in batches)


class _Spy:
    """Stands in for hf_tdiag.batching.model_and_inputs: records its arguments, returns marked objects."""

    def __init__(self, tokenizer_back="loaded-tokenizer"):
        self.calls, self.tokenizer_back = [], tokenizer_back

    def __call__(self, model, inputs, batch_size, *, tokenizer=None, trust_remote_code=False, encode_texts=True):
        self.calls.append(dict(model=model, inputs=inputs, batch_size=batch_size, tokenizer=tokenizer,
                               trust_remote_code=trust_remote_code, encode_texts=encode_texts))  # fmt: skip
        return "loaded-model", "encoded-inputs", self.tokenizer_back


def test_a_model_path_and_raw_inputs_go_to_the_loader_with_the_callers_keywords(monkeypatch):
    spy = _Spy()
    monkeypatch.setattr("hf_tdiag.batching.model_and_inputs", spy)
    entry = diagnostic_entry(SRRSettings)(_measures_inputs)
    for call in (
        lambda: entry("folder", ["a text"], batch_size=3, trust_remote_code=True, tokenizer="user-tokenizer"),
        lambda: entry(model="folder", inputs=["a text"], batch_size=3, trust_remote_code=True, tokenizer="user-tokenizer"),
    ):  # fmt: skip
        got = call()
        assert (got["model"], got["inputs"]) == ("loaded-model", "encoded-inputs")
        assert spy.calls.pop() == dict(model="folder", inputs=["a text"], batch_size=3, tokenizer="user-tokenizer",
                                       trust_remote_code=True, encode_texts=True)  # fmt: skip
    entry("folder", ["a text"])
    assert spy.calls.pop() == dict(model="folder", inputs=["a text"], batch_size=32, tokenizer=None,
                                   trust_remote_code=False, encode_texts=True)  # fmt: skip


def test_a_diagnostic_with_its_own_tokenizer_gets_the_strings_and_the_tokenizer(monkeypatch):
    def own_tokenizer(model, inputs, *, settings, tokenizer=None):
        return inputs, tokenizer

    entry = diagnostic_entry(SRRSettings)(own_tokenizer)
    spy = _Spy()
    monkeypatch.setattr("hf_tdiag.batching.model_and_inputs", spy)
    assert entry("folder", ["a text"], tokenizer="user-tokenizer") == ("encoded-inputs", "loaded-tokenizer")
    assert spy.calls.pop()["tokenizer"] == "user-tokenizer"
    assert entry("folder", ["a text"])[1] == "loaded-tokenizer"
    assert spy.calls.pop()["encode_texts"] is False  # the implementation reads the strings itself
    spy.tokenizer_back = None  # no tokenizer found: the implementation's own default stays
    assert entry("folder", ["a text"])[1] is None


def test_a_diagnostic_without_a_batch_size_setting_encodes_64_at_a_time(monkeypatch):
    spy = _Spy()
    monkeypatch.setattr("hf_tdiag.batching.model_and_inputs", spy)
    diagnostic_entry(AttentionSVMSettings)(_measures_inputs)("folder", ["a text"])
    assert spy.calls.pop()["batch_size"] == 64
