"""The one-page report: HTML/JSON building blocks, sections against direct API calls, the CLI, model loading."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

import hf_tdiag
from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor
from hf_tdiag.inputs import UserInputError, open_image
from hf_tdiag.loading import load_model, pixel_values_for
from hf_tdiag.report.html import Figure, Section, Table, dumps, format_value, render_html, to_jsonable
from hf_tdiag.report.report import ReportOptions, build_report
from hf_tdiag.viz import figure_to_png, png_to_data_uri
from hf_tdiag.viz.attention_maps import cls_attention_grid
from hf_tdiag.viz.images import predictions_figure
from hf_tdiag.viz.schatten import optimal_p_heatmap


def _digits(n=12):
    from sklearn.datasets import load_digits

    d = load_digits()
    images = [Image.fromarray(np.rint(d.images[i] * (255 / 16)).astype(np.uint8)) for i in range(n)]
    return images, [int(t) for t in d.target[:n]]


@pytest.fixture(scope="module")
def crate_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, id2label={i: str(i) for i in range(10)})
    path = tmp_path_factory.mktemp("crate")
    CrateForImageClassification(cfg).save_pretrained(path)
    CrateImageProcessor.for_config(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    path = tmp_path_factory.mktemp("bert")
    BertModel(cfg).save_pretrained(path)
    return str(path)


# ----------------------------------------------------------------------------- building blocks


def test_to_jsonable_and_dumps_handle_tensors_arrays_and_nonfinite():
    data = {"t": torch.tensor([1.5, float("nan")]), "a": np.arange(3), "s": np.float32(2.0), "inf": float("inf")}
    out = to_jsonable(data)
    assert out == {"t": [1.5, None], "a": [0, 1, 2], "s": 2.0, "inf": None}
    assert json.loads(dumps(data)) == out


def test_format_value():
    assert format_value(1234567) == "1,234,567"
    assert format_value(0.5) == "0.5"
    assert format_value(1.23456e-7) == "1.235e-07"
    assert format_value(None) == "—"


def test_table_rejects_ragged_rows():
    with pytest.raises(ValueError, match="rows\\[1\\]"):
        Table("t", ["a", "b"], [[1, 2], [3]])


def test_section_status_is_checked():
    with pytest.raises(ValueError, match="status"):
        Section("k", "t", status="maybe")


def test_render_html_escapes_text_and_embeds_png():
    fig = predictions_figure([np.eye(4)], ["<b>x</b>"], [0.9])
    png = figure_to_png(fig)
    section = Section(
        "s",
        "<script>alert(1)</script>",
        summary="a < b",
        figures=[Figure("cap & co", png)],
        tables=[Table("T", ["k", "v"], [["<i>", 1.0]])],
    )
    page = render_html("title", "sub", [section], {"model": "<m>"})
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    assert "&lt;i&gt;" in page and "a &lt; b" in page and "&lt;m&gt;" in page
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(uris) == 1 and base64.b64decode(uris[0]) == png


def test_png_to_data_uri_rejects_non_png():
    with pytest.raises(ValueError, match="png"):
        png_to_data_uri(b"GIF89a")


def test_cls_attention_grid_picks_cls_row_and_patch_columns():
    L, K, g = 2, 3, (2, 3)
    n = 1 + g[0] * g[1]
    attn = torch.arange(L * K * n * n, dtype=torch.float32).reshape(L, K, n, n)
    maps = cls_attention_grid(attn, g)
    assert maps.shape == (L, K, 2, 3)
    for layer in range(L):
        for k in range(K):
            for r in range(2):
                for c in range(3):
                    assert maps[layer, k, r, c] == attn[layer, k, 0, 1 + r * 3 + c]
    with pytest.raises(ValueError, match="grid"):
        cls_attention_grid(attn, (3, 3))
    with pytest.raises(ValueError, match="attentions"):
        cls_attention_grid(attn[0], g)


# ----------------------------------------------------------------------------- loading


def test_load_model_folder_and_errors(crate_dir, tmp_path):
    loaded = load_model(crate_dir)
    assert loaded.model_type == "crate" and loaded.modality == "image" and loaded.is_classifier
    assert not loaded.model.training
    with pytest.raises(ValueError, match="not an existing folder and not a valid Hub id"):
        load_model(str(tmp_path / "missing" / "deeper" / "model"))
    with pytest.raises(ValueError, match="no config.json"):
        load_model(str(tmp_path))
    with pytest.raises(ValueError, match="empty"):
        load_model("  ")
    with pytest.raises(TypeError, match="model"):
        load_model(3)


def test_remote_code_folder_is_refused_and_its_code_never_runs(tmp_path):
    marker = tmp_path / "ran.txt"
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "evilnet", "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}})
    )
    (tmp_path / "configuration_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    with pytest.raises(ValueError, match="trust_remote_code=False"):
        load_model(str(tmp_path))
    assert not marker.exists()


def test_open_image_limits(tmp_path):
    ok = tmp_path / "ok.png"
    Image.new("RGB", (10, 7)).save(ok)
    assert open_image(ok).size == (10, 7)
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    with pytest.raises(UserInputError, match="not an image file"):
        open_image(bad)
    big = tmp_path / "big.png"
    Image.new("1", (5000, 4000)).save(big)  # 20 MP, tiny file: rejected from the header, before decoding
    with pytest.raises(UserInputError, match="too large"):
        open_image(big)
    with pytest.raises(UserInputError, match="limit is"):
        open_image(ok, max_bytes=10)


def test_pixel_values_convert_rgb_to_model_channels(crate_dir):
    loaded = load_model(crate_dir)
    rgb = Image.new("RGB", (16, 16), (200, 100, 50))
    pv = pixel_values_for([rgb], loaded)
    assert pv.shape == (1, 1, 8, 8)
    expected = pixel_values_for([rgb.convert("L")], loaded)
    torch.testing.assert_close(pv, expected)


# ----------------------------------------------------------------------------- the report


@pytest.fixture(scope="module")
def crate_report(crate_dir):
    images, labels = _digits(10)
    return build_report(crate_dir, images=images, labels=labels, progress=False), images, labels


def test_report_on_crate_matches_direct_api_calls(crate_dir, crate_report):
    report, images, labels = crate_report
    statuses = {s.key: s.status for s in report.sections}
    assert report.errors == {}, report.errors
    assert set(statuses.values()) == {"ok"}, statuses

    loaded = load_model(crate_dir)
    pv = pixel_values_for(images, loaded)
    with torch.no_grad():
        logits = loaded.model(pixel_values=pv).logits
    summary = report.section("summary").numbers
    assert summary["predictions"] == logits.argmax(-1).tolist()
    assert summary["accuracy"] == pytest.approx(float((logits.argmax(-1) == torch.tensor(labels)).float().mean()))

    srr = hf_tdiag.layer_srr(loaded.model, pv, progress=False)
    got = report.section("srr").numbers["mean"]
    for state in srr.states:
        np.testing.assert_allclose(got[state]["srr"], srr.mean[state]["srr"], rtol=1e-9)

    bounds = hf_tdiag.schatten_bounds(loaded.model)
    assert report.section("schatten").numbers["schatten_bound"] == pytest.approx(bounds.schatten_bound, rel=1e-12)
    assert report.section("schatten").numbers["edelman_bound"] == pytest.approx(bounds.edelman_bound, rel=1e-12)

    concepts = report.section("concept_fidelity").numbers
    direct = hf_tdiag.concept_fidelity(loaded.model, pv, concepts["layer"], 8, bounds=False, progress=False)
    assert concepts["layer"] == 2 and concepts["n_concepts"] == 8  # defaults: middle layer of 4, NUM_CONCEPTS
    for key in ("delta_rec", "delta_gram", "kl"):
        assert concepts[key] == pytest.approx(direct[key], rel=1e-6, abs=1e-12)
    assert 0.0 <= concepts["frac_kl_below_bound_estimated"] <= 1.0 and concepts["bound_estimated"] > 0
    assert concepts["frac_kl_below_bound_certified"] == 1.0

    with torch.no_grad():
        attn = loaded.model(pixel_values=pv[:1], output_attentions=True).attentions
    cls = np.asarray(report.section("attention_svm").numbers["cls_attention_first_input"])
    np.testing.assert_allclose(cls[-1, 0].reshape(-1), attn[-1][0, 0, 0, 1:].numpy(), rtol=1e-6)
    diag = hf_tdiag.attention_svm_diagnostic(loaded.model, pv, 4, 0, max_queries=64)  # default: the last block
    svm = report.section("attention_svm").numbers["attention_svm"]
    assert svm["layer"] == 4 and svm["head"] == 0 and svm["num_queries"] == 64
    assert svm["correlation"] == pytest.approx(diag.correlation, rel=1e-9)
    assert svm["one_hot_fraction_all"] == pytest.approx(diag.one_hot_fraction_all)


def test_report_files_are_self_contained(crate_report, tmp_path):
    report = crate_report[0]
    html_path, json_path = report.save(tmp_path / "out" / "report.html")
    page = html_path.read_text()
    data = json.loads(json_path.read_text())
    assert set(data["sections"]) == {s.key for s in report.sections}
    assert data["sections"]["summary"]["numbers"]["predictions"] == report.section("summary").numbers["predictions"]
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(uris) == sum(len(s.figures) for s in report.sections) >= 6
    assert all(base64.b64decode(u).startswith(b"\x89PNG") for u in uris)
    assert not re.search(r'(src|href)="(https?:)?//', page), "the page must not load external resources"
    assert "report.json" in page
    for s in report.sections:
        assert f'id="{s.key}"' in page


def test_report_without_inputs_skips_input_sections(crate_dir):
    report = build_report(crate_dir, sections=["summary", "srr", "concept_fidelity", "attention_svm"], progress=False)
    status = {s.key: s.status for s in report.sections}
    assert status["summary"] == "ok"
    for key in ("srr", "concept_fidelity", "attention_svm"):
        assert status[key] == "skipped" and "input" in report.section(key).note


def test_report_on_bert_runs_weight_diagnostics(bert_dir):
    report = build_report(bert_dir, sections=["summary", "schatten", "srr"], progress=False)
    assert report.section("summary").numbers["family"] == "bert"
    assert report.section("schatten").status == "ok"
    assert report.section("srr").status == "skipped"
    with pytest.raises(ValueError, match="text model"):
        build_report(bert_dir, images=[Image.new("RGB", (8, 8))], progress=False)


def test_optimal_p_heatmap_cells_are_the_records_p_opt(bert_dir):
    bounds = hf_tdiag.schatten_bounds(bert_dir)
    fig = optimal_p_heatmap(bounds)
    grid = np.ma.filled(fig.axes[0].images[0].get_array(), np.nan)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert grid.shape == (bounds.num_layers, len(labels))
    for m in bounds.matrices:
        col = labels.index(m.type if m.head is None else f"{m.type} h{m.head}")
        assert grid[m.layer - 1, col] == m.p_opt


def test_report_argument_errors(crate_dir, tmp_path):
    with pytest.raises(ValueError, match="sections"):
        build_report(crate_dir, sections=["nope"], progress=False)
    with pytest.raises(TypeError, match="options"):
        build_report(crate_dir, options={"n_concepts": 3}, progress=False)
    report = build_report(crate_dir, sections=["summary"], progress=False)
    with pytest.raises(ValueError, match=".html"):
        report.save(tmp_path / "r.txt")
    # an out-of-range layer is refused before any section runs (it used to fail as the section ran)
    with pytest.raises(ValueError, match="attention_layer: expected a block number 1..4, got 99"):
        build_report(
            crate_dir,
            images=_digits(2)[0],
            sections=["attention_svm"],
            options=ReportOptions(attention_layer=99),
            progress=False,
        )


def test_report_command(crate_dir, tmp_path, capsys):
    from hf_tdiag.cli import main

    folder = tmp_path / "imgs"
    for label in ("3", "7"):
        (folder / label).mkdir(parents=True)
    images, labels = _digits(40)
    picked = [(im, y) for im, y in zip(images, labels) if y in (3, 7)][:4]
    for i, (im, y) in enumerate(picked):
        im.save(folder / str(y) / f"{i}.png")
    (folder / "notes.txt").write_text("ignored: not an image suffix")
    out = tmp_path / "rep" / "r.html"
    rc = main(["report", crate_dir, "--images", str(folder), "-o", str(out), "--sections", "summary", "srr"])
    assert rc == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["sections"]["summary"]["numbers"]["num_inputs"] == len(picked)
    assert "accuracy" in data["sections"]["summary"]["numbers"]  # labels from the class folders
    assert "wrote" in capsys.readouterr().out
    assert main(["report", crate_dir, "--images", str(tmp_path / "nothing"), "-o", str(out)]) == 1


def test_report_command_with_texts_on_bert(tmp_path):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from hf_tdiag.cli import main

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a cat dog sat on mat ran fast red".split()]
    model_dir = tmp_path / "bert"
    model_dir.mkdir()
    (model_dir / "vocab.txt").write_text("\n".join(vocab))
    BertTokenizerFast(vocab_file=str(model_dir / "vocab.txt")).save_pretrained(model_dir)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
    )
    BertModel(cfg).save_pretrained(model_dir)
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat on the mat\n\na dog ran fast\nthe red cat\n")
    out = tmp_path / "bert_report.html"
    assert main(["report", str(model_dir), "--texts", str(texts), "-o", str(out), "--head", "1"]) == 0
    data = json.loads(out.with_suffix(".json").read_text())["sections"]
    assert {k: v["status"] for k, v in data.items()} == {
        "summary": "ok",
        "srr": "ok",
        "schatten": "ok",
        "concept_fidelity": "skipped",
        "attention_svm": "ok",
        "objective_ledger": "skipped",  # BERT has no white-box blocks
    }
    assert data["summary"]["numbers"]["num_inputs"] == 3  # the blank line is dropped
    assert data["srr"]["numbers"]["num_samples"] == 3
    assert data["attention_svm"]["numbers"]["attention_svm"]["head"] == 1
    assert main(["report", str(model_dir), "--images", str(tmp_path), "-o", str(out)]) == 1  # no images there


def test_failing_figure_keeps_numbers_and_marks_error(crate_dir, monkeypatch):
    from hf_tdiag.viz import attention_svm as viz_attention_svm

    def broken(*args, **kwargs):
        raise ValueError("cannot draw this")

    monkeypatch.setattr(viz_attention_svm, "plot_head_diagnostic", broken)
    report = build_report(crate_dir, images=_digits(3)[0], sections=["attention_svm"], progress=False)
    section = report.section("attention_svm")
    assert section.status == "error" and "cannot draw this" in section.note
    assert "attention_svm" in section.numbers and section.tables  # the computed numbers survive
    assert len(section.figures) == 2  # the attention maps drawn before the failure
    assert "attention_svm" in report.errors


def test_preset_matplotlib_backend_is_never_switched(tmp_path):
    """A notebook user's backend stays: evaluate.load of a bundled metric, the report and every viz module import
    and draw without matplotlib.use or pyplot (checked in a fresh interpreter, where nothing was imported yet)."""
    import os
    import subprocess
    import sys

    code = """
import matplotlib
matplotlib.use("svg")
import evaluate, hf_tdiag
evaluate.load(hf_tdiag.metric_path("srr"))
import hf_tdiag.report, hf_tdiag.viz, hf_tdiag.viz.images, hf_tdiag.viz.attention_maps, hf_tdiag.viz.study, hf_tdiag.viz.schatten
import hf_tdiag.viz.concept_fidelity, hf_tdiag.viz.attention_svm
import numpy as np, sys
hf_tdiag.viz.figure_to_png(hf_tdiag.viz.images.predictions_figure([np.zeros((4, 4))], ["a"], [0.5]))
assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
assert "matplotlib.pyplot" not in sys.modules, "pyplot was imported"
print("backend kept")
"""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "MPLBACKEND": ""}
    env.pop("MPLBACKEND")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "backend kept" in proc.stdout, proc.stderr[-2000:]
