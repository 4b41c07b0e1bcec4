"""The study's SRR columns by value, and the collector's contract (values, errors, details) on stubs.

References: the per-layer SRR of the block outputs computed here from the model's own hidden states with
``sparse_rate_reduction`` and the model's U, with non-default eps/lambda so a dropped setting shows.
"""

import math

import pytest
import torch

import hf_tdiag  # noqa: F401  (registers CRATE)
from hf_tdiag.measures.coding_rate import sparse_rate_reduction
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification
from hf_tdiag.probes.subspaces import subspaces
from hf_tdiag.study import MeasureSettings, compute_measures
from hf_tdiag.study import measures as sm

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _model(layers: int = 3):
    torch.manual_seed(0)
    config = CrateConfig.from_preset(
        "crate-digits", hidden_size=16, num_hidden_layers=layers, num_attention_heads=2, num_labels=3, pooling="mean"
    )
    return CrateForImageClassification(config).eval()


# small, non-default SRR settings; cheap flatness searches (their values are checked in test_study_measures.py)
SETTINGS = MeasureSettings(
    max_examples=10,
    batch_size=4,
    srr_eps=0.37,
    srr_lambda=2.5,
    flatness_examples=4,
    flatness_depth=2,
    sharpness_steps=1,
    pac_draws=2,
)


def _reference_per_layer(model, x, settings):
    with torch.no_grad():
        hidden = model(pixel_values=x, output_hidden_states=True).hidden_states[1:]  # block outputs Z^1..Z^L
    U = subspaces(model, "query", detach=True)
    assert len(hidden) == len(U)
    return [
        float(sparse_rate_reduction(z.double(), u.double(), eps=settings.srr_eps, lam=settings.srr_lambda).mean())
        for z, u in zip(hidden, U)
    ]


def test_srr_columns_are_the_block_outputs_srr_mean_and_last():
    model = _model()
    torch.manual_seed(1)
    x, y = torch.randn(12, 1, 8, 8), torch.randint(0, 3, (12,))
    values, errors = compute_measures(model, x, y, SETTINGS)
    ref = _reference_per_layer(model, x[: SETTINGS.max_examples], SETTINGS)
    assert "srr_mean" not in errors and "srr_last" not in errors
    assert values["_srr_per_layer"] == pytest.approx(ref, rel=1e-4, abs=1e-5)
    assert values["srr_mean"] == pytest.approx(sum(ref) / len(ref), rel=1e-4, abs=1e-5)
    assert values["srr_last"] == pytest.approx(ref[-1], rel=1e-4, abs=1e-5)
    # the settings matter: the default eps/lambda give different numbers (so the test sees a dropped argument)
    default = _reference_per_layer(model, x[: SETTINGS.max_examples], MeasureSettings())
    assert abs(default[-1] - ref[-1]) > 1e-2 and abs(sum(default) - sum(ref)) > 1e-2
    assert len(set(round(v, 4) for v in ref)) == len(ref)  # distinct layers: mean vs last vs sum are told apart


def test_srr_columns_record_the_error_when_the_srr_cannot_be_measured():
    model = _model(layers=2)
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "attn" in n or "attention" in n).fill_(float("nan"))
    out = sm._Collector()
    sm._srr_columns(out, model, torch.randn(4, 1, 8, 8), SETTINGS, False)
    assert out.values == {"srr_mean": None, "srr_last": None}
    assert set(out.errors) == {"srr_mean", "srr_last"}
    assert out.errors["srr_mean"] == out.errors["srr_last"]
    assert out.errors["srr_mean"].startswith("ValueError: ")
    assert "NaN" in out.errors["srr_mean"]


def test_finite_or_none():
    assert sm._finite_or_none(None) is None
    assert sm._finite_or_none(2) == 2.0 and isinstance(sm._finite_or_none(2), float)
    assert sm._finite_or_none(torch.tensor(-1.5)) == -1.5
    for bad in (float("nan"), float("inf"), -math.inf, torch.tensor(float("nan"))):
        assert sm._finite_or_none(bad) is None


def test_collector_keeps_finite_values_and_explains_the_rest():
    out = sm._Collector()
    assert out.values == {} and out.errors == {} and out.details == {}
    out.attempt("ok", lambda: 3.25)
    out.attempt("nan", lambda: float("nan"))
    out.attempt("inf", lambda: math.inf)

    def raises_value():
        raise ValueError("bad logits")

    def raises_runtime():
        raise RuntimeError("out of memory")

    out.attempt("v", raises_value)
    out.attempt("r", raises_runtime)
    out.attempt("search", lambda: {"flatness": 4.0, "alpha": 0.5, "met": True})
    out.attempt("search_nan", lambda: {"flatness": float("nan"), "sigma": 2.0})
    assert out.values == {"ok": 3.25, "nan": None, "inf": None, "v": None, "r": None, "search": 4.0, "search_nan": None}
    assert out.values["v"] is None and out.values["r"] is None
    assert out.errors == {
        "nan": "not finite",
        "inf": "not finite",
        "v": "ValueError: bad logits",
        "r": "RuntimeError: out of memory",
        "search_nan": "not finite",
    }
    assert out.details == {"search": {"alpha": 0.5, "met": True}, "search_nan": {"sigma": 2.0}}


def test_collector_lets_other_errors_through():
    out = sm._Collector()

    def raises_type():
        raise TypeError("not a tensor")

    with pytest.raises(TypeError, match="not a tensor"):
        out.attempt("t", raises_type)


def test_weight_columns_and_the_table_keys():
    model = _model()
    torch.manual_seed(1)
    x, y = torch.randn(12, 1, 8, 8), torch.randint(0, 3, (12,))
    details: dict = {}
    values, errors = compute_measures(model, x, y, SETTINGS, details=details)
    assert set(values) == set(sm.MEASURES) | {"_srr_per_layer"}
    assert set(errors) <= {"inverse_margin"}  # this untrained model misclassifies: its margin is undefined
    # the weights named by hand: patch projection, per block U (qkv), the output matrix and the ISTA dictionary
    params = dict(model.named_parameters())
    names = ["crate.embeddings.patch_embeddings.projection.weight", "classifier.weight"] + [
        f"crate.encoder.layer.{i}.{m}.weight" for i in range(3) for m in ("attention.qkv", "attention.out_proj", "ista")
    ]
    ws = [params[n].detach().double() for n in names]
    log_spec = [2 * math.log(float(torch.linalg.matrix_norm(w, ord=2))) for w in ws]
    assert values["l2"] == pytest.approx(sum(float((w**2).sum()) for w in ws), rel=1e-6)
    assert values["log_prod_of_spec"] == pytest.approx(sum(log_spec), rel=1e-6)
    assert values["sum_of_spec"] == pytest.approx(len(ws) * math.exp(sum(log_spec) / len(ws)), rel=1e-6)
    # the searches ran with the settings: at most `depth` bisection steps, scales inside [0, upper]
    assert set(details) == {"sharpness_mag", "pacbayes_flatness", "pacbayes_flatness_mag"}
    for name, d in details.items():
        scale = d.get("alpha", d.get("sigma"))
        assert 0 < scale <= SETTINGS.flatness_upper and d["evaluations"] <= SETTINGS.flatness_depth
        assert values[name] == pytest.approx(1 / scale**2)


def test_flatness_columns_pass_every_setting(monkeypatch):
    from hf_tdiag.measures import sharpness

    calls = {}

    def spy(name):
        def search(logits_fn, params, batches, **kwargs):
            calls[name] = kwargs
            return {"flatness": 4.0, "scale": 0.5}

        return search

    for name in ("sharpness_mag", "pacbayes_flatness", "pacbayes_flatness_mag"):
        monkeypatch.setattr(sharpness, name, spy(name))
    s = MeasureSettings(
        flatness_target=0.2,
        flatness_tolerance=0.03,
        flatness_depth=4,
        flatness_upper=3.0,
        magnitude_eps=0.05,
        sharpness_steps=3,
        pac_draws=5,
        seed=7,
    )
    out = sm._Collector()
    sm._flatness_columns(out, _model(layers=1), [], [], s, False)
    search = dict(target=0.2, tolerance=0.03, depth=4, progress=False)
    assert calls["sharpness_mag"] == dict(eps=0.05, alpha_max=3.0, steps=3, **search)
    assert calls["pacbayes_flatness"] == dict(draws=5, sigma_max=3.0, seed=7, **search)
    assert calls["pacbayes_flatness_mag"] == dict(eps=0.05, draws=5, sigma_max=3.0, seed=7, **search)
    assert out.values == dict.fromkeys(calls, 4.0)


def test_compute_measures_margin_batches_and_progress(monkeypatch):
    """The inverse margin over the first ``max_examples`` logits computed in batches, with the settings' quantile;
    the flatness searches get the first ``flatness_examples`` in order; ``progress`` reaches every search."""
    from hf_tdiag.diagnostics import srr
    from hf_tdiag.measures import sharpness

    model = _model()
    torch.manual_seed(2)
    x = torch.randn(13, 1, 8, 8)
    with torch.no_grad():
        y = model(pixel_values=x).logits.argmax(1)  # every example classified correctly: the margin is defined
    settings = MeasureSettings(max_examples=11, batch_size=4, flatness_examples=6, margin_quantile=0.3)
    seen = {"progress": [], "batches": []}
    real_layer_srr = srr.layer_srr

    def layer_srr_spy(*args, **kwargs):
        seen["progress"].append(kwargs["progress"])
        return real_layer_srr(*args, **kwargs)

    def search_spy(logits_fn, params, batches, **kwargs):
        seen["progress"].append(kwargs["progress"])
        seen["batches"].append(batches)
        return {"flatness": 2.0}

    monkeypatch.setattr(srr, "layer_srr", layer_srr_spy)
    for name in ("sharpness_mag", "pacbayes_flatness", "pacbayes_flatness_mag"):
        monkeypatch.setattr(sharpness, name, search_spy)

    values, errors = compute_measures(model, x, y, settings)
    # reference: 0.3-quantile (linear interpolation) of the 11 margins "true logit - best other logit", one forward
    with torch.no_grad():
        z = model(pixel_values=x[:11]).logits.double()
    true = z[torch.arange(11), y[:11]]
    others = z.clone()
    others[torch.arange(11), y[:11]] = -math.inf
    margins = sorted((true - others.max(1).values).tolist())
    pos = 0.3 * (len(margins) - 1)
    lo = int(pos)
    gamma = margins[lo] + (pos - lo) * (margins[lo + 1] - margins[lo])
    assert "inverse_margin" not in errors
    assert values["inverse_margin"] == pytest.approx(1 / gamma**2, rel=1e-5)
    # the flatness examples: the first 6, in batches of at most 4, labels aligned with their images
    assert len(seen["batches"]) == 3
    for batches in seen["batches"]:
        assert [len(bx) for bx, _ in batches] == [4, 2]
        assert torch.equal(torch.cat([bx for bx, _ in batches]), x[:6])
        assert torch.equal(torch.cat([by for _, by in batches]), y[:6])
    assert seen["progress"] == [False] * 4  # the default
    seen["progress"].clear()
    compute_measures(model, x, y, settings, progress=True)
    assert seen["progress"] == [True] * 4


def test_compute_measures_checks_the_examples():
    model = _model(layers=1)
    with pytest.raises(TypeError, match="torch.Tensors"):
        compute_measures(model, torch.randn(2, 1, 8, 8), [0, 1])
    with pytest.raises(TypeError, match="torch.Tensors"):
        compute_measures(model, [[0.0]], torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="expected 2 labels"):
        compute_measures(model, torch.randn(2, 1, 8, 8), torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("variant", ["crate-t", "crate-c"])
def test_jiang_l2_parameters_each_once_when_the_output_matrix_is_u(variant):
    """crate-t's output matrix is U itself (the same parameter): a map twice, a parameter of w once."""
    torch.manual_seed(3)
    config = CrateConfig.from_preset(
        "crate-digits", variant=variant, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_labels=3
    )
    model = CrateForImageClassification(config)
    maps, params = sm.jiang_weight_matrices(model)
    assert len(maps) == 2 + 3 * 2
    trainable = [p for p in model.parameters() if p.requires_grad and p.ndim == 2]
    assert len(params) == len(trainable) == 2 + 2 * 2
    assert {id(p) for p in params.values()} == {id(p) for p in trainable}
