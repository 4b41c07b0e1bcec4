"""The docs site builds in strict mode and reads right in a browser: a broken link, a missing page, a page left out
of the nav or an API reference that no longer resolves fails the build (which writes only into a temporary folder);
in headless Chromium every formula of the design page is typeset by the site's own MathJax, with no request leaving
the machine."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from script_files import load_script

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def _helpers():
    return load_script("scripts/docs_screenshots.py")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    site_dir = tmp_path_factory.mktemp("docs") / "site"
    proc = _helpers().build_site(site_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return site_dir


def test_mkdocs_build_strict(site):
    for page in ("index.html", "quickstart/index.html", "guide/srr/index.html", "api/index.html", "design/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    # the API page is rendered from the docstrings: the functions' own first lines appear in it
    import hf_tdiag.diagnostics.srr as srr

    first_line = srr.layer_srr.__doc__.strip().splitlines()[0]
    assert "layer_srr" in api and first_line.split("``")[0].strip() in api
    # the docstrings' Examples sections are rendered as code, not as Markdown quotes of ">>>" lines
    assert "&gt;&gt;&gt;" in api and "<blockquote>\n<blockquote>" not in api


def test_the_site_carries_its_own_mathjax_and_the_design_page_writes_formulas_for_it(site):
    assert (site / "javascripts" / "mathjax" / "MathJax.js").is_file()
    assert (site / "javascripts" / "mathjax" / "jax" / "output" / "CommonHTML" / "jax.js").is_file()
    assert any((site / "javascripts" / "mathjax" / "fonts" / "HTML-CSS" / "TeX" / "woff").glob("MathJax_Main-*.woff"))
    html = (site / "design" / "index.html").read_text(encoding="utf-8")
    displays = re.findall(r'<script type="math/tex; mode=display">', html)
    inline = re.findall(r'<script type="math/tex">', html)
    source = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    assert len(displays) == source.count("$$") // 2 >= 6
    assert len(inline) >= 20
    # every script the page loads is a file of the site (no CDN)
    for src in re.findall(r'<script src="([^"]+)"', html):
        assert not re.match(r"[a-z]+:|//", src), src
        assert (site / "design" / src).resolve().is_file(), src


def test_formulas_render_in_chromium_offline(site):
    sync_api = pytest.importorskip("playwright.sync_api")
    helpers = _helpers()
    if not os.access(helpers.CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {helpers.CHROMIUM} (scripts/setup.sh installs Debian's chromium as root)")
    requests, failed = [], []
    with helpers.serve(site) as base, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=helpers.CHROMIUM, headless=True, args=helpers.ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            page.on("requestfailed", lambda r: failed.append(r.url))
            page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
            page.goto(base + "design/")
            helpers.wait_for_math(page)
            found = page.evaluate(
                """() => {
                  const out = [...document.querySelectorAll('.MathJax_CHTML')].map(e => {
                    const r = e.getBoundingClientRect();
                    return {w: r.width, h: r.height, text: e.textContent,
                            display: !!e.closest('.MJXc-display')};
                  });
                  return {out, errors: document.querySelectorAll('.mjx-merror, .MathJax_Error').length,
                          font: getComputedStyle(document.querySelector('.mjx-char')).fontFamily,
                          raw: document.body.innerText.includes('\\\\log\\\\det')};
                }"""
            )
        finally:
            browser.close()
    assert not failed, failed
    assert requests and all(u.startswith(base) for u in requests), [u for u in requests if not u.startswith(base)]
    assert any("/javascripts/mathjax/jax/output/CommonHTML/" in u for u in requests)
    # MathJax's TeX fonts: the machine's own (Debian's fonts-mathjax, found by local()) or the site's .woff files;
    # a web font fetched from anywhere else fails the request check above
    fonts = [u for u in requests if u.endswith((".woff", ".otf", ".eot"))]
    assert all("/javascripts/mathjax/fonts/" in u for u in fonts), fonts
    assert found["errors"] == 0 and not found["raw"], "no TeX error and no raw TeX left on the page"
    out = found["out"]
    assert sum(f["display"] for f in out) >= 6 and all(f["w"] > 0 and f["h"] > 0 for f in out)
    assert "MJXc-TeX" in found["font"]  # typeset with MathJax's TeX fonts, not a fallback
    srr = next(f["text"] for f in out if f["display"])  # the first display: R(Z) and R^c(Z; U)
    assert "log" in srr and "det" in srr and "ε" in srr
