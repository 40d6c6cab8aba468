#!/usr/bin/env bash
# Runs the default test tier, then the marked tiers that issues require (harness CLIs from npm).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TRACETAP_VENV:-.venv}
export TIKTOKEN_CACHE_DIR=${TIKTOKEN_CACHE_DIR:-$(mktemp -d)}
"$VENV/bin/ruff" check .
"$VENV/bin/python" -m pytest -q "$@"
"$VENV/bin/python" -m pytest -q -m harness tests/harness
