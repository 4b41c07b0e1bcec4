"""The Space served on localhost: driven with gradio_client, and end to end in a real headless Chromium.

Chromium is Debian's ``chromium`` package (``apt-get install -y chromium``; ``.ci/run`` installs it), driven by
Playwright through ``executable_path``. Screenshots go to ``$HF_TDIAG_ARTIFACTS`` when set (to look at them), else to
a pytest tmp folder.
"""

from __future__ import annotations

import html
import importlib.util
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
from hf_tdiag.gradio_app import handlers as H

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


@pytest.fixture(scope="module", autouse=True)
def _local_models_allowed():
    """These tests feed save_pretrained folders, which the Space accepts only when the operator allows them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(H.LOCAL_MODELS_ENV, "1")
        yield


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
    from hf_tdiag.gradio_app import default_model

    cache = tmp_path_factory.mktemp("hf_tdiag_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(default_model.CACHE_ENV, str(cache))
        folder = default_model.ensure_default_model(
            max_train_steps=30, max_train_samples=480, max_eval_samples=120, disable_tqdm=True
        )
        yield folder


@pytest.fixture(scope="module")
def app_url(trained_default):
    from hf_tdiag.gradio_app.layout import CSS, MAX_FILE_SIZE, build_demo

    demo = build_demo(default_model="")  # empty model box = the default digits CRATE
    port = _free_port()
    demo.queue().launch(
        server_name="127.0.0.1",
        server_port=port,
        prevent_thread_lock=True,
        quiet=True,
        max_file_size=MAX_FILE_SIZE,
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
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 1000},
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

    from hf_tdiag.gradio_app import default_model

    assert default_model.is_complete(trained_default)
    results = json.loads((trained_default / "all_results.json").read_text())
    assert results["dataset"] == "sklearn-digits" and results["steps"] == 30
    mtime = (trained_default / "model.safetensors").stat().st_mtime
    assert default_model.ensure_default_model() == trained_default  # cached: no retraining
    assert (trained_default / "model.safetensors").stat().st_mtime == mtime

    client = Client(app_url, verbose=False)
    label, *_ = client.predict("", handle_file(digit_png), -1, [], api_name="/crate")
    assert label["label"] in {str(i) for i in range(10)}
    assert "**default digits CRATE** — `crate`" in client.predict("", api_name="/model_summary")  # no cache path


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


def test_api_names_every_input_and_output(app_url):
    """view_api() names each endpoint's inputs after the handler's parameters and its outputs after the components'
    labels: no ``value_<n>`` placeholder and no two outputs of one endpoint with the same name."""
    from gradio_client import Client

    endpoints = Client(app_url, verbose=False).view_api(print_info=False, return_format="dict")["named_endpoints"]
    names = {
        api: ([p["parameter_name"] for p in info["parameters"]], [r["label"] for r in info["returns"]])
        for api, info in endpoints.items()
    }
    for api in ("/crate", "/bounds", "/concepts", "/svm_head", "/text", "/model_summary"):
        assert names[api][0][0] == "model", api  # the one model box, named as such
    assert names["/model_summary"] == (["model"], ["Model summary"])
    assert names["/digits_example"] == (["example_index"], ["Image"])
    assert names["/text"][1] == [
        "Text summary",
        "Attention of one block on the first text",
        "Per-layer SRR of the texts",
        "Objective ledger plot",
        "Objective ledger steps",
    ]
    for api, (inputs, outputs) in names.items():
        assert all(n and not n.startswith("value_") for n in inputs + outputs), (api, inputs, outputs)
        assert len(set(outputs)) == len(outputs), (api, outputs)


def test_api_errors_arrive_as_plain_text_naming_what_to_do(app_url, monkeypatch, tmp_path):
    """A local folder typed while local folders are off (runs/main, a saved model in the working directory) is
    named as one, with the variable that allows it; the message reaches gradio_client as written, quotes and all."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    monkeypatch.delenv(H.LOCAL_MODELS_ENV)
    monkeypatch.chdir(tmp_path)
    CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10)).save_pretrained("runs/main")
    client = Client(app_url, verbose=False)
    with pytest.raises(AppError) as excinfo:
        client.predict("runs/main", api_name="/model_summary")
    message = excinfo.value.message
    assert message.startswith("model: 'runs/main' is a local path, and local folders are turned off on this Space")
    assert message.endswith(f"the environment variable {H.LOCAL_MODELS_ENV}=1") and "&#" not in message
    with pytest.raises(AppError) as excinfo:  # a Hub id while the Hub is unreachable (tests run offline)
        client.predict("someone/some-model", api_name="/model_summary")
    assert excinfo.value.message.startswith("model: the Hugging Face Hub could not be reached from this server")


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
        message = page.get_by_text(re.compile("is not an image file"))
        expect(message).to_be_visible(timeout=30_000)
        page.wait_for_timeout(600)  # let the toast finish fading in
        page.screenshot(path=str(artifacts / "space_bad_input.png"))
        assert "'fake.png'" in message.inner_text()  # the quotes shown as typed, not as &#x27;
        # the toast sits clear of the title (Gradio's default puts it at the top right, over the heading)
        toast, title = page.locator(".toast-wrap").bounding_box(), page.locator("h1").first.bounding_box()
        assert toast["y"] > title["y"] + title["height"] or toast["x"] > title["x"] + title["width"]
        assert toast["y"] + toast["height"] > page.viewport_size["height"] / 2  # at the bottom of the window
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
        # the key numbers in a box above every section; only the per-matrix detail table is folded
        expect(page.locator("#headline")).to_be_visible()
        assert page.locator("#headline a").count() >= 8
        assert page.locator("#headline").bounding_box()["y"] < page.locator("section#summary").bounding_box()["y"]
        assert page.locator("details").count() == 1
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


def test_space_front_matter_and_thin_app(monkeypatch, tmp_path):
    """space/README.md has the Space metadata; space/app.py only builds the Blocks from the installed package (no
    sys.path edits, nothing trained at import); space/requirements.txt is what pyproject.toml says."""
    import runpy
    import sys

    import gradio as gr
    from huggingface_hub import SpaceCard

    from hf_tdiag.gradio_app import default_model

    space = Path(__file__).resolve().parents[1] / "space"
    meta = SpaceCard.load(space / "README.md").data
    assert meta.sdk == "gradio" and meta.sdk_version == gr.__version__
    assert (space / meta.app_file).is_file()
    assert tuple(int(x) for x in str(meta.python_version).split(".")) >= (3, 11)
    assert meta.tags and meta.models and len(meta.short_description) <= 60

    spec = importlib.util.spec_from_file_location(
        "space_requirements", space.parent / "scripts" / "space_requirements.py"
    )
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert (space / "requirements.txt").read_text() == generator.space_requirements()
    import tomllib

    project = tomllib.loads((space.parent / "pyproject.toml").read_text())["project"]
    for dep in project["dependencies"] + project["optional-dependencies"]["svm"]:
        assert f"\n{dep}\n" in (space / "requirements.txt").read_text()

    monkeypatch.setenv(default_model.CACHE_ENV, str(tmp_path / "empty_cache"))
    path_before = list(sys.path)
    app = runpy.run_path(str(space / meta.app_file), run_name="space_app_under_test")
    assert sys.path == path_before and "sys.path" not in (space / meta.app_file).read_text()
    assert not (tmp_path / "empty_cache").exists()  # no default model trained (or even looked for) at import
    assert isinstance(app["demo"], gr.Blocks)
    dependencies = {dep.get("api_name"): dep for dep in app["demo"].config["dependencies"]}
    assert {"crate", "bounds", "concepts", "svm_experiment", "svm_head", "model_summary", "text"} <= set(dependencies)
    # one model box: the Text tab reads the same component as the other tabs (it had a second one)
    assert dependencies["text"]["inputs"][0] == dependencies["crate"]["inputs"][0]
    boxes = [c for c in app["demo"].config["components"] if c["type"] == "textbox" and "Model" in c["props"]["label"]]
    assert len(boxes) == 1 and "default:crate-c for the digits CRATE-C variant" in boxes[0]["props"]["placeholder"]


# ----------------------------------------------------------------------------- Hub ids over real HTTP


@pytest.fixture(scope="module")
def hub_app(tmp_path_factory):
    """The app served by a separate process whose Hub is tests/hub_server.py (HF_ENDPOINT), local paths off."""
    import subprocess
    import sys
    import time

    from gradio_client import Client
    from hub_server import LocalHub

    root = tmp_path_factory.mktemp("space_hub")
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, id2label={i: f"digit {i}" for i in range(10)})
    CrateForImageClassification(cfg).save_pretrained(root / "crate")
    CrateImageProcessor.for_config(cfg).save_pretrained(root / "crate")
    from test_loading import write_custom_code_repo

    write_custom_code_repo(root / "custom")
    port = _free_port()
    code = (
        "from hf_tdiag.gradio_app.layout import build_demo, launch\n"
        f"launch(build_demo(), warm=False, server_name='127.0.0.1', server_port={port}, quiet=True)\n"
    )
    with LocalHub() as hub:
        hub.add_folder("org/crate", root / "crate")
        hub.add_folder("org/custom", root / "custom")
        env = {
            **os.environ,
            "HF_ENDPOINT": hub.url,
            "HF_HUB_OFFLINE": "0",
            "HF_HOME": str(root / "hf_home"),
            "CUSTOM_CODE_MARKER": str(root / "marker.txt"),
            "GRADIO_ANALYTICS_ENABLED": "False",
        }
        env.pop(H.LOCAL_MODELS_ENV, None)
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    client = Client(f"http://127.0.0.1:{port}/", verbose=False)
                    break
                except Exception:  # noqa: BLE001 - not up yet
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the app did not start: {proc.stderr.read()[-2000:]}") from None
                    time.sleep(1)
            yield client, hub, root
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def test_space_model_box_takes_hub_ids_over_http(hub_app, digit_png, monkeypatch):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    client, hub, root = hub_app
    summary = client.predict("org/crate", api_name="/model_summary")
    assert "**org/crate** — `crate`" in summary and "10 classes" in summary
    assert {"config.json", "model.safetensors", "preprocessor_config.json"} <= set(hub.downloads("org/crate"))
    label, *_ = client.predict("org/crate", handle_file(digit_png), -1, [], api_name="/crate")
    monkeypatch.setenv(H.LOCAL_MODELS_ENV, "1")
    direct, *_ = H.crate_tab(str(root / "crate"), digit_png, -1)  # the same weights, read from the local folder
    top = max(direct, key=direct.get)
    assert label["label"] == top
    assert {c["label"]: c["confidence"] for c in label["confidences"]}[top] == pytest.approx(direct[top], rel=1e-5)

    with pytest.raises(AppError) as excinfo:
        client.predict("org/custom", api_name="/model_summary")
    assert "needs its own Python code" in html.unescape(str(excinfo.value))
    assert not (root / "marker.txt").exists() and "modeling_tiny.py" not in hub.downloads("org/custom")
    with pytest.raises(AppError) as excinfo:
        client.predict("org/missing", api_name="/model_summary")
    assert "'org/missing' is not a model repository on the Hub" in html.unescape(str(excinfo.value))
    with pytest.raises(AppError) as excinfo:  # a server path: refused without looking at the disk
        client.predict(str(root / "crate"), api_name="/model_summary")
    assert "local folders are turned off" in html.unescape(str(excinfo.value))
