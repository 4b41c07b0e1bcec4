"""The Space served on localhost: driven with gradio_client, and end to end in a real headless Chromium.

Chromium is Debian's ``chromium`` package (``apt-get install -y chromium``; ``.ci/run`` installs it), driven by
Playwright through ``executable_path``. Screenshots go to ``$HF_TDIAG_ARTIFACTS`` when set (to look at them), else to
a pytest tmp folder.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor
from hf_tdiag import space_handlers as H

CHROMIUM = os.environ.get("HF_TDIAG_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def crate_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, id2label={i: f"digit {i}" for i in range(10)})
    path = tmp_path_factory.mktemp("app_crate")
    CrateForImageClassification(cfg).save_pretrained(path)
    CrateImageProcessor.for_config(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def trained_default(tmp_path_factory):
    """The Space's default model, trained by the digits recipe (short budget) into a fresh cache."""
    from hf_tdiag import default_model

    cache = tmp_path_factory.mktemp("hf_tdiag_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(default_model.CACHE_ENV, str(cache))
        folder = default_model.ensure_default_model(
            max_train_steps=30, max_train_samples=480, max_eval_samples=120, disable_tqdm=True
        )
        yield folder


@pytest.fixture(scope="module")
def app_url(trained_default):
    from hf_tdiag.space_app import CSS, MAX_FILE_SIZE, build_demo

    demo = build_demo(default_model="")  # empty model box = the default digits CRATE
    port = _free_port()
    demo.queue().launch(
        server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, max_file_size=MAX_FILE_SIZE,
        css=CSS,
    )
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@pytest.fixture()
def digit_png(tmp_path):
    from sklearn.datasets import load_digits

    arr = np.rint(load_digits().images[7] * (255 / 16)).astype(np.uint8)
    path = tmp_path / "digit.png"
    Image.fromarray(arr).save(path)
    return str(path)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    folder = os.environ.get("HF_TDIAG_ARTIFACTS")
    return Path(folder) if folder else tmp_path_factory.mktemp("artifacts")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert os.path.isfile(CHROMIUM), f"Chromium not found at {CHROMIUM}: apt-get install -y chromium"
    profile = tempfile.mkdtemp(prefix="hf_tdiag_chromium_")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, viewport={"width": 1280, "height": 1000}
        )
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


# ----------------------------------------------------------------------------- gradio_client


def test_client_drives_crate_tab(app_url, crate_dir, digit_png):
    from gradio_client import Client, handle_file

    client = Client(app_url, verbose=False)
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/crate", "/model_summary", "/digits_example"} <= set(endpoints)

    label, heads, layers, srr, table = client.predict(crate_dir, handle_file(digit_png), -1, [], api_name="/crate")
    direct, *_ = H.crate_tab(crate_dir, digit_png, -1)
    top = max(direct, key=direct.get)
    assert label["label"] == top
    assert {c["label"]: c["confidence"] for c in label["confidences"]}[top] == pytest.approx(direct[top], rel=1e-5)
    assert "(this model)" in table
    for plot in (heads, layers, srr):
        assert plot["type"] == "matplotlib" and plot["plot"].startswith("data:image/png;base64,")

    summary = client.predict(crate_dir, api_name="/model_summary")
    assert "`crate`" in summary and "10 classes" in summary


def test_default_model_is_trained_once_and_served(app_url, trained_default, digit_png):
    import json

    from gradio_client import Client, handle_file

    from hf_tdiag import default_model

    assert default_model.is_complete(trained_default)
    results = json.loads((trained_default / "all_results.json").read_text())
    assert results["dataset"] == "sklearn-digits" and results["steps"] == 30
    mtime = (trained_default / "model.safetensors").stat().st_mtime
    assert default_model.ensure_default_model() == trained_default  # cached: no retraining
    assert (trained_default / "model.safetensors").stat().st_mtime == mtime

    client = Client(app_url, verbose=False)
    label, *_ = client.predict("", handle_file(digit_png), -1, [], api_name="/crate")
    assert label["label"] in {str(i) for i in range(10)}
    assert "default-digits-crate" in client.predict("", api_name="/model_summary")


def test_client_bad_inputs_get_clear_messages(app_url, crate_dir, tmp_path):
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError

    client = Client(app_url, verbose=False)
    text_file = tmp_path / "not_an_image.png"
    text_file.write_text("hello")
    with pytest.raises(AppError) as excinfo:
        client.predict(crate_dir, handle_file(str(text_file)), 0, [], api_name="/crate")
    assert "is not an image file" in html.unescape(str(excinfo.value))

    big = tmp_path / "huge.png"
    Image.new("1", (5000, 5000)).save(big)
    with pytest.raises(AppError) as excinfo:
        client.predict(crate_dir, handle_file(str(big)), 0, [], api_name="/crate")
    assert "too large" in html.unescape(str(excinfo.value))

    with pytest.raises(AppError) as excinfo:
        client.predict("nobody/no-such-model", api_name="/model_summary")
    assert "neither a local model folder" in html.unescape(str(excinfo.value))
    # the server survived all of that
    assert "`crate`" in client.predict(crate_dir, api_name="/model_summary")


# ----------------------------------------------------------------------------- real browser


def test_browser_crate_tab_end_to_end(app_url, browser, digit_png, artifacts):
    """Default model (empty model box): upload a digit, run the CRATE tab, see a prediction and rendered plots."""
    from playwright.sync_api import expect

    artifacts.mkdir(parents=True, exist_ok=True)
    page = browser.new_page()
    try:
        page.goto(app_url)
        page.locator("#crate-image input[type=file]").set_input_files(digit_png)
        expect(page.locator("#crate-image img")).to_be_visible(timeout=30_000)  # upload preview rendered
        page.locator("#crate-run").click()
        expect(page.locator("#crate-prediction")).to_contain_text(re.compile(r"\d"), timeout=60_000)
        for plot in ("#crate-heads img", "#crate-layers img", "#crate-srr img"):
            img = page.locator(plot)
            expect(img).to_be_visible(timeout=60_000)
            assert img.evaluate("e => e.complete && e.naturalWidth") > 100
        page.screenshot(path=str(artifacts / "space_crate_tab.png"), full_page=True)
    finally:
        page.close()
    assert (artifacts / "space_crate_tab.png").stat().st_size > 10_000


def test_browser_shows_error_for_non_image(app_url, browser, tmp_path, artifacts):
    from playwright.sync_api import expect

    bad = tmp_path / "fake.png"
    bad.write_text("definitely not a PNG")
    page = browser.new_page()
    try:
        page.goto(app_url)
        page.locator("#crate-image input[type=file]").set_input_files(str(bad))
        page.locator("#crate-run").click()
        expect(page.get_by_text(re.compile("is not an image file"))).to_be_visible(timeout=30_000)
        page.wait_for_timeout(600)  # let the toast finish fading in
        page.screenshot(path=str(artifacts / "space_bad_input.png"))
    finally:
        page.close()


def test_browser_renders_report_of_trained_model(browser, trained_default, artifacts):
    """The one-page report of the digits-trained CRATE (the main job's recipe) opened in Chromium."""
    from playwright.sync_api import expect

    from hf_tdiag.inputs import digits_test_images
    from hf_tdiag.report.report import build_report

    images, labels = digits_test_images(24)
    report = build_report(str(trained_default), images=images, labels=labels, progress=False)
    assert report.errors == {}, report.errors
    artifacts.mkdir(parents=True, exist_ok=True)
    html_path, _ = report.save(artifacts / "report_trained_model.html")
    page = browser.new_page()
    try:
        page.goto(html_path.resolve().as_uri())
        for section in report.sections:
            expect(page.locator(f"section#{section.key}")).to_be_visible()
            assert page.locator(f"section#{section.key}").get_attribute("data-status") == "ok"
        images_on_page = page.locator("section img")
        count = images_on_page.count()
        assert count == sum(len(s.figures) for s in report.sections) >= 8
        for i in range(count):
            img = images_on_page.nth(i)
            img.scroll_into_view_if_needed()
            assert img.evaluate("e => e.complete && e.naturalWidth") > 50
        page.screenshot(path=str(artifacts / "report_trained_model.png"), full_page=True)
    finally:
        page.close()
    assert (artifacts / "report_trained_model.png").stat().st_size > 50_000


def test_space_front_matter_and_thin_app(trained_default, monkeypatch):
    """space/README.md has the Space metadata; space/app.py builds the Blocks from the package (no launch)."""
    import runpy

    import gradio as gr
    from huggingface_hub import SpaceCard

    from hf_tdiag import default_model

    space = Path(__file__).resolve().parents[1] / "space"
    meta = SpaceCard.load(space / "README.md").data
    assert meta.sdk == "gradio" and meta.sdk_version == gr.__version__
    assert (space / meta.app_file).is_file()
    assert tuple(int(x) for x in str(meta.python_version).split(".")) >= (3, 11)
    assert meta.tags and meta.models and len(meta.short_description) <= 60
    requirements = (space / "requirements.txt").read_text()
    for package in ("torch", "transformers", "safetensors", "scikit-learn", "matplotlib", "cvxpy"):
        assert package in requirements

    monkeypatch.setenv(default_model.CACHE_ENV, str(trained_default.parent))
    app = runpy.run_path(str(space / meta.app_file), run_name="space_app_under_test")
    assert isinstance(app["demo"], gr.Blocks)
    names = {dep.get("api_name") for dep in app["demo"].config["dependencies"]}
    assert {"crate", "bounds", "concepts", "svm_experiment", "svm_head", "model_summary"} <= names
