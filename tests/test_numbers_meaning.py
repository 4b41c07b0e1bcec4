"""Numbers with their meaning (hf_tdiag/_meaning.py, the report's headline): the Wilson and mean intervals
against their defining equations, the vacuous rule against the identity KL(p‖u) = log C − H(p), the report's headline
carrying counts, intervals and labels, and the report's one progress bar advancing per section."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hf_tdiag import _meaning as F
from hf_tdiag.report.html import Section, headline, render_html


@pytest.mark.parametrize("k, n", [(64, 64), (0, 20), (350, 360), (7, 13), (1, 1)])
def test_wilson_interval_is_the_roots_of_its_defining_quadratic(k, n):
    # Wilson's interval: the p with (p̂ − p)² = z² p (1 − p) / n, i.e. (1 + z²/n) p² − (2p̂ + z²/n) p + p̂² = 0
    z2, phat = F.Z95**2, k / n
    roots = np.sort(np.roots([1 + z2 / n, -(2 * phat + z2 / n), phat**2]).real)
    assert F.wilson_interval(k, n) == pytest.approx(tuple(roots), abs=1e-12)


def test_wilson_interval_hand_values_and_the_issue_s_numbers():
    # all 64 right: the lower end is n / (n + z²) (the quadratic with p̂ = 1)
    assert F.wilson_interval(64, 64) == pytest.approx((64 / (64 + F.Z95**2), 1.0), abs=1e-12)
    assert F.wilson_interval(0, 20) == pytest.approx((0.0, F.Z95**2 / (20 + F.Z95**2)), abs=1e-12)
    # "100.0% on 64 samples" and "97.22% on 360" agree once the 64-sample number carries its interval
    lo, hi = F.wilson_interval(64, 64)
    assert lo < 350 / 360 <= hi and round(lo, 3) == 0.943
    for bad in ((3, 0), (5, 4), (-1, 4)):
        with pytest.raises(ValueError, match="n|successes"):
            F.wilson_interval(*bad)


def test_mean_interval_uses_the_sample_standard_deviation():
    values = np.array([1.0, 2.0, 4.0, 7.0, 11.0])
    n = len(values)
    half = F.Z95 * values.std(ddof=1) / math.sqrt(n)
    expected = (values.mean() - half, values.mean() + half)
    assert F.mean_interval(values.mean(), values.std(ddof=0), n, ddof=0) == pytest.approx(expected, rel=1e-12)
    assert F.mean_interval(values.mean(), values.std(ddof=1), n, ddof=1) == pytest.approx(expected, rel=1e-12)
    assert F.mean_interval(3.0, 0.0, 1) is None and F.mean_interval(float("nan"), 1.0, 5) is None


def test_vacuous_means_above_log_c_the_largest_kl_to_the_uniform_guess():
    torch.manual_seed(0)
    C = 10
    p = torch.softmax(3 * torch.randn(1000, C, dtype=torch.float64), -1)
    p[0] = torch.nn.functional.one_hot(torch.tensor(3), C).double()  # a certain prediction: KL(p‖u) = log C exactly
    kl_to_uniform = (p * (p.clamp_min(1e-300) * C).log()).sum(-1)
    entropy = -(p * p.clamp_min(1e-300).log()).sum(-1)
    assert torch.allclose(kl_to_uniform, math.log(C) - entropy)  # KL(p‖u) = log C − H(p)
    assert float(kl_to_uniform.max()) == pytest.approx(math.log(C)) and bool(
        (kl_to_uniform <= math.log(C) + 1e-12).all()
    )
    # so a bound ≥ log C also admits the uniform guess: vacuous; below it, it rules that guess out
    assert F.kl_bound_vacuous(math.log(C) * 1.001, C) is True and F.kl_bound_vacuous(math.log(C) * 0.999, C) is False
    assert F.kl_bound_vacuous(1.3e48, C) is True and F.kl_bound_vacuous(float("inf"), C) is True
    assert F.kl_bound_vacuous(float("nan"), C) is True
    assert F.kl_bound_vacuous(None, C) is None and F.kl_bound_vacuous(5.0, None) is None
    reason = F.kl_vacuous_reason(1.3e48, C)
    assert reason.startswith("vacuous: ") and "1.3e+48" in reason and "2.3" in reason and "\n" not in reason


def test_concept_flags_and_intervals_from_a_report_mapping():
    kl = [0.5, 1.0, 2.0, 2.5]
    report = {
        "bound_certified": 1.3e48,
        "bound_certified_chain": 0.2,
        "bound_estimated": 3.0,
        "kl": sum(kl) / 4,
        "top1_agreement": 0.75,
        "n_images": 4,
        "per_image": {"kl": kl},
    }
    flags = F.concept_bound_flags(report, 10)
    assert sorted(flags) == ["bound_certified", "bound_estimated"]  # 3.0 > log 10 = 2.303 > 0.2
    assert all(reason.startswith("vacuous: ") for reason in flags.values())
    assert F.concept_bound_flags(report, 100) == {"bound_certified": F.kl_vacuous_reason(1.3e48, 100)}
    assert F.concept_bound_flags(report, None) == {}
    intervals = F.concept_intervals(report)
    half = F.Z95 * np.std(kl, ddof=1) / 2
    assert intervals["kl"] == pytest.approx([np.mean(kl) - half, np.mean(kl) + half])
    assert intervals["top1_agreement"] == pytest.approx(list(F.wilson_interval(3, 4)))
    two = F.concept_intervals({"per_image": {"kl": [1.0, 3.0]}})  # two inputs give an interval, one does not
    assert (
        two["kl"] == pytest.approx([2.0 - F.Z95, 2.0 + F.Z95])
        and F.concept_intervals({"per_image": {"kl": [1.0]}}) == {}
    )


def test_headline_boxes_carry_counts_intervals_and_labels():
    lo, hi = F.wilson_interval(64, 64)
    sections = [
        Section(
            "summary",
            "Model",
            numbers={"accuracy": 1.0, "num_correct": 64, "num_labeled": 64, "intervals": {"accuracy": [lo, hi]}},
        ),  # fmt: skip
        Section(
            "schatten",
            "Bounds",
            numbers={
                "schatten_bound": 1282.0,
                "edelman_bound": 3.3e6,
                "matrices": [{}] * 36,
                "flags": {"schatten_bound": F.degenerate_reason(36)},
            },
        ),  # fmt: skip
        Section(
            "concept_fidelity",
            "Concepts",
            numbers={
                "kl": 1.5,
                "bound_certified": 1.3e48,
                "n_images": 31,
                "flags": {"bound_certified": F.kl_vacuous_reason(1.3e48, 10)},
            },
        ),  # fmt: skip
    ]
    boxes = {b["label"]: b for b in headline(sections)}
    accuracy = boxes["top-1 accuracy"]
    assert accuracy["value"] == "100.0%" and accuracy["flag"] == ""
    assert accuracy["detail"] == f"64 of 64 labelled inputs · 95% CI {lo:.1%}–100.0%" and f"{lo:.1%}" == "94.3%"
    assert boxes["B_Schatten (Schatten proxy)"]["flag"] == "degenerate"
    assert boxes["B_Schatten (Schatten proxy)"]["detail"] == "from the weights of 36 matrices (no inputs)"
    assert boxes["B_Edelman"]["flag"] == ""
    certified = boxes["KL bound, certified"]
    assert (
        certified["flag"] == "vacuous" and certified["value"] == "1.300e+48" and certified["detail"] == "n = 31 images"
    )
    assert boxes["concept KL (mean)"]["flag"] == "" and boxes["concept KL (mean)"]["detail"] == "n = 31 images"
    page = render_html("t", "s", sections, {"model": "m"})
    flagged = page[page.index('<ul class="flags" id="flags">') :]
    assert flagged.index("B_Schatten (Schatten proxy)") < flagged.index("KL bound, certified") < flagged.index("</ul>")
    assert "degenerate: p_opt = 0 for all 36 matrices" in flagged
    assert '<span class="flag">vacuous</span>' in page and "94.3%–100.0%" in page
    assert 'id="flags"' not in render_html("t", "s", sections[:1], {"model": "m"})  # nothing flagged: no list


@pytest.fixture(scope="module")
def tiny_crate(tmp_path_factory):
    from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor

    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10)
    path = tmp_path_factory.mktemp("crate")
    CrateForImageClassification(cfg).save_pretrained(path)
    CrateImageProcessor.for_config(cfg).save_pretrained(path)
    return str(path)


def test_report_headline_numbers_are_the_sections_numbers_with_their_counts(tiny_crate):
    import hf_tdiag
    from hf_tdiag.inputs import digits_test_images
    from hf_tdiag.report.report import build_report

    images, labels = digits_test_images(12)
    report = build_report(tiny_crate, images=images, labels=labels, sections=["summary", "srr", "schatten"],
                          progress=False)  # fmt: skip
    summary = report.section("summary").numbers
    correct = int(np.sum(np.array(summary["predictions"]) == np.array(labels)))  # counted again from the predictions
    assert (summary["num_correct"], summary["num_labeled"]) == (correct, 12)
    assert summary["intervals"]["accuracy"] == pytest.approx(list(F.wilson_interval(correct, 12)))
    assert f"({correct} of 12; Wilson 95% interval" in report.section("summary").summary
    srr = report.section("srr").numbers
    model, pixel_values = report_inputs(tiny_crate, images)
    last = hf_tdiag.layer_srr(model, pixel_values, progress=False).values[:, 0, -1, 3]
    half = F.Z95 * float(last.std(correction=1)) / math.sqrt(12)
    assert srr["intervals"]["srr_last_layer"] == pytest.approx([float(last.mean()) - half, float(last.mean()) + half],
                                                               rel=1e-4)  # fmt: skip
    schatten = report.section("schatten").numbers
    direct = hf_tdiag.schatten_bounds(model)
    assert ("schatten_bound" in schatten["flags"]) == direct.degenerate
    boxes = {b["label"]: b for b in headline(report.sections)}
    assert boxes["SRR, last block"]["detail"].startswith("n = 12 samples · 95% CI ")
    assert boxes["B_Schatten (Schatten proxy)"]["flag"] == ("degenerate" if direct.degenerate else "")


def report_inputs(folder, images):
    from hf_tdiag.loading import load_model, pixel_values_for

    loaded = load_model(folder)
    return loaded.model, pixel_values_for(images, loaded) if images else None


def test_report_progress_is_one_bar_advancing_per_section(tiny_crate, capsys, monkeypatch):
    from hf_tdiag.report.report import build_report

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    build_report(tiny_crate, sections=["summary", "srr"], progress=True)  # no inputs: srr is skipped at once
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("report:")]
    # outside a terminal: plain lines, the count of finished sections beside the one now running
    assert "0/2" in lines[0] and "summary" in lines[0]
    assert "1/2" in lines[1] and "srr" in lines[1]
    assert "2/2" in lines[-1] and all("\r" not in line for line in lines)


def test_report_summaries_carry_the_labels():
    import hf_tdiag
    from hf_tdiag import ConceptFidelityReport, CrateConfig, CrateForImageClassification

    layer = {"layer": 2, "kl": 0.1, "n_images": 4, "num_classes": 10, "bound_certified": 1.3e48, "bound_estimated": 2.0}
    one = ConceptFidelityReport(layer)
    s = one.summary()
    assert (s["bound_certified_vacuous"], s["bound_estimated_vacuous"], s["n_images"]) == (True, False, 4)
    assert one.vacuous_reasons() == {"bound_certified": F.kl_vacuous_reason(1.3e48, 10)}
    assert "bound_certified_vacuous" not in ConceptFidelityReport({**layer, "num_classes": None}).summary()  # C unknown
    assert ConceptFidelityReport.from_json(one.to_json()).summary() == s  # C travels with the JSON
    sweep = ConceptFidelityReport({"per_layer": {1: ConceptFidelityReport(layer), 3: ConceptFidelityReport(
        {**layer, "bound_certified": 1.5})}})  # fmt: skip
    assert sweep.summary()["bound_certified_vacuous_layers"] == 1 and sweep.vacuous_reasons() == {}

    torch.manual_seed(0)
    report = hf_tdiag.schatten_bounds(CrateForImageClassification(CrateConfig.from_preset("crate-digits")))
    summary = report.summary()
    assert summary["schatten_degenerate"] is report.degenerate
    assert summary.get("schatten_degenerate_reason") == (
        F.degenerate_reason(len(report.matrices)) if report.degenerate else None
    )
    for m in report.matrices:  # every p_opt = 0: B_Schatten is a rank count, and the summary says so
        m.p_opt = 0.0
    summary = report.summary()
    assert summary["schatten_degenerate"] is True
    assert summary["schatten_degenerate_reason"] == F.degenerate_reason(36) and "36 matrices" in F.degenerate_reason(36)


def test_evaluate_modules_output_the_labels(tiny_crate):
    """The evaluate modules' outputs carry the same labels as the reports' summaries, with the reasons as text."""
    import evaluate

    import hf_tdiag
    from hf_tdiag import ConceptFidelityReport
    from hf_tdiag.metrics.concept_fidelity.concept_fidelity import _scalars

    layer = {"layer": 2, "kl": 0.1, "n_images": 6, "num_classes": 10, "bound_certified": 40.0, "bound_estimated": 2.0}
    out = _scalars(ConceptFidelityReport(layer))  # what the module's compute returns for one layer's report
    assert (out["bound_certified_vacuous"], out["bound_estimated_vacuous"]) == (True, False)  # log 10 = 2.30
    assert out["bound_certified_vacuous_reason"] == F.kl_vacuous_reason(40.0, 10)
    assert "bound_estimated_vacuous_reason" not in out and out["n_images"] == 6 and out["num_classes"] == 10

    model, _ = report_inputs(tiny_crate, [])
    out = evaluate.load(hf_tdiag.metric_path("schatten")).compute(model=model)
    report = hf_tdiag.schatten_bounds(model)
    assert out["schatten_degenerate"] is report.degenerate
    assert out.get("schatten_degenerate_reason") == report.summary().get("schatten_degenerate_reason")
