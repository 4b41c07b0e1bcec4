"""Bad model inputs to the Python diagnostics (issue 45), one table: NaN, inf and float32-overflowing pixel values given
as a tensor, a dict batch or batches, and finite inputs that a model turns into NaN. Each case expects a one-line
ValueError naming the user's input (``pixel_values: contains NaN at index ...``, ``values up to ... overflow
float32``) or, for NaN made inside the model, the block that produced it — never an internal name (``Z:``, ``A:``,
``D:``) — or a result a user means (``OK``: the report's numbers finite). :func:`tally` classes the table (clear /
handled / unclear / raw / silent-wrong) for the issue's before/after counts. Models: a 2-block 8x8 CRATE."""

from __future__ import annotations

import math

import pytest
import torch

import hf_tdiag
from hf_tdiag.diagnostics.attention_svm import attention_svm_diagnostic
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification

OK = "ok"


def _model(scale: dict[str, float] | None = None, nan: str | None = None) -> CrateForImageClassification:
    """The tiny CRATE, its parameters named in ``scale`` multiplied (finite, too large) or ``nan`` given one NaN."""
    torch.manual_seed(0)
    config = CrateConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_labels=3)  # fmt: skip
    model = CrateForImageClassification(config).eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, factor in (scale or {}).items():
            params[name].mul_(factor)
        if nan:
            params[nan].view(-1)[0] = float("nan")
    return model


def _pixels(value: float | None = None, at=(1, 0, 2, 3), scale: float = 1.0) -> torch.Tensor:
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(1)) * scale
    if value is not None:
        x[at] = value
    return x


def _srr(model, inputs):
    return hf_tdiag.layer_srr(model, inputs, progress=False).per_layer("srr")


def _ledger(model, inputs):
    return [s.after for s in hf_tdiag.objective_ledger(model, inputs).steps]


def _concepts(model, inputs, layer=2):
    return [hf_tdiag.concept_fidelity(model, inputs, layer=layer, n_concepts=2).summary()["kl"]]


def _svm(model, inputs, layer=1):
    return [attention_svm_diagnostic(model, inputs, layer=layer, head=0, max_queries=4).summary()["correlation"]]


def _finite(values) -> bool:
    return all(math.isfinite(float(v)) for v in values)


NAN, INF = float("nan"), float("inf")
BIG_BLOCK2 = {"crate.encoder.layer.1.ista.weight": 1e30}  # finite weights, too large: block 2 overflows
BIG_EMBED = {"crate.embeddings.patch_embeddings.projection.weight": 1e30}
# the Att-SVM of a block-1 head reads block 1's input only: block 2's weights cannot change it (a result, not an error)
_BLOCK2 = {
    False: (ValueError, "model: block 2's output contains NaN or inf although its inputs are finite"),
    True: (OK, _finite),
}
_NAN_WEIGHT = {False: (ValueError, "weight 'crate.encoder.layer.1.ista.weight'"), True: (OK, _finite)}
DIAGNOSTICS = {"srr": _srr, "ledger": _ledger, "concepts": _concepts, "svm": _svm}

# (id, call() -> result, expected: (OK, check(result)) or (exception type, text in its one-line message))
CASES = []
for _name, _fn in DIAGNOSTICS.items():
    CASES += [
        (
            f"{_name}: NaN pixel",
            lambda f=_fn: f(_model(), _pixels(NAN)),
            (ValueError, "pixel_values: contains NaN at index (1, 0, 2, 3)"),
        ),
        (
            f"{_name}: +inf pixel",
            lambda f=_fn: f(_model(), _pixels(INF, at=(0, 0, 0, 0))),
            (ValueError, "pixel_values: contains inf at index (0, 0, 0, 0)"),
        ),
        (
            f"{_name}: -inf in a dict batch",
            lambda f=_fn: f(_model(), {"pixel_values": _pixels(-INF)}),
            (ValueError, "pixel_values: contains inf"),
        ),
        (f"{_name}: pixels of 1e30", lambda f=_fn: f(_model(), _pixels(scale=1e30)), (ValueError, "overflow float32")),
        (
            f"{_name}: one pixel of 1e20",
            lambda f=_fn: f(_model(), _pixels(1e20)),
            (ValueError, "pixel_values: values up to 1e+20 overflow float32"),
        ),
        (
            f"{_name}: pixels of 1e30 in a dict batch",
            lambda f=_fn: f(_model(), {"pixel_values": _pixels(scale=1e30)}),
            (ValueError, "pixel_values: values up to"),
        ),
        (f"{_name}: pixels of 1e12 are measured", lambda f=_fn: f(_model(), _pixels(scale=1e12)), (OK, _finite)),
        (
            f"{_name}: finite inputs, block 2's weights 1e30",
            lambda f=_fn: f(_model(BIG_BLOCK2), _pixels()),
            _BLOCK2[_fn is _svm],
        ),
        (
            f"{_name}: finite inputs, embedding weights 1e30",
            lambda f=_fn: f(_model(BIG_EMBED), _pixels(), *([1] if f in (_concepts, _svm) else [])),
            (ValueError, "model: the embedding output (block 0) contains NaN"),
        ),
        (
            f"{_name}: a NaN weight in block 2",
            lambda f=_fn: f(_model(nan="crate.encoder.layer.1.ista.weight"), _pixels()),
            _NAN_WEIGHT[_fn is _svm],
        ),
    ]
CASES += [
    ("srr: NaN in the second batch of a list", lambda: _srr(_model(), [_pixels()[:2], _pixels(NAN, at=(0, 0, 1, 1))[:2]]), (ValueError, "pixel_values: contains NaN at index (0, 0, 1, 1)")),
    ("ledger: 1e30 in the second batch of a list", lambda: _ledger(_model(), [_pixels()[:2], _pixels(scale=1e30)[:2]]), (ValueError, "overflow float32")),
    ("srr: 1e30 from a DataLoader", lambda: _srr(_model(), torch.utils.data.DataLoader(_pixels(scale=1e30), batch_size=2)), (ValueError, "overflow float32")),
    ("srr: float64 pixels of 1e300", lambda: _srr(_model(), _pixels().double() * 1e300), (ValueError, "values up to")),
    ("srr: float16 NaN", lambda: _srr(_model(), _pixels(NAN).half()), (ValueError, "pixel_values: contains NaN")),
    ("srr: NaN in a labels-free dict beside ids", lambda: _srr(_model(), {"pixel_values": _pixels(NAN), "labels": torch.zeros(4, dtype=torch.long)}), (ValueError, "pixel_values: contains NaN")),
    ("srr: clean pixels measured", lambda: _srr(_model(), _pixels()), (OK, _finite)),
    ("svm: block 2's head, block 1's weights 1e30", lambda: _svm(_model({"crate.encoder.layer.0.ista.weight": 1e30}), _pixels(), 2), (ValueError, "model: block 1's output contains NaN")),
]  # fmt: skip


def classify(call, expected) -> str:
    """The outcome class of one case: clear (a one-line ValueError/TypeError with the expected text), unclear (one
    without it, e.g. naming an internal tensor), raw (any other exception), handled / silent-wrong (a result)."""
    kind, value = expected
    try:
        result = call()
    except (ValueError, TypeError) as exc:
        text = str(exc)
        if kind == OK:
            return "unclear"
        return "clear" if isinstance(exc, kind) and value in text and "\n" not in text else "unclear"
    except Exception:  # noqa: BLE001 - a raw exception is one of the outcomes
        return "raw"
    if kind == OK:
        return "handled" if value(result) else "silent-wrong"
    return "silent-wrong"


def tally() -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, call, expected in CASES:
        outcome = classify(call, expected)
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


@pytest.mark.parametrize("case, call, expected", CASES, ids=[c[0] for c in CASES])
def test_model_input_case(case, call, expected):
    kind, value = expected
    if kind == OK:
        assert value(call())
        return
    with pytest.raises(kind) as info:
        call()
    message = str(info.value)
    assert value in message and "\n" not in message, message
