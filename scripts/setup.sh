#!/usr/bin/env bash
# Everything the README's two commands need on a fresh machine (idempotent):
#   .venv with CPU PyTorch first (so no dependency pulls a multi-GB CUDA build), then hf-tdiag with its test extras,
#   Chromium for the browser tests and MathJax for the docs site's formulas (Debian's packages when run as root;
#   otherwise says what to install).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[dev]"

APT_UPDATED=
apt_install() {  # Debian packages, as root; apt-get update once
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "$APT_UPDATED" ]; then apt-get update -qq; APT_UPDATED=1; fi
  apt-get install -y -qq "$@" >/dev/null
}
can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

# Chromium drives the Space and report end-to-end tests (Playwright with executable_path; HF_TDIAG_CHROMIUM overrides).
CHROMIUM=${HF_TDIAG_CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
  if can_apt; then
    echo "setup.sh: installing Debian's chromium for the browser tests"
    apt_install chromium
  else
    echo "setup.sh: Chromium is missing at $CHROMIUM; the browser tests (tests/test_space_app.py) need it." >&2
    echo "  Install it with 'sudo apt-get install -y chromium' (Debian/Ubuntu), or point HF_TDIAG_CHROMIUM at a" >&2
    echo "  Chromium/Chrome binary." >&2
  fi
fi
# MathJax 2 renders the docs site's formulas offline: scripts/mkdocs_mathjax.py copies it into the built site
# (HF_TDIAG_MATHJAX overrides the folder).
MATHJAX=${HF_TDIAG_MATHJAX:-/usr/share/javascript/mathjax}
if [ ! -f "$MATHJAX/MathJax.js" ]; then
  if can_apt; then
    echo "setup.sh: installing Debian's libjs-mathjax for the docs site's formulas"
    apt_install libjs-mathjax
  else
    echo "setup.sh: MathJax is missing at $MATHJAX; 'mkdocs build --strict' (tests/test_docs_build.py) needs it." >&2
    echo "  Install it with 'sudo apt-get install -y libjs-mathjax' (Debian/Ubuntu), or point HF_TDIAG_MATHJAX at a" >&2
    echo "  MathJax 2 folder." >&2
  fi
fi
echo "setup.sh: done. Use .venv/bin/python (or 'source .venv/bin/activate')."
