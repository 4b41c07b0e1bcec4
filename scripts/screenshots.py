"""Screenshots of the HTML report and of every Space tab in headless Chromium at 1,400 px (docs/figures/screenshots/).

    .venv/bin/python scripts/screenshots.py [--output-dir docs/figures/screenshots] [--only report|space]

Trains the Space's default digits CRATE (short budget) into a temporary cache, writes a report on 64 digits,
opens it, then serves the Space on localhost and shows each tab before and after its first run, and an error
toast (a local path typed while local folders are off). Chromium is
Debian's ``chromium`` (``$HF_TDIAG_CHROMIUM`` to override), driven by Playwright. PNGs are saved as 8-bit
palette images so they stay small.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from pathlib import Path

CHROMIUM = os.environ.get("HF_TDIAG_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
WIDTH = 1400


def _small_png(path: Path) -> None:
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
        im.save(path, optimize=True)


def _shot(page, path: Path, full_page: bool = True) -> None:
    page.screenshot(path=str(path), full_page=full_page)
    _small_png(path)
    print(f"{path} ({path.stat().st_size // 1024} KiB)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def report_shots(context, model_dir: str, out: Path, work: Path) -> None:
    from hf_tdiag.cli import main as cli_main

    rc = cli_main(["report", model_dir, "--dataset", "digits", "--max-samples", "64", "--output-dir", str(work / "r")])
    print("report exit code", rc)
    page = context.new_page()
    page.goto((work / "r" / "report.html").as_uri())
    page.wait_for_timeout(500)
    _shot(page, out / "report_top.png", full_page=False)
    _shot(page, out / "report_full.png")
    page.close()


def space_shots(context, out: Path) -> None:
    from hf_tdiag.gradio_app.layout import CSS, MAX_FILE_SIZE, build_demo

    demo = build_demo(default_model="")
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
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("#crate-run", timeout=60_000)
        tabs = [
            ("crate", "CRATE", "#crate-run", "#crate-example"),
            ("bounds", "Bounds", "#bounds-run", None),
            ("concepts", "Concepts", "#concepts-run", None),
            ("svm", "Attention as SVM", "#svm-head-run", None),
            ("text", "Text", "#text-run", None),  # the default pydoc CRATE-CLM on the sample texts
        ]
        for key, label, run, before in tabs:
            page.get_by_role("tab", name=label).click()
            page.wait_for_timeout(800)
            _shot(page, out / f"space_{key}_empty.png")
            if before:
                page.click(before)
                page.wait_for_timeout(2000)
            if key == "svm":
                page.click("#svm-run")
            page.click(run)
            page.wait_for_timeout(1500)
            page.wait_for_function(
                "() => !document.querySelector('.progress-text, .eta-bar, .wrap.pending, .generating')",
                timeout=300_000,
            )
            page.wait_for_timeout(1500)
            _shot(page, out / f"space_{key}.png")
        # an error: a local path typed while local folders are off; the toast names the switch, clear of the title
        page.get_by_role("tab", name="CRATE").click()
        page.fill("#model-box textarea", "./runs/main")
        page.click("#load-model")
        page.get_by_text("local folders are turned off").wait_for(timeout=60_000)
        page.wait_for_timeout(800)  # the toast's fade-in
        _shot(page, out / "space_error.png", full_page=False)
        page.close()
    finally:
        demo.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="docs/figures/screenshots")
    parser.add_argument("--only", choices=["report", "space"])
    args = parser.parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hf_tdiag_shots_"))
    os.environ.setdefault("HF_TDIAG_CACHE", str(work / "cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from playwright.sync_api import sync_playwright

    from hf_tdiag.gradio_app import default_model

    model_dir = str(default_model.ensure_default_model(max_train_steps=300, max_train_samples=1200, disable_tqdm=True))
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(work / "profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=ARGS,
            viewport={"width": WIDTH, "height": 900},
        )
        try:
            if args.only in (None, "report"):
                report_shots(context, model_dir, out, work)
            if args.only in (None, "space"):
                space_shots(context, out)
        finally:
            context.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
