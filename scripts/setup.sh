#!/usr/bin/env bash
# Everything the README's two commands need on a fresh machine (idempotent):
#   .venv with CPU PyTorch first (so no dependency pulls a multi-GB CUDA build), then hf-tdiag with its test extras,
#   and Chromium for the browser tests (Debian's package when run as root; otherwise says what to install).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[dev]"

# Chromium drives the Space and report end-to-end tests (Playwright with executable_path; HF_TDIAG_CHROMIUM overrides).
CHROMIUM=${HF_TDIAG_CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup.sh: installing Debian's chromium for the browser tests"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium >/dev/null
  else
    echo "setup.sh: Chromium is missing at $CHROMIUM; the browser tests (tests/test_space_app.py) need it." >&2
    echo "  Install it with 'sudo apt-get install -y chromium' (Debian/Ubuntu), or point HF_TDIAG_CHROMIUM at a" >&2
    echo "  Chromium/Chrome binary." >&2
  fi
fi
echo "setup.sh: done. Use .venv/bin/python (or 'source .venv/bin/activate')."
