#!/usr/bin/env bash
# Mutation testing (mutmut), niced, module by module; not part of CI. See scripts/mutation.py for the options.
#   scripts/mutation.sh [measures|probes|study|training|hf_tdiag/path/module.py ...] [--summary] [--jobs N]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python)"
"$PY" -c "import mutmut" 2>/dev/null || { echo "mutation: mutmut is not installed: pip install -e '.[mutation]'" >&2; exit 2; }
exec nice -n "${MUTATION_NICE:-15}" "$PY" scripts/mutation.py "$@"
