#!/usr/bin/env bash
# Creates .venv with everything tracetap and its tests need. Idempotent; re-runs when the
# dependency files change.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TRACETAP_VENV:-.venv}
PY=${PYTHON:-python3.11}
stamp="$VENV/.tracetap-installed"
want=$(cat pyproject.toml requirements-sdk.txt | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
# Step 1: the core stack with its pins (mitmproxy==11.0.2 and huggingface-hub<2 keep the resolver sane).
"${pip[@]}" -e '.[engine,dev,ray,containers,objstore]'
# Step 2: the official SDKs; they upgrade h11 past mitmproxy's declared bound on purpose.
"${pip[@]}" -r requirements-sdk.txt

# The one known, deliberate conflict: mitmproxy declares h11<=0.14. Anything else fails setup.
unexpected=$("$VENV/bin/python" -m pip check 2>&1 | grep -v -E "^mitmproxy 11\.0\.2 has requirement h11<=0\.14\.0" || true)
if [ -n "$unexpected" ] && [ "$unexpected" != "No broken requirements found." ]; then
    echo "setup: unexpected dependency conflicts:" >&2; echo "$unexpected" >&2; exit 1
fi
echo "$want" > "$stamp"
