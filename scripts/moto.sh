#!/usr/bin/env bash
# Makes the virtualenv that moto's S3-compatible server runs from for the `objstore` test tier (moto's
# pins conflict with .venv's, so it gets its own) and prints the path of its `moto_server`. Idempotent.
set -euo pipefail
VERSION=5.2.5
DIR=${TRACETAP_MOTO_VENV:-$HOME/.cache/tracetap/moto-venv}
PY=${PYTHON:-python3.11}
stamp="$DIR/.moto-$VERSION"
if [ ! -f "$stamp" ]; then
    [ -x "$DIR/bin/python" ] || "$PY" -m venv "$DIR"
    "$DIR/bin/python" -m pip install --disable-pip-version-check -q "moto[server]==$VERSION" >&2
    touch "$stamp"
fi
echo "$DIR/bin/moto_server"
