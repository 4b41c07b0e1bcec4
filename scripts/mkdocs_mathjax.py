"""MkDocs hook: the site renders formulas with a local MathJax 2, copied into the built site (no CDN at run time).

``pymdownx.arithmatex`` writes each formula as ``<script type="math/tex">``; ``docs/javascripts/mathjax-config.js``
configures MathJax and ``javascripts/mathjax/MathJax.js`` (listed in ``mkdocs.yml``'s ``extra_javascript``) is the
copy this hook makes from Debian's ``libjs-mathjax`` (``/usr/share/javascript/mathjax``; ``scripts/setup.sh`` installs
it as root) or from the folder ``$HF_TDIAG_MATHJAX`` names. Without it the build warns, so ``--strict`` fails.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.mathjax")

DEFAULT = "/usr/share/javascript/mathjax"
TARGET = Path("javascripts") / "mathjax"
# what the configuration in docs/javascripts/mathjax-config.js loads: TeX input with the AMS extensions,
# CommonHTML output with its TeX web fonts (woff), the menu and zoom extensions MathJax loads by default
PARTS = (
    "MathJax.js",
    "extensions",
    "jax/input/TeX",
    "jax/output/CommonHTML",
    "jax/element",
    "localization/en",
    "fonts/HTML-CSS/TeX/woff",
)


def source() -> Path:
    """The MathJax 2 folder to copy: ``$HF_TDIAG_MATHJAX`` or Debian's."""
    return Path(os.environ.get("HF_TDIAG_MATHJAX", DEFAULT))


def copy_mathjax(src: Path, site_dir: Path) -> int:
    """Copy the ``PARTS`` of MathJax at ``src`` to ``site_dir/javascripts/mathjax`` (links followed); files copied."""
    dest = site_dir / TARGET
    count = 0
    for part in PARTS:
        path = src / part
        if path.is_dir():
            shutil.copytree(path, dest / part, dirs_exist_ok=True)
            count += sum(1 for p in (dest / part).rglob("*") if p.is_file())
        else:
            (dest / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / part)
            count += 1
    return count


def on_post_build(config, **kwargs) -> None:
    src = source()
    missing = [part for part in PARTS if not (src / part).exists()]
    if missing:
        log.warning(
            "MathJax 2 not found at %s (missing %s): formulas will not render; install Debian's libjs-mathjax "
            "(scripts/setup.sh does, as root) or set HF_TDIAG_MATHJAX to a MathJax 2 folder",
            src,
            ", ".join(missing),
        )
        return
    count = copy_mathjax(src, Path(config["site_dir"]))
    log.info("MathJax: %d files copied from %s", count, src)
