"""Screenshots of the built docs site in headless Chromium (docs/figures/screenshots/docs_*.png).

    .venv/bin/python scripts/docs_screenshots.py [--output-dir docs/figures/screenshots]

Builds the site (``mkdocs build --strict``) into a temporary folder, serves it on localhost, waits until MathJax has
typeset every formula, and saves the home page, one guide page (SRR), one API page and the formulas of the design
page. Chromium is Debian's ``chromium`` (``$HF_TDIAG_CHROMIUM`` to override), driven by Playwright.
``tests/test_docs_build.py`` uses the same helpers to check the formulas in the browser.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("HF_TDIAG_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# (file name, page, what to show): the top of each page, the design page at its first formula
SHOTS = (
    ("docs_home.png", "", None),
    ("docs_guide_srr.png", "guide/srr/", None),
    ("docs_api.png", "api/", "#hf_tdiag.diagnostics.srr.layer_srr"),
    ("docs_design_formulas.png", "design/", "#sparse-rate-reduction"),
)
# every formula typeset: as many CommonHTML outputs as math scripts, and MathJax's queue empty
MATH_DONE = """() => {
  const scripts = document.querySelectorAll('script[type^="math/tex"]').length;
  const hub = window.MathJax && window.MathJax.Hub;
  return scripts > 0 && hub && hub.queue && hub.queue.pending === 0 && !hub.queue.running
    && document.querySelectorAll('.MathJax_CHTML').length === scripts;
}"""


def build_site(site_dir: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of the repository's site into ``site_dir``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml")]
    return subprocess.run(
        [*cmd, "--site-dir", str(site_dir)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@contextlib.contextmanager
def serve(site_dir: Path):
    """Serve ``site_dir`` on 127.0.0.1 (a free port) in a thread; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(site_dir))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def wait_for_math(page, timeout_ms: int = 60_000) -> None:
    """Wait until MathJax has typeset every formula of ``page`` (no-op wait on a page without formulas)."""
    if page.evaluate("() => document.querySelectorAll('script[type^=\"math/tex\"]').length"):
        page.wait_for_function(MATH_DONE, timeout=timeout_ms)
        page.evaluate("() => document.fonts.ready")


def _small_png(path: Path) -> None:
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
        im.save(path, optimize=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default=str(REPO / "docs" / "figures" / "screenshots"))
    args = parser.parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hf_tdiag_docs_shots_"))
    proc = build_site(work / "site")
    if proc.returncode != 0:
        print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
        return proc.returncode
    from playwright.sync_api import sync_playwright

    with serve(work / "site") as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            for name, path, anchor in SHOTS:
                page.goto(base + path + (anchor or ""))
                wait_for_math(page)
                page.wait_for_timeout(300)
                page.screenshot(path=str(out / name))
                _small_png(out / name)
                print(f"{out / name} ({(out / name).stat().st_size // 1024} KiB)")
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
