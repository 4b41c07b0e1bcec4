"""The report page and the Space as a person reads them: the headline box, one number format per table, yes/no for
booleans, only detail tables folded, a working link to the JSON, mathtext labels that render, attention maps with a
colour bar on one scale, the model named once in titles, and plot areas that say what will appear."""

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hf_tdiag.report.html import Section, Table, format_value, headline, render_html, table_formatter
from hf_tdiag.viz import SRR_TERM_LABELS, figure_to_png, new_figure
from hf_tdiag.viz.attention_maps import attention_heads_figure
from hf_tdiag.viz.concept_fidelity import KL_BOUND_MATH
from hf_tdiag.viz.schatten import _title_name

pytestmark = pytest.mark.slow


def test_format_value_fixed_scientific_and_booleans():
    assert format_value(True) == "yes" and format_value(np.bool_(False)) == "no"
    assert format_value(15.962614) == "15.96" and format_value(0.0012346) == "0.001235"
    assert format_value(1282.0) == "1282" and format_value(0.5) == "0.5"
    assert format_value(1.93789e7) == "1.938e+07" and format_value(4.627e-5) == "4.627e-05"
    assert format_value(0.5, scientific=True) == "5.000e-01" and format_value(3, scientific=True) == "3"


def test_one_number_format_per_table():
    mixed = [["a", 1.93789e7], ["b", 4.627e-05], ["c", 0.5], ["d", 7]]
    fmt = table_formatter(mixed)
    assert [fmt(v) for _, v in mixed] == ["1.938e+07", "4.627e-05", "5.000e-01", "7"]
    plain = [[1, 0.5, 12.345], [2, 0.001, 99999.0]]
    fmt = table_formatter(plain)
    assert [fmt(v) for row in plain for v in row] == ["1", "0.5", "12.35", "2", "0.001", "99999"]


def _page(sections):
    return render_html("t", "s", sections, {"model": "m"}, json_name="report.json")


def test_headline_box_comes_first_with_the_key_numbers_of_sections_that_ran():
    sections = [
        Section("summary", "Model", numbers={"accuracy": 0.953}),
        Section("srr", "SRR", numbers={"summary": {"srr_last_layer": 33.3, "srr_mean_over_layers": 21.8}}),
        Section("schatten", "Bounds", numbers={"schatten_bound": 1282.0, "edelman_bound": 3.32712e6}),
        Section("concept_fidelity", "Concepts", status="skipped", note="needs images", numbers={"kl": 1.0}),
        Section("attention_svm", "Attention", numbers={"attention_svm": {"correlation": 0.036, "margin_ratio": 0.011}}),
    ]
    boxes = headline(sections)
    assert [(b["label"], b["value"]) for b in boxes] == [
        ("top-1 accuracy", "95.3%"),
        ("SRR, last block", "33.3"),
        ("SRR, mean over blocks", "21.8"),
        ("B_Schatten (Schatten proxy)", "1282"),
        ("B_Edelman", "3.327e+06"),
        ("corr(W_h, W_mm)", "0.036"),
        ("margin ratio (≤ 1)", "0.011"),
    ]
    page = _page(sections)
    assert page.index('id="headline"') < page.index('id="settings"') < page.index('id="summary"')
    assert '<a href="#schatten"><span class="v">1282</span>' in page
    assert '<a href="report.json">' in page  # the JSON beside the page is linked, relative: works stand-alone
    assert 'href="docs/' not in page


def test_tables_fold_only_when_marked_as_detail_and_never_show_python_values():
    long_key = Table("Fidelity", ["quantity", "value"], [[f"q{i}", float(i) + 0.5] for i in range(30)])
    detail = Table("Per-matrix", ["layer", "ok"], [[i, i % 2 == 0] for i in range(40)], collapsed=True)
    page = _page([Section("concepts", "Concepts", tables=[long_key, detail])])
    assert "<h3>Fidelity</h3>" in page and "<summary>Per-matrix (40 rows)</summary>" in page
    assert page.count("<details>") == 1
    cells = re.findall(r"<td>([^<]*)</td>", page)
    assert "True" not in cells and "False" not in cells and {"yes", "no"} <= set(cells)


def test_figure_formulas_are_mathtext_and_render():
    for label in SRR_TERM_LABELS.values():
        assert "$" in label and "ᶜ" not in label and "‖" not in label
    assert KL_BOUND_MATH.startswith("$") and KL_BOUND_MATH.endswith("$")
    fig = new_figure(7, 2)
    ax = fig.subplots()
    ax.set_title(KL_BOUND_MATH)
    ax.set_xlabel(" | ".join(SRR_TERM_LABELS.values()))
    assert figure_to_png(fig).startswith(b"\x89PNG")  # mathtext parse errors surface when drawing


def test_attention_maps_share_one_scale_shown_by_a_colour_bar():
    torch.manual_seed(0)
    att = torch.softmax(torch.randn(2, 3, 5, 5), dim=-1)
    fig = attention_heads_figure(np.zeros((4, 4)), att, grid=(2, 2), layer=2)
    overlays = [ax.images[1] for ax in fig.axes if len(ax.images) == 2]
    vmax = float(att[1, :, 0, 1:].max())
    assert len(overlays) == 3 and all(im.get_clim() == pytest.approx((0.0, vmax)) for im in overlays)
    bars = [ax for ax in fig.axes if ax.get_ylabel() == "attention weight of CLS"]
    assert len(bars) == 1


def test_schatten_titles_name_the_model_once():
    def report(model, model_type):
        return SimpleNamespace(model=model, model_type=model_type, num_layers=4, hidden_size=64, num_heads=4)

    assert _title_name(report("default digits CRATE", "crate")) == "default digits CRATE (L=4, N=64, H=4)"
    assert _title_name(report("org/tiny-bert", "bert")) == "org/tiny-bert (L=4, N=64, H=4)"
    assert _title_name(report("org/tiny", "bert")) == "org/tiny (bert, L=4, N=64, H=4)"


def test_space_plot_placeholders_say_what_will_appear():
    from hf_tdiag.gradio_app.placeholders import PLACEHOLDERS, placeholder_figure

    fig = placeholder_figure("concepts-kl")
    assert [t.get_text() for t in fig.texts] == [PLACEHOLDERS["concepts-kl"]]
    renderer = fig.canvas.get_renderer()
    for key in PLACEHOLDERS:  # each text on one line inside its figure: nothing cut off
        fig = placeholder_figure(key)
        box = fig.texts[0].get_window_extent(renderer)
        assert 0 < box.x0 and box.x1 < fig.bbox.width, key
    assert all(text.endswith(".") and "appear" in text for text in PLACEHOLDERS.values())


def test_every_space_plot_starts_with_its_placeholder():
    import gradio as gr

    from hf_tdiag.gradio_app.layout import build_demo
    from hf_tdiag.gradio_app.placeholders import PLACEHOLDERS

    demo = build_demo()
    plots = [b for b in demo.blocks.values() if isinstance(b, gr.Plot)]
    assert len(plots) == 14 and {p.elem_id for p in plots} == set(PLACEHOLDERS)
    assert all(p.value is not None for p in plots)
