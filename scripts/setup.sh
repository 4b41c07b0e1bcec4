#!/usr/bin/env bash
# Everything the README's two commands need on a fresh machine (idempotent: a second run only fills in what is
# missing), each step announced as it starts:
#   1. .venv (python3 -m venv; PYTHON=... picks the interpreter)
#   2. CPU PyTorch 2.13.0 first, so no dependency pulls a multi-GB CUDA build (pip)
#   3. hf-tdiag in editable mode with its test and docs extras, .[dev] (pip)
#   4. the browser parts, through Debian's apt when run as root (otherwise it says what to install):
#      Chromium (package chromium) for the Space and report browser tests, and MathJax 2 (package libjs-mathjax)
#      for the docs site's formulas. HF_TDIAG_SKIP_BROWSER=1 skips step 4 (the browser tests and the docs build
#      test, tests/test_space_app.py and tests/test_docs_build.py, then need them installed another way).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { echo "setup.sh: $*"; }

if [ -x .venv/bin/python ]; then
  say "[1/4] .venv exists, kept"
else
  say "[1/4] creating .venv with $PY"
  "$PY" -m venv .venv
fi
say "[2/4] pip: upgrading pip, installing CPU PyTorch (torch==2.13.0)"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
say "[3/4] pip: installing hf-tdiag in editable mode with its extras (-e '.[dev]': tests, docs, Space, ray, cvxpy)"
.venv/bin/python -m pip install -q -e ".[dev]"

if [ "${HF_TDIAG_SKIP_BROWSER:-0}" = 1 ]; then
  say "[4/4] HF_TDIAG_SKIP_BROWSER=1: Chromium and MathJax not checked nor installed"
  say "done. Use .venv/bin/python (or 'source .venv/bin/activate')."
  exit 0
fi

APT_UPDATED=
apt_install() {  # Debian packages, as root; apt-get update once
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "$APT_UPDATED" ]; then
    say "      apt-get update"
    apt-get update -qq
    APT_UPDATED=1
  fi
  say "      apt-get install $*"
  apt-get install -y -qq "$@" >/dev/null
}
can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

say "[4/4] browser parts (HF_TDIAG_SKIP_BROWSER=1 skips them): Chromium for the browser tests, MathJax for the docs"
# Chromium drives the Space and report end-to-end tests (Playwright with executable_path; HF_TDIAG_CHROMIUM overrides).
CHROMIUM=${HF_TDIAG_CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ]; then
  say "      Chromium found at $CHROMIUM"
elif can_apt; then
  say "      installing Debian's chromium (apt) for the browser tests"
  apt_install chromium
else
  echo "setup.sh: Chromium is missing at $CHROMIUM; the browser tests (tests/test_space_app.py) need it." >&2
  echo "  Install it with 'sudo apt-get install -y chromium' (Debian/Ubuntu), or point HF_TDIAG_CHROMIUM at a" >&2
  echo "  Chromium/Chrome binary; HF_TDIAG_SKIP_BROWSER=1 skips this step." >&2
fi
# MathJax 2 renders the docs site's formulas offline: scripts/mkdocs_mathjax.py copies it into the built site
# (HF_TDIAG_MATHJAX overrides the folder).
MATHJAX=${HF_TDIAG_MATHJAX:-/usr/share/javascript/mathjax}
if [ -f "$MATHJAX/MathJax.js" ]; then
  say "      MathJax found at $MATHJAX"
elif can_apt; then
  say "      installing Debian's libjs-mathjax (apt) for the docs site's formulas"
  apt_install libjs-mathjax
else
  echo "setup.sh: MathJax is missing at $MATHJAX; 'mkdocs build --strict' (tests/test_docs_build.py) needs it." >&2
  echo "  Install it with 'sudo apt-get install -y libjs-mathjax' (Debian/Ubuntu), or point HF_TDIAG_MATHJAX at a" >&2
  echo "  MathJax 2 folder; HF_TDIAG_SKIP_BROWSER=1 skips this step." >&2
fi
say "done. Use .venv/bin/python (or 'source .venv/bin/activate')."
